"""The method contract (harness/api/contract.py): hook look-up rules, adapter declarations."""
from __future__ import annotations

import types

import pytest
import torch

from harness.api import contract
from harness.api.registry import RegistryError, adapters_from_module
from harness.run.prefix_cache import cache_allowed


class Strategy:
    def __init__(self, *plugins, model="own model"):
        self.plugins, self.model = list(plugins), model


class EvalHook:
    def __init__(self, model):
        self.model = model

    def harness_eval_model(self):
        return self.model


class Diag:
    def __init__(self, **values):
        self.values = values

    def harness_diagnostics(self):
        return dict(self.values)


class Declares:
    def __init__(self, value):
        self.harness_prefix_cache = value


def test_evaluated_model_is_the_first_providers_else_the_strategys():
    assert contract.evaluated_model(Strategy()) == "own model"
    assert contract.evaluated_model(Strategy(EvalHook("merged"), EvalHook("other"))) == "merged"
    # the first provider decides; returning None means "evaluate the strategy's own model"
    assert contract.evaluated_model(Strategy(EvalHook(None), EvalHook("other"))) == "own model"


def test_diagnostics_of_strategy_and_plugins_merge_in_order():
    strategy = Strategy(Diag(a=1, b=2), object(), Diag(b=3))
    strategy.harness_diagnostics = lambda: {"s": 0}
    assert contract.collect_diagnostics(strategy) == {"s": 0, "a": 1, "b": 3}


def test_prefix_cache_declaration_wins_over_the_adapter_field():
    safe = contract.MethodAdapter("m", {}, lambda ctx: None, prefix_cache=True)
    unsafe = contract.MethodAdapter("m", {}, lambda ctx: None)
    assert cache_allowed(Strategy(), safe) and not cache_allowed(Strategy(), unsafe)
    assert not cache_allowed(Strategy(Declares(None), Declares(False)), safe)
    assert cache_allowed(Strategy(Declares(True)), unsafe)


def test_stored_tensors_are_collected_from_every_provider():
    p = types.SimpleNamespace(stored_tensors=lambda: [1, 2])
    q = types.SimpleNamespace(stored_tensors=lambda: [3])
    assert contract.stored_tensors(Strategy(p, object(), q)) == [1, 2, 3]


def _module(**attributes):
    base = dict(NAME="x", DEFAULTS={}, build=lambda ctx: None)
    return types.SimpleNamespace(**{**base, **attributes})


def test_a_submission_module_declares_cache_safety_and_captions():
    (adapter,) = adapters_from_module(_module(PREFIX_CACHE=True, CAPTIONS={"k": "a caption"}), "x.py")
    assert adapter.prefix_cache is True and adapter.captions == {"k": "a caption"}
    (default,) = adapters_from_module(_module(), "x.py")
    assert default.prefix_cache is False and default.captions == {}


@pytest.mark.parametrize("attributes,message", [
    ({"PREFIX_CACHE": "yes"}, "PREFIX_CACHE of 'x' must be True or False"),
    ({"CAPTIONS": {"k": 1}}, "CAPTIONS of 'x' must map diagnostic keys to strings"),
    ({"CAPTIONS": ["k"]}, "CAPTIONS of 'x' must map diagnostic keys to strings"),
])
def test_ill_typed_declarations_fail_discovery(attributes, message):
    with pytest.raises(RegistryError, match=message):
        adapters_from_module(_module(**attributes), "x.py")


def test_built_in_captions_reach_the_method_index():
    from harness.api.index import method_infos

    infos = {m["name"]: m for m in method_infos()}
    assert "BECAME merge coefficient" in infos["became"]["captions"]["alpha"]
    assert infos["magmax"]["prefix_cache"] and not infos["lwf"]["prefix_cache"]


def test_a_method_files_identity_is_its_content_plus_a_declared_version(tmp_path):
    from harness.api.registry import discover

    path = tmp_path / "m.py"
    body = "NAME = 'm'\nDEFAULTS = {}\n\ndef build(ctx):\n    pass\n"
    path.write_text(body)
    first = discover((str(path),), include_submissions=False)["m"].implementation
    path.write_text(body + "VERSION = '2'\n")
    second = discover((str(path),), include_submissions=False)["m"].implementation
    path.write_text(body + "# a comment\n")
    third = discover((str(path),), include_submissions=False)["m"].implementation
    assert first.startswith("sha256:") and second.endswith("+v2") and len({first, second, third}) == 3
    assert discover(include_submissions=False)["naive"].implementation == "v1"


@pytest.mark.parametrize("types", ["{'x': int}", "{'nope': (int,)}", "{'x': (set,)}", "{'x': ()}"])
def test_ill_formed_hparam_types_fail_discovery(tmp_path, types):
    from harness.api.registry import discover

    path = tmp_path / "m.py"
    path.write_text(f"NAME = 'm'\nDEFAULTS = {{'x': 1}}\nHPARAM_TYPES = {types}\n\ndef build(ctx, x):\n    pass\n")
    with pytest.raises(RegistryError, match="HPARAM_TYPES of 'm' must map DEFAULTS keys"):
        discover((str(path),), include_submissions=False)


def test_the_readme_hook_table_lists_every_hook_of_the_contract():
    """`StrategyHooks` is the documented set of optional hooks: each member's name has its row."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "submissions" / "README.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)(?:\(\))?`", readme, flags=re.M))
    members = {name for hook in contract.StrategyHooks for name in vars(hook).get("__annotations__", {})}
    members |= {name for hook in contract.StrategyHooks for name, v in vars(hook).items()
                if callable(v) and not name.startswith("_")}
    assert members == {"harness_eval_model", "harness_eval_model_now", "harness_diagnostics", "harness_prefix_cache",
                       "stored_tensors", "harness_memory", "harness_state"}
    assert members <= rows, members - rows


def test_memory_use_sums_every_provider_and_counts_bytes():
    a = torch.zeros(3, 4)  # 48 bytes of float32
    b = torch.zeros(5, dtype=torch.long)  # 40 bytes
    p = types.SimpleNamespace(harness_memory=lambda: contract.MemoryUse(samples=3, tensors=(a, b)))
    q = types.SimpleNamespace(harness_memory=lambda: contract.MemoryUse(samples=2))
    use = contract.memory_use(Strategy(p, object(), q))
    assert (use.samples, use.bytes) == (5, 88)
    assert contract.memory_use(Strategy(object())) is None
