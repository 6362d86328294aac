"""Continual evaluation during training (issue 29): the curve changes nothing the run trains, its points are
the harness's accuracies of the model at that step, the store verifies it, and the sweep redoes a record that
lacks the curve its protocol asks for (the setting is not part of the run id)."""
from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch
from avalanche.core import SupervisedPlugin

from harness.config.errors import ProtocolError
from harness.config.specs import ContinualSpec, DatasetSpec, TrainingSpec
from harness.execution.store import parse_record
from harness.run.engine import run_one
from harness.run.evaluation import subsample_indices

DIGITS_BN = DatasetSpec("digits", 5, 2, "mlp-bn")


def _spec(spec_factory, scenario="task-il", regime="full", continual=None, **kw):
    return spec_factory(scenario=scenario, dataset=DIGITS_BN, regime=regime, continual=continual, **kw)


def _final_state(spec):
    """(record, the trained model's parameters and buffers after the last task, the torch RNG state then)."""
    seen = {}

    def observer(event, t, strategy):
        if event == "after_task" and t == spec.dataset.n_tasks - 1:
            seen["state"] = {k: v.detach().clone() for k, v in strategy.model.state_dict().items()}
            seen["rng"] = torch.get_rng_state()
    record = run_one(spec, device="cpu", observer=observer)
    assert record.ok, record.error
    return record, seen["state"], seen["rng"]


@pytest.mark.parametrize("scenario, regime, method", [("task-il", "last-1", "naive"), ("class-il", "full", "naive"),
                                                      ("class-il", "last-1", "replay")])
def test_training_is_bitwise_unchanged(spec_factory, scenario, regime, method):
    """Same accuracy matrices, norms, budget, final weights and BatchNorm statistics, same RNG state."""
    off, on = (_spec(spec_factory, scenario, regime, c, method=method) for c in (None, ContinualSpec(3, 40)))
    assert off.run_id == on.run_id  # not part of the run id: it changes nothing the run trains
    r_off, w_off, rng_off = _final_state(off)
    r_on, w_on, rng_on = _final_state(on)
    assert r_on.curve and r_off.curve is None and len(r_on.curve["steps"]) > 10
    assert r_on.acc_matrix == r_off.acc_matrix and r_on.init_acc == r_off.init_acc
    assert r_on.acc_matrix_task_aware == r_off.acc_matrix_task_aware
    assert r_on.update_norms == r_off.update_norms and r_on.budget == r_off.budget
    assert w_on.keys() == w_off.keys() and all(torch.equal(w_on[k], w_off[k]) for k in w_on)
    assert any("running_mean" in k for k in w_on)  # BatchNorm statistics are among what is compared
    assert torch.equal(rng_on, rng_off)


def test_subsample_is_fixed_seeded_and_in_range():
    a, b = subsample_indices(70, 30, seed=3, task=1), subsample_indices(70, 30, seed=3, task=1)
    assert torch.equal(a, b) and len(a) == 30 and len(set(a.tolist())) == 30
    assert a.tolist() == sorted(a.tolist()) and 0 <= int(a.min()) and int(a.max()) < 70
    assert not torch.equal(a, subsample_indices(70, 30, seed=4, task=1))
    assert not torch.equal(a, subsample_indices(70, 30, seed=3, task=2))
    assert subsample_indices(20, 30, seed=3, task=1).tolist() == list(range(20))  # fewer rows: all of them


class _Snapshot(SupervisedPlugin):
    """Keeps a copy of the model after the `at`-th optimizer step of the task it is added for."""

    def __init__(self, at: int):
        super().__init__()
        self.at, self.steps, self.model = at, 0, None

    def after_update(self, strategy, **kwargs):
        self.steps += 1
        if self.steps == self.at:
            self.model = copy.deepcopy(strategy.model)


@torch.no_grad()
def _hand_accuracies(model, task, rows, seen, cpt):
    """(accuracy, task-aware accuracy) of a copy of the model on the task's rows, argmax by hand."""
    model.eval()
    x, y = task.x_test[rows], task.y_test[rows]
    logits = model(x, task.index)
    if seen is None:  # task-IL: the task's own head
        return int((logits.argmax(1) == y).sum()) / len(y), None
    lo = task.index * cpt
    plain = int((logits[:, :seen].argmax(1) == y).sum()) / len(y)
    aware = int((logits[:, lo:lo + cpt].argmax(1) + lo == y).sum()) / len(y)
    return plain, aware


@pytest.mark.parametrize("scenario", ["task-il", "class-il"])
def test_curve_point_is_the_hand_evaluation_at_its_step(spec_factory, scenario):
    """Task 3 (index 2), its 10th step: the curve's point is a hand evaluation of the model copied then."""
    from harness.run.datasets import load_dataset
    from harness.run.streams import split_tasks

    every, n = 5, 25
    spec = _spec(spec_factory, scenario, "full", ContinualSpec(every, n))
    snap = _Snapshot(at=10)

    def observer(event, t, strategy):
        if event == "before_task" and t == 2:
            strategy.plugins.append(snap)  # after the harness plugin: its point of that step is taken
    record = run_one(spec, device="cpu", observer=observer)
    assert record.ok, record.error
    curve, T, cpt = record.curve, 5, 2
    steps_before = sum(record.budget["steps_per_task"][:2])
    i = curve["steps"].index(steps_before + 10)
    assert (curve["task"][i], curve["end"][i]) == (2, False)
    tasks = split_tasks(load_dataset("digits"), spec.class_order, T, cpt, spec.scenario)
    seen = 3 * cpt if scenario == "class-il" else None
    for j in range(T):
        if j > 2:
            assert curve["acc"][i][j] is None
            continue
        rows = subsample_indices(len(tasks[j].y_test), n, spec.seed, j)
        plain, aware = _hand_accuracies(snap.model, tasks[j], rows, seen, cpt)
        assert curve["acc"][i][j] == pytest.approx(plain, abs=1e-12)
        if scenario == "class-il":
            assert curve["acc_task_aware"][i][j] == pytest.approx(aware, abs=1e-12)
    assert "acc_task_aware" in curve if scenario == "class-il" else "acc_task_aware" not in curve


def test_end_points_are_the_matrix_rows_on_the_whole_test_set(spec_factory):
    """With a subsample larger than every test set, the initial and end points are init_acc and the rows
    (on the tasks seen by then); mid-task points sit every `every` steps of their task."""
    spec = _spec(spec_factory, "class-il", "last-1", ContinualSpec(4, 10_000))
    record = run_one(spec, device="cpu")
    curve = record.curve
    assert curve["n_rows"] == record.checks["n_test"]
    ends = [i for i, e in enumerate(curve["end"]) if e]
    for t, i in enumerate(ends):
        assert curve["acc"][i] == [*record.acc_matrix[t][:t + 1], *[None] * (4 - t)]
        assert curve["acc_task_aware"][i] == [*record.acc_matrix_task_aware[t][:t + 1], *[None] * (4 - t)]
    assert curve["acc"][0][0] == record.init_acc[0] and curve["acc"][0][1:] == [None] * 4
    assert [curve["steps"][i] for i in ends] == [sum(record.budget["steps_per_task"][:t + 1]) for t in range(5)]
    starts = [0, *(curve["steps"][i] for i in ends[:-1])]
    mids = [(s, t) for s, t, e in zip(curve["steps"][1:], curve["task"][1:], curve["end"][1:]) if not e]
    assert mids and all((s - starts[t]) % 4 == 0 and s > starts[t] for s, t in mids)
    assert record.timings["curve_s"] > 0


@pytest.fixture(scope="module")
def curve_record():
    """A valid class-IL record with a curve (JSON form)."""
    from conftest import make_spec

    spec = make_spec(scenario="class-il", dataset=DatasetSpec("digits", 3, 2, "mlp"), regime="full",
                     training=TrainingSpec(epochs=1, batch_size=64),
                     continual=ContinualSpec(2, 20))
    record = run_one(spec, device="cpu")
    assert record.ok
    return json.loads(json.dumps(record.to_dict()))


def _corrupt(data, edit):
    data = copy.deepcopy(data)
    edit(data)
    return data


def _set_acc(i, j, value):
    return lambda d: d["curve"]["acc"][i].__setitem__(j, value)


MALFORMED = {
    "out of range": _set_acc(1, 0, 1.5),
    "not k of n rows": _set_acc(1, 0, 0.123456),
    "value for an unseen task": _set_acc(1, 2, 0.5),
    "short row": lambda d: d["curve"]["acc"][1].pop(),
    "missing point entry": lambda d: d["curve"]["steps"].pop(),
    "decreasing steps": lambda d: d["curve"]["steps"].__setitem__(1, 10_000),
    "not every k steps": lambda d: d["curve"]["steps"].__setitem__(1, d["curve"]["steps"][1] + 1),
    "another every": lambda d: d["curve"].__setitem__("every", 3),
    "n_rows not the subsample": lambda d: d["curve"]["n_rows"].__setitem__(0, 5),
    "no end flag": lambda d: d["curve"]["end"].__setitem__(d["curve"]["end"].index(True), False),
    "no initial point": lambda d: [d["curve"][k].pop(0) for k in ("steps", "task", "end", "acc", "acc_task_aware")],
    "task-aware missing": lambda d: d["curve"].pop("acc_task_aware"),
    "task-aware below": lambda d: d["curve"]["acc_task_aware"][-1].__setitem__(
        *next((j, 0.0) for j, a in enumerate(d["curve"]["acc"][-1]) if a)),
    "null curve": lambda d: d.__setitem__("curve", None),
    "missing curve": lambda d: d.pop("curve"),
    "curve without the setting": lambda d: (d["spec"].pop("continual")),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_store_rejects_malformed_curves(curve_record, name):
    assert parse_record(curve_record)[1] is None
    record, problem = parse_record(_corrupt(curve_record, MALFORMED[name]))
    assert record is None and problem.kind == "corrupt", name
    assert "\n" not in problem.reason


def test_record_without_the_setting_has_no_curve_key(spec_factory):
    spec = spec_factory(regime="head")
    data = run_one(spec, device="cpu").to_dict()
    assert "curve" not in data and "continual" not in data["spec"] and "curve_s" not in data["timings"]
    assert parse_record(json.loads(json.dumps(data)))[1] is None


def _protocol(tmp_path, evaluation: str, name="ce"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        version: "1"
        datasets: [{{name: digits, n_tasks: 3, classes_per_task: 2, model: mlp}}]
        regimes: [head]
        methods: [naive]
        training: {{optimizer: sgd, lr: 0.05, epochs: 1, batch_size: 64}}
        evaluation: {evaluation}
        """))
    return path


@pytest.mark.parametrize("evaluation, message", [
    ("{every: 0}", "evaluation.every: 0 is too small"),
    ("{every: 2.5}", "evaluation.every: expected an integer"),
    ("{every: 5, subsample: 0}", "evaluation.subsample: 0 is too small"),
    ("{subsample: 50}", "evaluation.subsample: is a setting of continual evaluation, which is off"),
    ("{evry: 5}", "evaluation.evry: unknown key; allowed: batch_size, every, subsample"),
])
def test_protocol_setting_errors_are_one_line(tmp_path, evaluation, message):
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol

    with pytest.raises(ProtocolError) as exc:
        load_protocol(str(_protocol(tmp_path, evaluation)), get_registry())
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_sweep_redoes_a_record_without_the_asked_curve(tmp_path):
    """Same run id with and without the setting; a record counts as done only if it has the asked curve."""
    from harness.api.registry import get_registry
    from harness.config.protocol import load_protocol
    from harness.execution.plan import make_plan
    from harness.execution.store import runs_dir, write_record

    registry = get_registry()
    off = load_protocol(str(_protocol(tmp_path, "{batch_size: 256}")), registry)
    on = load_protocol(str(_protocol(tmp_path, "{batch_size: 256, every: 4}")), registry)
    assert on.continual == ContinualSpec(4, 100) and off.continual is None
    results = tmp_path / "results"
    plan_off, plan_on = make_plan(off, results), make_plan(on, results)
    (spec_off,), (spec_on,) = plan_off.todo, plan_on.todo
    assert spec_off.run_id == spec_on.run_id
    write_record(runs_dir(results, "ce"), run_one(spec_off, device="cpu"))
    assert len(make_plan(off, results).done) == 1
    assert [s.run_id for s in make_plan(on, results).todo] == [spec_on.run_id]  # no curve: redone
    write_record(runs_dir(results, "ce"), run_one(spec_on, device="cpu"))  # replaces the file
    assert len(make_plan(on, results).done) == 1 and len(make_plan(off, results).done) == 1
