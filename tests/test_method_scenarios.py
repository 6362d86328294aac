"""A file method in the short NAME/DEFAULTS form declares SCENARIOS (harness/api/registry.py): a protocol of
another scenario naming it is refused at load in one line, and a value outside the vocabulary is refused."""
import textwrap

import pytest

from harness.api.registry import get_registry
from harness.config.errors import ProtocolError, RegistryError
from harness.config.protocol import parse_protocol

METHOD = '''\
"""A class-IL-only method."""
NAME = "only-class-il"
DEFAULTS = {}
SCENARIOS = %s


def build(ctx):
    from avalanche.training.supervised import Naive
    return Naive(**ctx.strategy_kwargs())
'''


def _method(tmp_path, scenarios: str):
    path = tmp_path / "only_class_il.py"
    path.write_text(METHOD % scenarios)
    return path


def _protocol(scenario):
    return {"name": "p", "version": "1", "scenario": scenario,
            "datasets": [{"name": "digits", "n_tasks": 2, "classes_per_task": 2, "model": "mlp"}],
            "regimes": ["head"], "methods": ["naive", "only-class-il"]}


def test_a_file_method_declares_its_scenarios_and_a_task_il_protocol_is_refused_at_load(tmp_path, monkeypatch):
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "none"))
    registry = get_registry([_method(tmp_path, '("class-il",)')])
    assert registry["only-class-il"].scenarios == ("class-il",)
    assert registry["naive"].scenarios == ("task-il", "class-il")
    assert parse_protocol(_protocol("class-il"), "p.yaml", registry).methods[1].name == "only-class-il"
    with pytest.raises(ProtocolError) as err:
        parse_protocol(_protocol("task-il"), "p.yaml", registry)
    message = str(err.value)
    assert message.startswith("p.yaml: methods[1].name: only-class-il is defined in class-il only") and "\n" not in message


def test_a_list_is_the_tuple_it_stands_for(tmp_path, monkeypatch):
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "none"))
    assert get_registry([_method(tmp_path, '["class-il"]')])["only-class-il"].scenarios == ("class-il",)


@pytest.mark.parametrize("value", ['("domain-il",)', "()", '"class-il"', "None"])
def test_a_bad_value_is_refused_in_one_line_naming_the_file(tmp_path, monkeypatch, value):
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "none"))
    path = _method(tmp_path, value)
    with pytest.raises(RegistryError) as err:
        get_registry([path])
    message = str(err.value)
    assert str(path) in message and "SCENARIOS" in message and "task-il, class-il" in message
    assert "\n" not in message


def test_the_cli_refuses_the_protocol_in_one_line(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("CL_BENCH_SUBMISSIONS", str(tmp_path / "none"))
    path = _method(tmp_path, '("class-il",)')
    protocol = tmp_path / "p.yaml"
    protocol.write_text(textwrap.dedent("""\
        name: p
        version: "1"
        scenario: task-il
        datasets: [{name: digits, n_tasks: 2, classes_per_task: 2, model: mlp}]
        regimes: [head]
        methods: [only-class-il]
        """))
    code, _, err = cli("run", "--protocol", protocol, "--method", path, "--results", tmp_path / "r", "--no-mlflow",
                       "--no-progress", "--no-leaderboard", "--jobs", "1")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "only-class-il is defined in class-il only" in lines[0], err
