"""Compute accounting (harness/run/compute.py): counts at the model, FLOPs by hand, no state change, the store,
the analysis and the budget line."""
from __future__ import annotations

import math
import sys
from collections import OrderedDict

import pytest
import torch
from conftest import make_spec, record_from

from harness.analysis.tables import analyse
from harness.config.specs import SCHEMA_VERSION, TrainingSpec
from harness.execution.store import validate_record
from harness.outputs.formatting import flops_text, times_text
from harness.run import compute
from harness.run.compute import ComputeMeter, flops_per_sample, meta_copy
from harness.run.engine import run_one
from harness.run.models import CLNet
from harness.run.regimes import apply_regime

# ------------------------------------------------------------------ FLOPs by hand


def _linear_net(n_heads=2):
    """8 -> 16 -> ReLU -> 4 features, heads 4 -> 3: Linear layers only (FLOPs by the 2·in·out rule)."""
    blocks = OrderedDict(b1=torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()), b2=torch.nn.Linear(16, 4))
    return CLNet(blocks, feature_dim=4, n_heads=n_heads, head_classes=3)


def test_linear_flops_are_two_in_out_per_sample():
    flops = flops_per_sample(_linear_net(), (8,))
    assert flops["blocks"] == [2 * 8 * 16, 2 * 16 * 4] and flops["head"] == 2 * 4 * 3
    # backward, everything trains: every layer's weight gradient (2·in·out), every input gradient but the first's
    assert flops["backward"] == 2 * (8 * 16 + 16 * 4 + 4 * 3) + 2 * (16 * 4 + 4 * 3)


def test_frozen_parameters_need_no_weight_gradients():
    net = _linear_net()
    for p in net.blocks.parameters():
        p.requires_grad_(False)
    assert flops_per_sample(net, (8,))["backward"] == 2 * 4 * 3  # the head's weight gradient only
    net.blocks["b2"].weight.requires_grad_(True)
    assert flops_per_sample(net, (8,))["backward"] == 2 * (4 * 3) * 2 + 2 * 16 * 4  # head w + head input, b2 w


def test_conv_flops_follow_the_conv_formula():
    blocks = OrderedDict(c=torch.nn.Sequential(torch.nn.Conv1d(2, 5, kernel_size=3), torch.nn.Flatten()))
    net = CLNet(blocks, feature_dim=5 * 38, n_heads=1, head_classes=2)
    flops = flops_per_sample(net, (2, 40))
    assert flops["blocks"] == [2 * 2 * 5 * 3 * 38] and flops["head"] == 2 * 5 * 38 * 2


def test_flops_follow_a_modules_settings_not_only_its_parameters():
    """Stride changes the FLOPs but no parameter shape: a cached measurement of one must not answer the other."""
    def net(stride):
        out = (40 - 3) // stride + 1
        blocks = OrderedDict(c=torch.nn.Sequential(torch.nn.Conv1d(2, 5, kernel_size=3, stride=stride),
                                                   torch.nn.Flatten()))
        return CLNet(blocks, feature_dim=5 * out, n_heads=1, head_classes=2), out

    (one, out1), (two, out2) = net(1), net(2)
    assert flops_per_sample(one, (2, 40))["blocks"] == [2 * 2 * 5 * 3 * out1]
    assert flops_per_sample(two, (2, 40))["blocks"] == [2 * 2 * 5 * 3 * out2]  # 19 positions, not 38


class _Uncopyable:
    def __deepcopy__(self, memo):
        raise AssertionError("a hook's owner was copied")

    def hook(self, *args):
        return None


def test_the_copy_never_copies_a_hooks_owner_and_a_failed_measurement_is_not_measured():
    net = _linear_net()
    owner = _Uncopyable()
    net.register_forward_hook(owner.hook)
    assert flops_per_sample(net, (8,))["head"] == 2 * 4 * 3
    broken = _linear_net()
    broken.blocks["b1"][0].history = torch.ones(2, requires_grad=True) * 2  # not a leaf: deepcopy refuses it
    compute._FLOPS_CACHE.clear()  # the same structure measured above would be answered from the cache
    meter = ComputeMeter(broken, (8,), torch.device("cpu"))
    meter.start_task(broken)
    assert meter.unmeasured and "deepcopy" in meter.unmeasured and meter.as_json() is None
    meter.close()


def test_measurement_never_touches_the_model():
    net = _linear_net()
    net.blocks["b1"].append(torch.nn.BatchNorm1d(16))
    calls = []
    net.register_forward_hook(lambda *a: calls.append(1))
    net.blocks["b2"].register_forward_pre_hook(lambda *a: calls.append(2))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    copy = meta_copy(net.train())
    assert all(t.is_meta for t in [*copy.parameters(), *copy.buffers()])
    compute._FLOPS_CACHE.clear()
    flops_per_sample(net, (8,))
    assert calls == [] and all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_flop_counting_imports_nothing_into_a_harness_process():
    """The meta backend's decompositions need torch._dynamo, which Avalanche (so every harness process) has
    imported already: measuring adds no module (the process state a run may not change)."""
    from harness.run.models import build_model

    assert "torch._dynamo" in sys.modules  # imported with the engine, before any measurement
    compute._FLOPS_CACHE.clear()
    before = set(sys.modules)
    flops = flops_per_sample(build_model("cnn1d", (1, 40), n_heads=2, head_classes=2), (1, 40))
    assert flops["head"] > 0 and set(sys.modules) == before


# ------------------------------------------------------------------ counts at the model


def test_meter_counts_rows_of_forward_and_backward_and_pauses():
    net = _linear_net()
    meter = ComputeMeter(net, (8,), "cpu")
    meter.start_task(net)
    with meter.stage_of(compute.TRAIN):
        net(torch.zeros(5, 8), 0).sum().backward()
        with torch.no_grad():
            net(torch.zeros(7, 8), 1)  # a teacher-style pass: forward only
        net.features(torch.zeros(3, 8))  # a backbone pass outside a model call
        with meter.stage_of(None):
            net(torch.zeros(100, 8), 0)  # the harness's own evaluation: not counted
    net(torch.zeros(50, 8), 0)  # outside any stage
    meter.close()
    out = meter.as_json()
    assert out["forward_samples"] == 5 + 7 + 3 and out["backward_samples"] == 5
    f = flops_per_sample(net, (8,))
    assert out["forward_flops"] == 12 * (sum(f["blocks"]) + f["head"]) + 3 * sum(f["blocks"])
    assert out["backward_flops"] == 5 * f["backward"] and out["flops"] == out["forward_flops"] + out["backward_flops"]
    assert not net._forward_hooks and not net._forward_pre_hooks  # close() removed them


METHOD_FILE = '''
from avalanche.core import SupervisedPlugin
from avalanche.training.supervised import Naive
NAME = "extra-pass"
DEFAULTS = {}


class ExtraPass(SupervisedPlugin):
    """One more forward/backward pass of the current minibatch per step, inside a plugin."""

    def before_backward(self, strategy, **kwargs):
        strategy.loss = strategy.loss + 0.0 * strategy.model(strategy.mb_x, strategy.mb_task_id).sum()


def build(ctx):
    kwargs = ctx.strategy_kwargs()
    kwargs["plugins"] = [*kwargs["plugins"], ExtraPass()]
    return Naive(**kwargs)
'''


def _run(spec, **kw):
    record = run_one(spec, device="cpu", **kw)
    assert record.status == "ok", record.error
    return record


@pytest.mark.parametrize("regime", ["head", "last-1", "full"])  # head/last-1: the prefix cache's own passes
def test_naive_passes_are_its_samples(regime):
    r = _run(make_spec(regime=regime, training=TrainingSpec(lr=0.05, momentum=0.9, epochs=1, batch_size=32)))
    c, b = r.budget["compute"], r.budget
    assert c["forward_samples"] == c["backward_samples"] == b["samples_seen"]
    assert c["forward_per_task"] == b["samples_per_task"]


@pytest.mark.parametrize("regime", ["head", "last-1"])
def test_a_methods_flops_do_not_depend_on_the_harnesss_prefix_cache(regime, monkeypatch):
    """The record's FLOPs are the method's: a pass the cache served counts whole, so a method the cache cannot
    serve is not shown as costlier for it; what ran with the cache is `executed_flops`, and less."""
    from harness.run import speedups

    spec = make_spec(regime=regime, training=TrainingSpec(lr=0.05, momentum=0.9, epochs=2, batch_size=32))
    cached = _run(spec).budget["compute"]
    monkeypatch.setattr(speedups, "PREFIX_CACHE", False)
    plain = _run(spec).budget["compute"]
    assert cached["flops"] == plain["flops"] and cached["forward_flops"] == plain["forward_flops"]
    assert "executed_flops" not in plain and cached["executed_flops"] < cached["flops"]
    per_sample = cached["forward_flops_per_sample"]
    # by hand: every forward sample-pass at the whole model's cost of its task
    assert cached["forward_flops"] == sum(n * f for n, f in zip(cached["forward_per_task"], per_sample, strict=True))


def test_passes_inside_a_plugin_count(tmp_path):
    path = tmp_path / "extra_pass.py"
    path.write_text(METHOD_FILE)
    spec = make_spec(method="extra-pass", regime="full")
    r = _run(spec, method_files=(str(path),))
    c = r.budget["compute"]
    assert c["forward_samples"] == c["backward_samples"] == 2 * r.budget["samples_seen"]  # samples_seen misses it


def test_derpp_makes_three_passes_per_step():
    naive, derpp = _run(make_spec(regime="full")), _run(make_spec(method="derpp", regime="full"))
    per_step = [c["forward_samples"] / r.budget["optimizer_steps"] for c, r in
                ((naive.budget["compute"], naive), (derpp.budget["compute"], derpp))]
    # current batch + two memory batches of batch_size rows (full even where a task's last batch is short)
    assert per_step[1] / per_step[0] == pytest.approx(3.0, rel=0.05)
    ratio = derpp.budget["compute"]["flops"] / naive.budget["compute"]["flops"]
    assert ratio == pytest.approx(3.0, rel=0.05)


# ------------------------------------------------------------------ no state change


def _without_compute(record) -> dict:
    data = record.to_dict()
    data["budget"] = {k: v for k, v in data["budget"].items() if k != "compute"}
    return {k: v for k, v in data.items() if k not in ("timings", "provenance")}


def test_compute_is_the_same_in_every_run_of_a_spec():
    """Deterministic entries only in the budget (records compare equal but for timings and provenance)."""
    a, b = _run(make_spec(method="gpm")), _run(make_spec(method="gpm"))
    assert a.budget == b.budget and "compute" in a.budget
    assert a.provenance["memory"]["peak_rss_bytes"] > 0 and a.timings["accounting_s"] >= 0


def test_a_rerun_compares_compute_exactly_and_older_records_still_reproduce():
    """A record whose compute was edited (totals kept consistent) does not reproduce, at any tolerance; one
    from before compute accounting reproduces bitwise."""
    from dataclasses import replace

    from harness.execution.reproduce import compare

    a, b = _run(make_spec(method="gpm")), _run(make_spec(method="gpm"))
    assert compare(a, b)[0] == "bitwise"
    c = dict(a.budget["compute"])
    c.update(forward_samples=3 * c["forward_samples"], forward_per_task=[3 * x for x in c["forward_per_task"]])
    tampered = replace(a, budget={**a.budget, "compute": c})
    assert compare(tampered, b)[:2] == ("differs", ("budget",))
    older = replace(a, budget={k: v for k, v in a.budget.items() if k != "compute"})
    assert compare(older, b)[0] == "bitwise"


@pytest.mark.parametrize("method,regime,hparams", [
    ("gpm", "last-1", {}), ("became", "last-1", {}), ("magmax", "full", {}), ("der", "last-1", {}),
    ("replay", "last-1", {}), ("lwf", "head", {})])
def test_records_are_identical_without_accounting(monkeypatch, method, regime, hparams):
    spec = make_spec(method=method, regime=regime, hparams=hparams)
    on = _run(spec)
    monkeypatch.setattr(compute, "ENABLED", False)
    off = _run(spec)
    assert "compute" in on.budget and "compute" not in off.budget
    assert _without_compute(on) == _without_compute(off)


def test_a_merge_is_counted():
    # one merge per task after the first (θ0 = task 1): τ and its fold-in, λ and θ0: 4 ops per merged element
    merged = sum(p.numel() for n, p in _digits_mlp().named_parameters() if n.startswith("blocks"))
    record = _run(make_spec(method="magmax", regime="full"))
    assert record.budget["compute"]["merge"]["element_ops"] == 4 * merged * 4 and record.timings["merge_s"] > 0


def _digits_mlp():
    from harness.run.engine import build_run_model
    model = build_run_model(make_spec(), (64,))
    apply_regime(model, "full")
    return model


# ------------------------------------------------------------------ store


def _record_json(**compute_entry):
    spec = make_spec()
    c = {"version": 1, "forward_samples": 10, "backward_samples": 6, "prefix_samples": 0, "flops": 30,
         "forward_flops": 20, "backward_flops": 10, "forward_per_task": [4, 6],
         "backward_per_task": [2, 4], "forward_flops_per_sample": [2, 2], "backward_flops_per_sample": [1, 1]}
    memory = compute_entry.pop("memory", {"peak_rss_bytes": 1 << 20})
    c.update(compute_entry)
    c = {k: v for k, v in c.items() if v is not None}
    return record_from({"spec": spec.to_dict(), "run_id": spec.run_id, "status": "failed", "error": "x",
                        "budget": {"compute": c}, "schema_version": SCHEMA_VERSION,
                        "timings": {"merge_s": 0.1, "accounting_s": 0.01},
                        "provenance": {"memory": memory}}).to_dict()


def test_store_accepts_a_record_with_compute_and_one_without():
    assert validate_record(_record_json()) is None
    data = _record_json()
    del data["budget"]["compute"]
    assert validate_record(data) is None


@pytest.mark.parametrize("entry,needle", [
    ({"version": 2}, "version"), ({"forward_samples": -1}, "forward_samples"), ({"flops": True}, "flops"),
    ({"flops": 2**70}, "flops"), ({"surprise": 1}, "unknown key"), ({"prefix_samples": None}, "no prefix_samples"),
    ({"forward_per_task": [4, 6, 1, 1, 1, 1]}, "at most"), ({"forward_samples": 11}, "add up"),
    ({"forward_per_task": [[4, 6]]}, "lists of at most"), ({"backward_flops_per_sample": [1, None]}, "counts"),
    ({"executed_flops": 31}, "executed_flops"), ({"executed_flops": -1}, "executed_flops"),
    ({"merge": {"element_ops": 1.5}}, "merge.element_ops"), ({"merge": {"seconds": 1.0}}, "merge is not"),
    ({"memory": {"peak_rss_bytes": -5}}, "provenance.memory.peak_rss_bytes"),
    ({"memory": {"peak_rss_bytes": 1, "host": "x"}}, "provenance.memory is not")])
def test_store_refuses_a_damaged_compute_entry(entry, needle):
    problem = validate_record(_record_json(**entry))
    assert problem is not None and needle in problem.reason


# ------------------------------------------------------------------ analysis and pages


def _cell_record(regime, method, order, flops):
    c = None if flops is None else {"version": 1, "forward_samples": flops // 10, "backward_samples": flops // 10,
                                    "flops": flops}
    budget = {"optimizer_steps": 100, "samples_seen": 3200, **({"compute": c} if c else {})}
    return record_from({"run_id": f"{regime}-{method}-{order}",
                        "spec": {"regime": regime, "label": method, "order": order},
                        "metrics": {"acc": 0.5 + 0.1 * order, "forgetting": 0.1}, "budget": budget,
                        "provenance": {"memory": {"peak_rss_bytes": 1000}} if c else {}})


def _grid(flops):
    return [_cell_record(rg, m, o, f) for (rg, m), f in flops.items() for o in range(2)]


def test_relative_compute_is_per_cell_and_missing_is_not_zero():
    t = analyse(_grid({("head", "naive"): 1000, ("head", "derpp"): 3000, ("full", "naive"): 2000,
                       ("full", "derpp"): 5000, ("head", "old"): None, ("full", "old"): None}))
    m = t.methods.set_index(["regime", "method"])
    assert m.loc[("head", "derpp"), "relative_flops"] == pytest.approx(3.0)
    assert m.loc[("full", "derpp"), "relative_flops"] == pytest.approx(2.5)  # not averaged with head's
    assert m.loc[("head", "naive"), "relative_flops"] == pytest.approx(1.0)
    assert math.isnan(m.loc[("head", "old"), "relative_flops"]) and math.isnan(m.loc[("head", "old"), "flops"])
    b = t.budget.set_index("method")
    assert b.loc["derpp", "relative_flops_min"] == pytest.approx(2.5)
    assert b.loc["derpp", "relative_flops_max"] == pytest.approx(3.0)


def test_budget_line_states_compute_per_cell(tmp_path):
    from harness.outputs.site import build_site

    build_site(_grid({("head", "naive"): 1000, ("head", "derpp"): 3000, ("full", "naive"): 2000,
                      ("full", "derpp"): 2000, ("head", "old"): None, ("full", "old"): None}), tmp_path)
    text = " ".join((tmp_path / "index.html").read_text().split())
    assert "Equal optimizer steps: 100 per run on average; compute differs" in text
    assert "digits · head: derpp 3.0×." in text and "full: derpp" not in text
    assert "Not measured: old." in text and "same budget" not in text


def test_budget_line_without_a_reference_compares_nothing(tmp_path):
    from harness.outputs.site import build_site

    build_site(_grid({("head", "derpp"): 3000, ("head", "replay"): 2000}), tmp_path)
    text = " ".join((tmp_path / "index.html").read_text().split())
    assert "compute not compared: no cell has a measured naive run" in text and "equal to naive" not in text


def test_budget_line_without_any_measurement(tmp_path):
    from harness.outputs.site import build_site

    build_site(_grid({("head", "naive"): None, ("head", "derpp"): None}), tmp_path)
    text = " ".join((tmp_path / "index.html").read_text().split())
    assert "compute not measured" in text and "0.0×" not in text


def test_compute_texts():
    assert flops_text(None) == "not measured" and flops_text(float("nan")) == "not measured"
    assert flops_text(812) == "812" and flops_text(1_234_000) == "1.23 M" and flops_text(45_600_000_000) == "45.6 G"
    assert times_text(3.0) == "3.0×" and times_text(None) == "not measured" and times_text(0.05) == "0.05×"


def test_export_carries_the_compute_columns(tmp_path):
    from harness.outputs.export import export_table

    out = export_table(_grid({("head", "naive"): 1000, ("head", "old"): None}), "csv", tmp_path / "t.csv")
    import csv
    rows = list(csv.DictReader(out.open()))
    by = {r["method"]: r for r in rows}
    assert float(by["naive"]["flops"]) == 1000 and by["old"]["flops"] == ""  # not measured: empty, never 0
    assert float(by["naive"]["sample_passes"]) == 200 and float(by["naive"]["peak_rss_bytes"]) == 1000


def test_report_has_a_compute_table_only_with_measurements():
    from harness.outputs.report import report_latex, report_markdown

    measured = analyse(_grid({("head", "naive"): 1000, ("head", "derpp"): 3000, ("head", "old"): None}))
    md = report_markdown(measured)
    assert "Training compute, FLOPs relative to naive" in md
    assert "| derpp | 3.0× |" in md and "| old | not measured |" in md and "| naive | 1.0× |" in md
    assert r"derpp & 3.0$\times$ \\" in report_latex(measured)
    old = analyse(_grid({("head", "naive"): None, ("head", "derpp"): None}))
    assert "Training compute" not in report_markdown(old) and "Training compute" not in report_latex(old)
