"""The plug-in contract (`cl-bench check FILE.py` of a file with `PLUGINS`): build, load, apply.

Each backbone is built for its `input_shape` through the engine's own `build_model`: its blocks and
its normalisation and bias blocks must be the declared ones, a forward and a backward pass must
work, and every built-in regime the vocabulary admits on it must apply. Each data set is loaded
through `load_dataset` (the arrays validated as a user's npz file is, the declared classes) and a
few rows go through its default backbone. Each regime family is applied to two built-in backbones:
it must select some parameter, its adapters (if any) must leave the model's outputs unchanged, and
one training step must leave every frozen tensor bitwise unchanged. Every problem is one line
naming the file, the plug-in and what is wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

README = "submissions/README.md"
ROWS = 4  # samples pushed through a backbone
FAMILY_BACKBONES = (("mlp-bn", (1, 8, 8)), ("small-cnn", (1, 8, 8)))
DEPTH_REGIMES = ("head", "last-1", "full", "bitfit", "norm", "lora-r2", "prompt-l2", "prompt-deep-l2")


def declares(target: str) -> tuple[bool, bool]:
    """(declares plug-ins, defines methods) for a Python file that imports; (False, False) otherwise."""
    from ..api.registry import RegistryError, load_module_file

    path = Path(target)
    if path.suffix != ".py" or not path.is_file():
        return False, False
    try:
        module = load_module_file(path)
    except RegistryError:  # the method contract's load check reports it
        return False, False
    return hasattr(module, "PLUGINS"), any(hasattr(module, a) for a in ("ADAPTERS", "NAME"))


@dataclass(frozen=True)
class Finding:
    """One broken rule of a plug-in: which check, what is wrong (one line naming file and plug-in), the fix."""

    check: str
    problem: str
    fix: str


@dataclass(frozen=True)
class PluginCheck:
    """The findings (none when every plug-in holds) and the checks that passed."""

    findings: tuple = ()
    passed: tuple = ()

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.findings


def check_plugin_file(target: str) -> PluginCheck:
    """Build, load or apply every plug-in a file declares; findings name the file and the plug-in."""
    from ..api.plugins import plugins_of
    from ..api.registry import RegistryError, get_registry, load_module_file

    try:
        declared = plugins_of(load_module_file(target), target)
        get_registry((target,))  # registers them: a name taken elsewhere fails here
    except RegistryError as exc:
        fix = ("a plug-in file defines PLUGINS = (Backbone(...), DataSource(...), RegimeFamily(...)) of "
               f"harness.api.plugins, with names no built-in or other file takes; see {README}")
        return PluginCheck((Finding("load", str(exc), fix),))
    findings, passed = [], [f"✓ loads: {', '.join(f'{p.kind} {p.name!r}' for p in declared) or 'nothing'}"]
    checks = {"backbone": check_backbone, "dataset": check_dataset, "regime": check_family}
    for plugin in declared:
        f, p = checks[plugin.kind](plugin, f"{target}: {plugin.kind} {plugin.name!r}")
        findings += f
        passed += p
    return PluginCheck(tuple(findings), tuple(passed))


def _failed(check: str, where: str, problem: str, fix: str) -> tuple[list, list]:
    return [Finding(check, f"{where}: {problem}", fix)], []


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


def check_backbone(backbone, where: str) -> tuple[list, list]:
    """Build for its input shape; its blocks, norm and bias blocks, forward/backward, admitted regimes."""
    from ..run.models import build_model

    shape = backbone.input_shape
    try:
        model = build_model(backbone.name, shape, n_heads=2, head_classes=3)
    except Exception as exc:
        return _failed("build", where, f"building it for input {shape} raised {_error(exc)}",
                       "build(input_shape, **kwargs) must return one torch module per block for input_shape")
    problem = _block_problem(backbone, model) or _pass_problem(model, shape)
    if problem:
        return _failed("backbone", where, problem[0], problem[1])
    applied, failed = _regimes_apply(backbone)
    if failed:
        return _failed("regimes", where, failed, "every block must work with the harness's freezing; see the error")
    n = sum(p.numel() for p in model.blocks.parameters())
    return [], [f"✓ {where}: builds for input {shape} ({', '.join(backbone.blocks)}; {n:,} parameters, "
                f"{model.heads[0].in_features} features); forward and backward pass; "
                f"regimes {', '.join(applied)} apply"]


def _block_problem(backbone, model) -> tuple[str, str] | None:
    """The first way the built blocks differ from the declaration, with its fix; None when they agree."""
    from ..api.prompts import token_blocks
    from ..run.models import trainable_block_names
    from ..run.regimes import NORM_LAYERS

    found = trainable_block_names(model)
    if found != list(backbone.blocks):
        return (f"the blocks with parameters are {', '.join(found) or '(none)'}; it declares "
                f"{', '.join(backbone.blocks)}", "declare blocks = the names of the modules build returns, in order, "
                "each with parameters (parameter-free modules go into a block or `tail`)")
    picks = {"norm_blocks": lambda m, p: isinstance(m, NORM_LAYERS), "bias_blocks": lambda m, p: p == "bias"}
    for key, pick in picks.items():
        has = [b for b in found if any(pick(m, p) for m in model.blocks[b].modules()
                                       for p, _ in m.named_parameters(recurse=False))]
        if set(has) != set(getattr(backbone, key)):
            return (f"{key} declares ({', '.join(getattr(backbone, key))}), the built blocks holding them are "
                    f"({', '.join(has)})", f"declare {key}={tuple(has)!r} (the norm and bitfit regimes train them)")
    tokens = list(token_blocks(model))
    if set(tokens) != set(backbone.token_blocks):
        return (f"token_blocks declares ({', '.join(backbone.token_blocks)}), the built blocks with the token-block "
                f"API are ({', '.join(tokens)})", f"declare token_blocks={tuple(tokens)!r}; a token block has "
                "embed_dim, prefix_tokens, prompt and add_prompt (harness/api/prompts.py)")
    return None


def _pass_problem(model, shape) -> tuple[str, str] | None:
    """A forward pass (train and eval mode) and a backward pass on random inputs, or what went wrong."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn((ROWS, *shape), generator=generator)
    try:
        out = model.train()(x, 1)
        out.sum().backward()
        evaluated = model.eval()(x, 0)
    except Exception as exc:
        return f"a forward/backward pass on {ROWS} inputs of shape {shape} raised {_error(exc)}", \
            "the blocks, applied in order, must map a batch of input_shape samples to flat features"
    if tuple(out.shape) != (ROWS, 3) or not bool(torch.isfinite(out).all() and torch.isfinite(evaluated).all()):
        return f"the head's outputs are {tuple(out.shape)} or not finite on random inputs", \
            "the last block must return finite (batch, features) tensors"
    if not any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.blocks.parameters()):
        return "no block parameter receives a gradient", "the blocks' outputs must depend on their parameters"
    return None


def _regimes_apply(backbone) -> tuple[list[str], str]:
    """(regimes applied, '' or the first failure) of the built-in regimes the vocabulary admits on it."""
    from ..config.vocabulary import regime_problem
    from ..run.models import build_model
    from ..run.regimes import apply_regime, inject_adapters, parameter_counts

    applied = []
    for regime in DEPTH_REGIMES:
        if regime_problem(regime, backbone.name):
            continue
        try:
            model = inject_adapters(build_model(backbone.name, backbone.input_shape, 2, 3), regime)
            apply_regime(model, regime)
            parameter_counts(model, regime)
        except Exception as exc:
            return applied, f"regime {regime!r} cannot be applied: {_error(exc)}"
        applied.append(regime)
    return applied, ""


def check_dataset(source, where: str) -> tuple[list, list]:
    """Load it (validated, with the declared classes) and push a few rows through its default backbone."""
    from ..config.paths import DATA_ENV
    from ..run.datasets import load_dataset
    from ..run.models import build_model

    try:
        data = load_dataset(source.name)
    except Exception as exc:
        text = str(exc) if str(exc).startswith(where.split(":")[0]) else f"{where}: {_error(exc)}"
        return [Finding("load", text, "load(data_dir, download) must return x_train, y_train, x_test, y_test; "
                        f"the data folder is ${DATA_ENV}, else ./data; see {README}")], []
    try:
        model = build_model(source.default_model, data.input_shape, n_heads=1, head_classes=source.n_classes)
        out = model.eval()(data.x_train[:ROWS], 0)
    except Exception as exc:
        return _failed("model", where, f"its default backbone {source.default_model!r} cannot read samples of shape "
                       f"{data.input_shape}: {_error(exc)}", "choose a default_model that accepts its samples")
    return [], [f"✓ {where}: {len(data.y_train)} train / {len(data.y_test)} test samples of shape {data.input_shape}, "
                f"{data.n_classes} classes; its default backbone {source.default_model!r} reads them "
                f"({tuple(out.shape)} outputs)"]


def check_family(family, where: str) -> tuple[list, list]:
    """Apply it to built-in backbones: it selects something, adapters keep outputs, frozen stays frozen."""
    name = family.name if family.argument is None else f"{family.name}-{family.argument}2"
    lines, selected = [], 0
    for backbone, shape in FAMILY_BACKBONES:
        for regime in (name, f"last-1:{name}"):
            try:
                counts = _apply_family(backbone, shape, regime)
            except Exception as exc:
                return _failed("regime", where, f"{regime} on {backbone} raised {_error(exc)}",
                               "selects(module, param_name, argument) must return True or False; inject(model, "
                               "blocks, argument) must add adapters that leave the outputs unchanged")
            if counts is not None:
                selected += 1
                lines.append(f"{regime} on {backbone}: {counts['trainable_shared']:,} of "
                             f"{counts['total_shared']:,} shared parameters train")
    if not selected:
        return _failed("regime", where, f"{name} selects no parameter of {' or '.join(b for b, _ in FAMILY_BACKBONES)}",
                       "selects(module, param_name, argument) returns True for the parameters that train")
    return [], [f"✓ {where}: " + "; ".join(lines) + "; frozen tensors stay bitwise unchanged"]


def _apply_family(backbone: str, shape: tuple, regime: str) -> dict | None:
    """Parameter counts under the regime after one SGD step (None: it selects nothing on this backbone)."""
    import torch

    from ..run.models import build_model
    from ..run.regimes import RegimeError, apply_regime, changed_frozen, frozen_state, inject_adapters, parameter_counts

    torch.manual_seed(0)
    model = build_model(backbone, shape, n_heads=2, head_classes=2).eval()
    x = torch.randn((ROWS, *shape))
    with torch.no_grad():
        before = model(x, 0)
        inject_adapters(model, regime)
        if not torch.allclose(model(x, 0), before, atol=1e-6):
            raise ValueError("its adapters change the model's outputs at injection")
    try:
        apply_regime(model, regime)
    except RegimeError:
        return None
    frozen = frozen_state(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()(x, 0).square().mean().backward()
    optimizer.step()
    changed = changed_frozen(model, frozen)
    if changed:
        raise ValueError(f"one training step changed frozen tensors {', '.join(changed[:3])}")
    return parameter_counts(model, regime)
