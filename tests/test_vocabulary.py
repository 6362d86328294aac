"""One vocabulary: every name is defined in harness/config/vocabulary.py (or paths.py) and used
from there; the backbones and loaders agree with it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.config import vocabulary as v

HARNESS = Path(__file__).resolve().parent.parent / "harness"
HOMES = {HARNESS / "config" / "vocabulary.py", HARNESS / "config" / "paths.py", HARNESS / "config" / "metrics.py",
         HARNESS / "config" / "pretrain.py"}
# Source patterns that would mean a definition restated outside its home.
RESTATED = {
    "the metric names": r"""["']acc["'],\s*["']la["'],\s*["']bwt["']|Metric\(["']la["']""",
    "the metric labels": r"""["']acc["']\s*:\s*["']ACC["']|Metric\(["']acc["'],\s*["']ACC["']""",
    "the optimizers": r"""["']sgd["'],\s*["']adam["']""",
    "the statuses": r"""["']ok["'],\s*["']failed["'],\s*["']diverged["']|FAILED = ["']failed["']""",
    "the scenarios": r"""["']task-il["'],\s*["']class-il["']|TASK_IL = ["']task-il["']""",
    "the regime families": r"""["']depth["'],\s*["']bitfit["']|BITFIT = ["']bitfit["']""",
    "the pre-training modes": r"""["']first-task["'],\s*["']none["']|FIRST_TASK = ["']first-task["']""",
    "the regime grammar": r"last-\(|last-\[|\^last|\{LAST\}-\(",
    "the grammar's reserved words": r"""["']head["'],\s*["']full["']""",
    "the name pattern": r"A-Za-z0-9\]\[A-Za-z0-9_\.-\]",
    "the entry-point group": r"""["']cl_bench\.methods["']""",
    "the environment variables": r"CL_BENCH_(SUBMISSIONS|CACHE|DATA)",
    "the block names": r"""["']conv1["']|["']fc1["']|["']layer1["']""",
    "the dataset facts": r"""["']cifar100["']\s*:\s*(DatasetFacts)?\(\s*100""",
}


@pytest.mark.parametrize("what", sorted(RESTATED))
def test_each_name_is_defined_in_one_place(what):
    pattern = re.compile(RESTATED[what])
    found = [f"{p.relative_to(HARNESS)}:{i}" for p in sorted(HARNESS.rglob("*.py")) if p not in HOMES
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"{what} restated outside config/: {found}"


def test_the_restatement_patterns_match_their_definitions():
    home = "\n".join(p.read_text() for p in HOMES)
    missing = [what for what, pattern in RESTATED.items() if not re.search(pattern, home)]
    assert not missing, f"patterns that no longer find their own definition: {missing}"


# A status, scenario or family written as a bare string where code decides by it.
LITERAL = re.compile(r"""(==|!=|\bin \(|status=|scenario=|families=\()\s*["'](ok|failed|diverged|timeout|task-il|class-il|"""
                     r"""depth|bitfit|norm|lora)["']""")


def test_statuses_scenarios_and_families_are_enums_outside_the_vocabulary():
    found = [f"{p.relative_to(HARNESS)}:{i}" for p in sorted(HARNESS.rglob("*.py")) if p not in HOMES
             for i, line in enumerate(p.read_text().splitlines(), 1) if LITERAL.search(line.split("#")[0])]
    assert not found, f"use vocabulary.Status / Scenario / Family: {found}"


# The same in the site's templates: a comparison with a bare status, scenario or family string,
# either side of ==, != or `in` (templates get Status, Scenario and the status_class filter).
VOCABULARY_WORDS = r"(ok|failed|diverged|timeout|task-il|class-il|depth|bitfit|norm|lora)"
TEMPLATE_LITERAL = re.compile(rf"""(==|!=|\bin)\s*["']{VOCABULARY_WORDS}["']|["']{VOCABULARY_WORDS}["']\s*(==|!=|(not\s+)?in\b)""")
TEMPLATES = HARNESS.parent / "leaderboard" / "templates"


def test_templates_decide_by_the_vocabulary_not_by_strings():
    pages = sorted(TEMPLATES.glob("*.html"))
    found = [f"{p.name}:{i}" for p in pages for i, line in enumerate(p.read_text().splitlines(), 1)
             if TEMPLATE_LITERAL.search(line)]
    assert pages and not found, f"use Status / Scenario / |status_class in templates: {found}"


@pytest.mark.parametrize("line", ["{{ 'x' if s == 'ok' }}", "{% if \"class-il\" in scenarios %}",
                                  "{{ r.status != \"failed\" }}", "{% if 'lora' not in fams %}"])
def test_the_template_pattern_finds_string_comparisons(line):
    assert TEMPLATE_LITERAL.search(line)


def test_the_template_pattern_leaves_css_classes_alone():
    assert not TEMPLATE_LITERAL.search("<b class=\"{{ s|status_class }}\">") and not TEMPLATE_LITERAL.search(
        "{{ 'failed' if r.n_failed else ('flagged' if r.n_flagged) }}")


def test_enums_serialise_as_their_strings():
    import json

    assert json.dumps([v.Status.OK, v.Scenario.CLASS_IL, v.Family.LORA]) == '["ok", "class-il", "lora"]'
    assert f"{v.Status.TIMEOUT}" == "timeout" and v.Status.OK == "ok" and {"ok": 1}[v.Status.OK] == 1
    assert tuple(v.Family) == ("depth", "bitfit", "norm", "lora")
    assert v.parse_regime("last-2:lora-r4").family is v.Family.LORA


def test_backbones_name_their_blocks_as_the_vocabulary_does():
    from harness.run.models import PLUGINS, build_model, trainable_block_names

    shapes = {"mlp": (1, 8, 8), "mlp-bn": (1, 8, 8), "cnn1d": (40,), "small-cnn": (1, 28, 28), "resnet18-reduced": (3, 32, 32),
              "resnet18": (3, 32, 32), "vit-tiny": (1, 8, 8), "vit-b16": (3, 32, 32), "vit-b16-clip": (3, 32, 32)}
    assert {b.name for b in PLUGINS} == set(v.MODELS) == set(shapes)
    for name, facts in v.MODELS.items():
        assert trainable_block_names(build_model(name, shapes[name], 2, 2)) == list(facts.blocks)


def test_every_dataset_of_the_vocabulary_has_a_loader():
    from harness.run.datasets import PLUGINS

    assert {d.name for d in PLUGINS} == set(v.DATASETS)
    assert all(f.default_model in v.MODELS for f in v.DATASETS.values())


@pytest.mark.parametrize("name,blocks,depth", [("head", 4, 0), ("last-1", 4, 1), ("last-4", 4, 4),
                                               ("full", 5, 5), ("last-12", 20, 12)])
def test_regime_depth(name, blocks, depth):
    assert v.is_regime_name(name) and v.regime_depth(name, blocks) == depth


@pytest.mark.parametrize("name", ["last-0", "last-01", "middle", "Last-1", "last-", "full-1", ""])
def test_not_regime_names(name):
    assert not v.is_regime_name(name)
    with pytest.raises(ValueError, match="allowed: head, full, last-k"):
        v.regime_depth(name, 4)


def test_regime_sort_key_orders_by_depth_then_unknown():
    names = ["full", "zeta", "last-10", "head", "last-2"]
    assert sorted(names, key=v.regime_sort_key) == ["head", "last-2", "last-10", "full", "zeta"]
