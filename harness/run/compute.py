"""Compute accounting of a run: what the method cost, measured at the model (record.budget["compute"]).

- Sample-passes: ONE forward hook on the run's root model counts the rows of every model call while the
  method is in control (its training, and the merge that builds the evaluated model), and ONE on the last
  block counts backbone passes made without a model call (`model.features(x)`); for an output that needs
  gradients the root hook registers ONE pre-hook on the output's autograd node, which counts the rows again
  when the backward pass reaches it. So passes a method makes inside a plugin (a replay batch, a teacher copy
  of the model, a Fisher pass) count; the harness's own evaluation, probe and continual-evaluation passes do
  not (the meter is paused). The harness's frozen-prefix cache runs the trainable suffix on cached features
  and the frozen prefix once per task: both are counted where they run (`suffix_pass`, `prefix_rows`); the
  record's FLOPs count a cached pass as a whole pass (the method's compute, whichever methods the cache can
  serve), and `executed_flops` what ran with the cache. Not
  counted: a backward pass that starts at the features (no loss on the heads' outputs).
- A method that trains and evaluates its own model around the run's (strategy.model is a wrapper sharing the
  run's blocks and heads, with its own forward: prompt pools) gets a third hook, on the wrapper's root: its calls
  are passes of the wrapper (path `wrapper`, their backward `wrapper_backward`). Passes of the run's model made
  inside a wrapper call without gradients (a prompt pool's query: `model.features(x)` on the frozen model) are
  passes of their own, counted as everywhere (a backbone pass each); those made with gradients (DualPrompt's
  prompted pass through the run model's forward) are the wrapper's pass itself, not counted again. No backward
  watch inside a wrapper call: the wrapper's covers its graph.
- FLOPs per sample: measured ONCE per model structure and trainable set on a meta-device copy (no data,
  no hooks: the real model's parameters, buffers, BatchNorm statistics and hooks are never touched), forward
  per block and head, backward for the trainable set (frozen parameters need no weight gradients), with
  torch.utils.flop_counter's per-operator formulas (matmul, conv, attention; element-wise ops count 0),
  then multiplied by the counted passes. A wrapper's pass: its whole forward measured on a meta copy made with
  the run's model (shared weights stay shared; `harness_flops_forward(x)` on the wrapper, where it has one,
  replaces its forward there: a forward with the same FLOPs that meta tensors can run, e.g. without
  data-dependent shapes), less what the passes of the run's model it makes without gradients cost (the same
  rule as counted: the query pass is counted once, as a backbone pass); backward: the wrapper's output's, for
  what trains.
- Peak memory: the process's peak resident set (VmHWM, reset at the run's start through
  /proc/self/clear_refs) and, on CUDA, torch.cuda.max_memory_allocated.
- Seconds per stage: training and evaluation (record.timings.train_s, eval_s, as before), the merge (building the
  evaluated model: timings.merge_s) and the accounting itself (timings.accounting_s); on CUDA the training stage
  ends with a synchronize, so its seconds include the device work it queued.

Where: what the spec, code and data determine goes to `record.budget["compute"]` (version 1, `as_json`): equal
in every run of a spec, like the rest of the budget. What varies between such runs goes where the record keeps
such values: seconds to `record.timings` (`timings()`), peak memory to `record.provenance["memory"]`
(`memory()`), both left out when records are compared (reproduce, isolation checks).
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ..config.specs import COMPUTE_VERSION

# Benchmarks and tests switch accounting off in-process to compare runs with and without it.
ENABLED = True
TRAIN, MERGE = "train", "merge"
# per task: rows of whole-model calls, backbone passes (in calls or alone), cached-suffix passes, cached-prefix
# rows and backward rows; rows of a wrapper model's calls and of their backward passes
PATHS = ("full", "backbone", "suffix", "prefix", "backward", "wrapper", "wrapper_backward")
WHAT_FLOPS_COUNT = "matmul/conv/attention FLOPs (torch.utils.flop_counter formulas); element-wise ops not counted"
_FLOPS_CACHE: dict = {}  # structural key -> per-sample FLOPs; same structure, same numbers (deterministic)
_CACHE_LIMIT = 64


class _FlopCount(TorchDispatchMode):
    """FlopCounterMode's count (its registry of per-operator formulas, its decomposition rule) without its module
    tracker, whose global module hooks would see every module of the process while it counts; and without the
    torch._dynamo wrapper every TorchDispatchMode subclass gets unless it opts out, as here. (The meta backend's
    own decompositions use torch._dynamo, which Avalanche has imported in every harness process before any run:
    a measurement imports no module, tests/test_compute.py.)"""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula = flop_registry.get(func._overloadpacket)
        if formula is None and func is not torch.ops.prim.device.default:
            with self:  # as FlopCounterMode: an op without a formula is counted through its decomposition
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")


def meta_copy(model: torch.nn.Module, *others: torch.nn.Module):
    """A copy of `model` on the meta device (shapes, no data) without any hook: running it cannot change the
    model's parameters, buffers or statistics, nor call a method's hooks. With `others` (a method's wrapper and the
    run's model): one copy of all of them (what they share stays shared), as a tuple, and a non-leaf tensor a
    module keeps (a wrapper's last loss, which deepcopy refuses) copied as a shell."""
    modules = (model, *others)
    memo = {}
    for t in [x for m in modules for x in (*m.parameters(), *m.buffers())]:
        if id(t) in memo:
            continue
        shell = torch.empty_like(t, device="meta")
        memo[id(t)] = torch.nn.Parameter(shell, requires_grad=t.requires_grad) \
            if isinstance(t, torch.nn.Parameter) else shell
    for m in (sub for module in modules for sub in module.modules()):  # empty hook tables: a hook's owner (a
        for hooks in HOOK_TABLES:                                         # plugin, the meter) is never copied
            table = getattr(m, hooks, None)
            if isinstance(table, dict):
                memo[id(table)] = type(table)()
        for value in vars(m).values() if others else ():  # (a model alone: such a tensor is not measured)
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                memo[id(value)] = torch.empty_like(value.detach(), device="meta")
    copied = copy.deepcopy(modules, memo)
    return copied if others else copied[0]


def _structure_key(model, input_shape) -> tuple:
    """What per-sample FLOPs depend on: module types and settings (stride, padding: their repr), parameter shapes,
    which parameters train, the input."""
    return (tuple(input_shape), repr(model), tuple(type(m).__name__ for m in model.modules()),
            tuple((n, tuple(p.shape), p.requires_grad) for n, p in model.named_parameters()))


def flops_per_sample(model, input_shape) -> dict:
    """{"blocks": forward FLOPs per sample of each block, "head": the head's, "backward": a full pass's backward
    FLOPs per sample for the parameters that train now}; measured on a meta copy, cached by structure."""
    key = _structure_key(model, input_shape)
    if key not in _FLOPS_CACHE:
        if len(_FLOPS_CACHE) >= _CACHE_LIMIT:
            _FLOPS_CACHE.clear()
        _FLOPS_CACHE[key] = _measure(model, input_shape)
    return dict(_FLOPS_CACHE[key])


def _measure(model, input_shape, rows: int = 2) -> dict:
    """Two rows (BatchNorm in training mode needs more than one), divided by two: matmul/conv FLOPs are linear
    in the rows."""
    clone = meta_copy(model)
    h = torch.zeros((rows, *input_shape), device="meta")
    blocks = []
    with torch.enable_grad():
        for block in clone.blocks.values():
            with _FlopCount() as count:
                h = block(h)
            blocks.append(count.total // rows)
        with _FlopCount() as count:
            out = clone.heads[0](h)
        head = count.total // rows
        backward = 0
        if out.requires_grad:
            with _FlopCount() as count:
                out.float().sum().backward()
            backward = count.total // rows
    return {"blocks": blocks, "head": head, "backward": backward}


def wrapper_flops_per_sample(wrapper, model, input_shape) -> dict:
    """{"forward": the wrapper's own forward FLOPs per sample (its whole forward less the passes of `model` inside
    it, counted as such), "backward": its output's backward FLOPs per sample, "whole": its whole forward's};
    measured on a meta copy of both, cached by structure."""
    key = ("wrapper", type(wrapper).__qualname__, _structure_key(wrapper, input_shape), _structure_key(model, ()))
    if key not in _FLOPS_CACHE:
        if len(_FLOPS_CACHE) >= _CACHE_LIMIT:
            _FLOPS_CACHE.clear()
        _FLOPS_CACHE[key] = _measure_wrapper(wrapper, model, input_shape)
    return dict(_FLOPS_CACHE[key])


def _measure_wrapper(wrapper, model, input_shape, rows: int = 2) -> dict:
    """The wrapper's forward for task 0 (`forward(x, 0)`, CLNet's interface; or its `harness_flops_forward(x)`) on
    two meta rows, the rows its passes of the run's model without gradients carried (the meter's two hooks and its
    rule, on the copy), and the backward of its output."""
    inner = flops_per_sample(model, input_shape)
    clone, net = meta_copy(wrapper, model)
    seen = dict.fromkeys(("full", "backbone"), 0)

    def counter(path):  # the meter's rule: a pass inside the wrapper's call is one of its own without gradients
        def hook(module, args, output):
            if not torch.is_grad_enabled():
                seen[path] += _rows(output)[0]
        return hook
    handles = [net.register_forward_hook(counter("full"))]
    blocks = getattr(net, "blocks", None)
    if isinstance(blocks, torch.nn.ModuleDict) and len(blocks):
        handles.append(list(blocks.values())[-1].register_forward_hook(counter("backbone")))
    x = torch.zeros((rows, *input_shape), device="meta")
    hook = getattr(clone, "harness_flops_forward", None)
    try:
        with torch.enable_grad():
            with _FlopCount() as count:  # one head, as the model's own measurement (task 0's)
                out = clone(x, 0) if hook is None else hook(x)
            whole = count.total // rows
            backward = 0
            tensors = _rows(out)[1]
            if tensors:
                with _FlopCount() as count:
                    sum(t.float().sum() for t in tensors).backward()
                backward = count.total // rows
    finally:
        for handle in handles:
            handle.remove()
    per_block = sum(inner["blocks"])
    nested = (seen["full"] * (per_block + inner["head"]) + max(seen["backbone"] - seen["full"], 0) * per_block)
    return {"forward": whole - nested // rows, "backward": backward, "whole": whole}


def _marked(hook):
    hook.harness_counting = True  # the evaluation cache knows such a hook changes no output
    return hook


def install_hooks(meter: ComputeMeter, model) -> list:
    """The meter's two forward hooks: plain functions (a deep copy of the model shares them and counts into the
    same meter while a stage is on). The last block's counts every backbone pass (inside a model call or
    `model.features(x)`: GPM's activations, prototypes, BatchNorm re-estimation); the root model's counts the
    calls that reached the heads (and watches their backward). A backbone pass that no model call followed is a
    features-only pass (as_json: backbone − full)."""
    def after(module, args, output):
        if meter.stage is not None and not (meter.inside and torch.is_grad_enabled()):
            meter.count("full", output)

    def features(module, args, output):
        if meter.stage is not None and meter.depth == 0 and not (meter.inside and torch.is_grad_enabled()):
            per_task = meter.counts[meter.stage]
            if per_task:
                per_task[-1]["backbone"] += output.shape[0] if isinstance(output, torch.Tensor) else 0

    handles = [model.register_forward_hook(_marked(after))]
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, torch.nn.ModuleDict) and len(blocks):
        handles.append(list(blocks.values())[-1].register_forward_hook(_marked(features)))
    return handles


def install_wrapper_hook(meter: ComputeMeter, wrapper) -> list:
    """The hooks on a wrapper model's root: its calls count as `wrapper` passes (and their backward); the run
    model's passes inside a call count as backbone passes, without a backward watch of their own."""
    def before(module, args):
        meter.inside += 1

    def after(module, args, output):
        meter.inside -= 1
        if meter.stage is not None:
            meter.count("wrapper", output)

    return [wrapper.register_forward_pre_hook(_marked(before)),  # always_call: a call that raised leaves no depth
            wrapper.register_forward_hook(_marked(after), always_call=True)]


def _rows(output) -> tuple[int, list]:
    """(rows, tensors a backward pass can reach) of a model output: a tensor or a dict of head outputs."""
    if type(output) is torch.Tensor and output.dim():  # the common case, first
        return output.shape[0], ([output] if output.requires_grad else [])
    tensors = list(output.values()) if isinstance(output, dict) else [output]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not tensors or tensors[0].dim() == 0:
        return 0, []
    return int(tensors[0].shape[0]), [t for t in tensors if t.requires_grad]


class ComputeMeter:
    """Counts a run's sample-passes per task and stage; measures FLOPs per sample, peak memory and seconds."""

    def __init__(self, model, input_shape, device):
        self.input_shape, self.device = tuple(input_shape), torch.device(device)
        self.stage: str | None = None
        self.task = -1
        self.counts: dict = {TRAIN: [], MERGE: []}  # stage -> per task {"full", "suffix", "prefix", "backward"}
        self.suffix_start: dict = {}  # task -> the first block of the cached suffix (rows counted by path)
        self.per_sample: list = []  # per task: flops_per_sample of the trainable set it trained with
        self.seconds = {TRAIN: 0.0, MERGE: 0.0, "accounting": 0.0}
        self.merge_ops: int | None = None
        self.merged = False  # the harness evaluated another model than the trained one (a merge) at least once
        self.depth = 0  # > 0 inside the prefix cache's own passes (counted by it)
        self.inside = 0  # > 0 inside a wrapper model's call (its graph's backward is the wrapper's)
        self.wrapper = None  # the method's own model around the run's (watch()), or None
        self._trainable, self._measured = None, None  # the last trainable set measured, and its FLOPs per sample
        self.unmeasured = None  # why the FLOPs could not be measured (then the record has no budget["compute"])
        self._handles = install_hooks(self, model)
        _reset_peak_memory(self.device)

    # -- counting (runs on every forward: keep it short) --
    def count(self, path: str, output) -> None:
        """Rows of one pass on `path` (full, suffix); a backward pass reaching its output counts too."""
        rows, grads = _rows(output)
        per_task = self.counts[self.stage]
        if not per_task:
            return
        per_task[-1][path] += rows
        if grads and torch.is_grad_enabled() and not self.inside:
            self._watch_backward(per_task[-1], rows, grads, "wrapper_backward" if path == "wrapper" else "backward")

    def _watch_backward(self, counts: dict, rows: int, grads, path: str = "backward") -> None:
        fired = []  # one count per forward, whichever head output the backward reaches first

        def on_grad(_grads):
            if not fired:
                fired.append(True)
                counts[path] += rows
        for t in grads:  # a pre-hook on the output's autograd node: half the cost of a tensor hook (measured)
            t.register_hook(on_grad) if t.grad_fn is None else t.grad_fn.register_prehook(on_grad)

    @contextmanager
    def cached(self):
        """The prefix cache runs blocks itself: its passes are counted by it (`suffix_pass`, `prefix_rows`)."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def suffix_pass(self, output, start: int) -> None:
        """The prefix cache ran blocks[start:] and the head on cached features (a training forward)."""
        if self.stage is not None:
            self.suffix_start[self.task] = start
            self.count("suffix", output)

    def prefix_rows(self, rows: int, end: int) -> None:
        """The prefix cache ran blocks[:end] once over `rows` training samples."""
        if self.stage is not None and self.counts[self.stage]:
            self.suffix_start[self.task] = end
            self.counts[self.stage][-1]["prefix"] += rows

    def watch(self, wrapper) -> None:
        """The method trains and evaluates `wrapper`, its own model around the run's: count its passes too."""
        self.wrapper = wrapper
        self._handles += install_wrapper_hook(self, wrapper)

    # -- stages --
    def start_task(self, model) -> None:
        """A task starts training with the trainable set now applied to `model`: measure its FLOPs (cached)."""
        t0 = time.perf_counter()
        self.task += 1
        for per_task in self.counts.values():
            per_task.append(dict.fromkeys(PATHS, 0))
        modules = (model,) if self.wrapper is None else (model, self.wrapper)
        trainable = tuple(p.requires_grad for m in modules for p in m.parameters())
        if trainable != self._trainable and not self.unmeasured:  # only the trainable set may change in a run
            try:
                measured = flops_per_sample(model, self.input_shape)
                if self.wrapper is not None:
                    measured["wrapper"] = wrapper_flops_per_sample(self.wrapper, model, self.input_shape)
                self._trainable, self._measured = trainable, measured
            except Exception as exc:  # noqa: BLE001  (the accounting never fails a run: its compute is not measured)
                self.unmeasured = f"{type(exc).__name__}: {exc}"[:200]
        self.per_sample.append(self._measured)
        self.seconds["accounting"] += time.perf_counter() - t0

    @contextmanager
    def stage_of(self, stage: str | None):
        """Count passes under `stage` (None: not the method's compute) and add its wall seconds."""
        before, t0 = self.stage, time.perf_counter()
        self.stage = stage
        try:
            yield
        finally:
            self.stage = before
            if stage is not None and before is None:
                _synchronize(self.device)
                self.seconds[stage] += time.perf_counter() - t0

    def evaluated_model(self, build, trained):
        """`build()` (the model the harness evaluates), counted as the merge when it is not `trained`."""
        before = self.seconds[MERGE]
        with self.stage_of(MERGE):
            evaluated = build()
        if evaluated is trained:  # nothing was merged: no merge stage (its passes are none either)
            self.seconds[MERGE] = before
        else:
            self.merged = True
        return evaluated

    def close(self) -> None:
        """Remove the hook from the model (copies made during the run keep an inert one: stage None)."""
        self.stage = None
        for handle in self._handles:
            handle.remove()

    # -- the record --
    def _flops(self, stage: str, as_run: bool = False) -> dict:
        """FLOPs of the stage's passes. The method's (default): a pass the prefix cache served counts as a whole
        pass, so a method's compute does not depend on which methods the harness's cache can speed up; `as_run`:
        what ran (the cached suffix passes, plus the frozen prefix once per task)."""
        fwd = bwd = 0
        for t, c in enumerate(self.counts[stage]):
            fps = self.per_sample[t]
            blocks, head = fps["blocks"], fps["head"]
            start = self.suffix_start.get(t, len(blocks))
            suffix = sum(blocks[start:]) + head if as_run else sum(blocks) + head
            fwd += c["full"] * (sum(blocks) + head) + _features_only(c) * sum(blocks) + c["suffix"] * suffix \
                + (c["prefix"] * sum(blocks[:start]) if as_run else 0)
            bwd += c["backward"] * fps["backward"]
            if "wrapper" in fps:
                fwd += c["wrapper"] * fps["wrapper"]["forward"]
                bwd += c["wrapper_backward"] * fps["wrapper"]["backward"]
        return {"forward": fwd, "backward": bwd}

    def as_json(self) -> dict | None:
        """The record's budget["compute"] (version 1): what the spec, code and data determine (passes, FLOPs,
        the merge's passes and element operations); the same in every run of one spec. None where the FLOPs
        could not be measured: "not measured", never a guess."""
        if self.unmeasured:
            return None
        train = self.counts[TRAIN]
        flops = self._flops(TRAIN)
        out = {"version": COMPUTE_VERSION,
               "forward_samples": sum(_forward(c) for c in train),
               "backward_samples": sum(_backward(c) for c in train),
               "prefix_samples": sum(c["prefix"] for c in train),
               "forward_per_task": [_forward(c) for c in train],
               "backward_per_task": [_backward(c) for c in train],
               "flops": flops["forward"] + flops["backward"], "forward_flops": flops["forward"],
               "backward_flops": flops["backward"],
               "forward_flops_per_sample": [_pass_flops(p) for p in self.per_sample],
               "backward_flops_per_sample": [p["wrapper"]["backward"] if "wrapper" in p else p["backward"]
                                             for p in self.per_sample]}
        if any(c["prefix"] or c["suffix"] for c in train):  # the harness's prefix cache served some passes
            out["executed_flops"] = sum(self._flops(TRAIN, as_run=True).values())
        if self.merged or self.merge_ops is not None:
            merge = self.counts[MERGE]
            out["merge"] = {"forward_samples": sum(_forward(c) for c in merge),
                            "backward_samples": sum(_backward(c) for c in merge),
                            "flops": sum(self._flops(MERGE).values())}
            if self.merge_ops is not None:
                out["merge"]["element_ops"] = int(self.merge_ops)
        return out

    def timings(self) -> dict:
        """What varies between runs of one spec, for record.timings: the merge's wall seconds (building the
        evaluated model, where it is another than the trained one) and the accounting's own (FLOP measurement)."""
        out = {"accounting_s": self.seconds["accounting"]}
        if self.merged:
            out["merge_s"] = self.seconds[MERGE]
        return out

    def memory(self) -> dict:
        """The run's peak memory, for record.provenance["memory"]: host RSS, and CUDA's peak allocated on CUDA."""
        out = {"peak_rss_bytes": peak_rss_bytes()}
        if self.device.type == "cuda":
            out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out


def _features_only(counts: dict) -> int:
    """Backbone passes no model call followed (`model.features(x)`); a model without blocks has none."""
    return max(counts["backbone"] - counts["full"], 0)


def _forward(counts: dict) -> int:
    """Forward sample-passes: through the whole model, the backbone alone, the trainable suffix (cached), or the
    method's wrapper model."""
    return counts["full"] + _features_only(counts) + counts["suffix"] + counts["wrapper"]


def _backward(counts: dict) -> int:
    """Backward sample-passes: the run model's and the wrapper's."""
    return counts["backward"] + counts["wrapper_backward"]


def _pass_flops(per_sample: dict) -> int:
    """Forward FLOPs per sample of one training pass: the wrapper's whole forward where the method has one (L2P:
    its query pass and its prompted pass), else the model's."""
    if "wrapper" in per_sample:
        return per_sample["wrapper"]["whole"]
    return sum(per_sample["blocks"]) + per_sample["head"]


def _synchronize(device) -> None:
    """On CUDA a stage's wall seconds include its queued device work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak_memory(device) -> None:
    """Start the run's peaks here: VmHWM (Linux: writing 5 to clear_refs resets it), CUDA's peak allocated."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not allowed: the peak is the process's so far
        pass
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_rss_bytes() -> int:
    """The process's peak resident set size in bytes (VmHWM; ru_maxrss where /proc is absent)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def merge_element_ops(strategy) -> int | None:
    """Element operations of the method's merges, where the strategy or a plugin counts them
    (`harness_merge_ops`, an int); None: the method declares none."""
    found = [getattr(o, "harness_merge_ops", None) for o in (strategy, *getattr(strategy, "plugins", ()))]
    found = [int(x) for x in found if isinstance(x, int) and not isinstance(x, bool)]
    return sum(found) if found else None

