"""Plug-ins beyond methods: backbones, data sets and regime families, declared as typed values.

A plug-in file is a Python file whose `PLUGINS` is a tuple of `Backbone`, `DataSource` and
`RegimeFamily` values. It reaches the harness as a method file does (harness/api/registry.py):
`--plugin FILE.py`, a protocol's `plugins: [path.py]` (relative to the protocol file), or an
installed entry point of its kind's group (vocabulary.PLUGIN_GROUPS). The built-ins are declared
the same way (`PLUGINS` of harness/run/models.py, datasets.py, regimes.py) and found through the
same `lookup`, so a plug-in takes exactly the path a built-in takes.

Registering a plug-in adds its torch-free facts to the vocabulary (the names a protocol may use
from then on) and its declaration to this process's table. Its file's sha256 is its
`implementation`: it enters the run id of every run that uses it (`RunSpec.plugins`), so an
edited plug-in never reuses old records.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..config import vocabulary as vocab
from ..config.errors import PluginError
from ..config.shapes import ANY_SHAPE, InputShapes  # a plug-in file declares `accepts` with InputShapes
from ..config.validate import show

BUILT_IN = "built-in"




@dataclass(frozen=True)
class Backbone:
    """A backbone: `build(input_shape, **kwargs)` returns one torch module per name of `blocks`
    (input side first: the units depth regimes count); the harness adds the task heads.

    `input_shape`: one sample shape it accepts (what `cl-bench check` builds it for);
    `norm_blocks` / `bias_blocks`: the blocks holding normalisation layers / bias terms (what the
    `norm` and `bitfit` families can train; checked against the built model by `cl-bench check`);
    `feature_dim`: the width of the last block's output, an int or `f(kwargs)` (None: measured
    with one forward pass); `tail`: parameter-free modules appended after the blocks (e.g. pooling);
    `accepts`: every sample shape it can be built for, `input_shape` among them (default: any): a
    protocol pairing it with a data set of another shape is refused at load, or at planning when the
    data set's shape is known only once loaded; `token_blocks`: the transformer blocks (token
    sequences in and out) where the `prompt` regime families insert prompt tokens.
    """

    name: str
    build: Callable[..., Any]
    blocks: tuple[str, ...]
    input_shape: tuple[int, ...]
    description: str = ""
    norm_blocks: tuple[str, ...] = ()
    bias_blocks: tuple[str, ...] = ()
    feature_dim: int | Callable[[dict], int] | None = None
    tail: Mapping[str, Callable[[], Any]] = field(default_factory=lambda: MappingProxyType({}))
    accepts: InputShapes = ANY_SHAPE
    token_blocks: tuple[str, ...] = ()

    kind = "backbone"

    @property
    def facts(self) -> vocab.ModelFacts:
        """What a protocol is validated against (torch-free)."""
        return vocab.ModelFacts(self.blocks, self.description, self.norm_blocks, self.bias_blocks, self.accepts,
                                self.token_blocks)


@dataclass(frozen=True)
class DataSource:
    """A data set: `load(data_dir, download)` returns x_train, y_train, x_test, y_test (numpy arrays,
    labels 0..n_classes-1; a mapping of those names or a 4-tuple). `data_dir` is the folder of
    `--data-dir` (else the data folder of config.paths.data_dir). The harness validates the arrays, holds them as
    float32 tensors and fingerprints their content (part of every run id). `input_shape`: one sample's shape,
    if known without loading (a protocol is then checked against its model's `accepts` at load)."""

    name: str
    load: Callable[..., Any]
    n_classes: int
    default_model: str = vocab.USER_DATA_DEFAULT_MODEL
    description: str = ""
    origin: str = "plug-in"  # the vocabulary's DatasetFacts.source
    input_shape: tuple[int, ...] | None = None

    kind = "dataset"

    @property
    def facts(self) -> vocab.DatasetFacts:
        """What a protocol is validated against (torch-free)."""
        return vocab.DatasetFacts(self.n_classes, self.default_model, self.origin, self.input_shape)


@dataclass(frozen=True)
class RegimeFamily:
    """A regime family: within the blocks a regime's depth trains, `selects(module, param_name,
    argument)` says which parameters train (heads always train; the rest is frozen).

    Regimes of the family are written `NAME`, or `NAME-<argument><N>` when `argument` is a letter
    (lora: `lora-r4`, N >= 1), and compose with depth: `last-2:NAME`. `inject(model, blocks,
    argument)`, if given, adds adapters to those blocks before the regime applies (lora: peft
    adapters, whose `lora_` factors train under this family only).
    """

    name: str
    selects: Callable[[Any, str, int | None], bool]
    description: str = ""
    argument: str | None = None
    inject: Callable[..., Any] | None = None

    kind = "regime"


KINDS = {"backbone": Backbone, "dataset": DataSource, "regime": RegimeFamily}
PLUGIN = (Backbone, DataSource, RegimeFamily)


@dataclass(frozen=True)
class Registered:
    """A declaration with where it came from and the identity that enters run ids."""

    plugin: Backbone | DataSource | RegimeFamily
    source: str  # "built-in", a file path or "entry point NAME (VALUE)"
    implementation: str  # "built-in", or "sha256:<16 hex>" of the declaring file


# kind -> name -> Registered: built-ins (registered when their module is imported) and plug-ins.
_TABLE: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}


def plugins_of(obj, source: str) -> tuple:
    """The declarations a module (its `PLUGINS`), a declaration or a tuple of them stands for."""
    if isinstance(obj, PLUGIN):
        return (obj,)
    found = getattr(obj, "PLUGINS", obj)
    if not isinstance(found, (tuple, list)) or not all(isinstance(p, PLUGIN) for p in found):
        raise PluginError(f"{source}: PLUGINS must be a tuple of harness.api.plugins.Backbone, DataSource "
                          f"or RegimeFamily values, got {show(found)}")
    return tuple(found)


def register_builtins(*plugins) -> tuple:
    """Register the harness's own declarations (each built-in module calls this once, on import)."""
    for plugin in plugins:  # their facts are the vocabulary's own; tests build every one of them
        _TABLE[plugin.kind][plugin.name] = Registered(plugin, BUILT_IN, BUILT_IN)
    return plugins


def register(plugins, source: str, implementation: str) -> None:
    """Register a file's (or entry point's) declarations; a name taken elsewhere fails with both sources."""
    order = list(KINDS)  # backbones first: a data set of the same file may name one as its default model
    for plugin in sorted(plugins, key=lambda p: order.index(p.kind)):
        validate(plugin, source)
        held = _TABLE[plugin.kind].get(plugin.name)
        if (held is not None and held.source != source) or (held is None and _in_vocabulary(plugin)):
            raise PluginError(f"{source}: {plugin.kind} name {plugin.name!r} is already defined by "
                              f"{held.source if held else BUILT_IN}; choose another name")
        _TABLE[plugin.kind][plugin.name] = Registered(plugin, source, implementation)
        _add_to_vocabulary(plugin)


def lookup(kind: str, name: str) -> Registered:
    """The registered backbone, data set or regime family `name` (built-in or plug-in)."""
    found = _TABLE[kind].get(name)
    if found is None:
        known = ", ".join(_TABLE[kind]) or "(none)"
        raise PluginError(f"unknown {kind} {name!r}; allowed: {known}; a plug-in {kind} is registered by "
                          "its file (--plugin FILE.py, or the protocol's plugins:) or an installed entry point")
    return found


def used_plugins(model: str, dataset: str, regime: str) -> dict[str, Registered]:
    """The plug-ins (not built-ins) a run of this backbone, data set and regime uses, by `kind:name`."""
    try:
        family = vocab.parse_regime(regime).family
    except ValueError:  # an unknown family: the regime itself fails, with its own message
        family = None
    wanted = (("backbone", model), ("dataset", dataset), ("regime", family))
    found = {f"{kind}:{name}": _TABLE[kind].get(name) for kind, name in wanted}
    return {key: r for key, r in found.items() if r is not None and r.source != BUILT_IN}


def implementations(model: str, dataset: str, regime: str) -> dict[str, str]:
    """`RunSpec.plugins`: {`kind:name`: implementation} of the plug-ins a run uses (none: {})."""
    return {key: r.implementation for key, r in used_plugins(model, dataset, regime).items()}


def function_of(plugin) -> Callable:
    """The declaration's own function (build, load or selects): where its code lives."""
    return getattr(plugin, {"backbone": "build", "dataset": "load", "regime": "selects"}[plugin.kind])


def validate(plugin, source: str):
    """Check a declaration's fields; every problem names the source and the plug-in."""
    where = f"{source}: {plugin.kind} {plugin.name!r}"
    if not vocab.is_valid_name(plugin.name):
        raise PluginError(f"{source}: {plugin.kind} name {plugin.name!r} is not valid; allowed: {vocab.NAME_RULE}")
    if not callable(function_of(plugin)):
        raise PluginError(f"{where}: its function is not callable")
    {"backbone": _check_backbone, "dataset": _check_dataset, "regime": _check_family}[plugin.kind](plugin, where)
    return plugin


def _check_backbone(b: Backbone, where: str) -> None:
    names = b.blocks
    if not isinstance(names, tuple) or not names or not all(isinstance(n, str) and n for n in names) \
            or len(set(names)) != len(names):
        raise PluginError(f"{where}: blocks must be a non-empty tuple of distinct names, got {show(names)}")
    for key in ("norm_blocks", "bias_blocks", "token_blocks"):
        value = getattr(b, key)
        if not isinstance(value, tuple) or not set(value) <= set(names):
            raise PluginError(f"{where}: {key} must be a tuple of its blocks ({', '.join(names)}), got {show(value)}")
    shape = b.input_shape
    if not _is_shape(shape):
        raise PluginError(f"{where}: input_shape must be a tuple of positive ints (one sample), got {show(shape)}")
    if not isinstance(b.accepts, InputShapes) or not b.accepts.admits(shape):
        raise PluginError(f"{where}: accepts must be a harness.api.plugins.InputShapes that admits its input_shape "
                          f"{show(shape)}, got {show(b.accepts)}")
    if set(b.tail) & set(names):
        raise PluginError(f"{where}: tail names {sorted(set(b.tail) & set(names))} are also blocks")


def _is_shape(shape) -> bool:
    return isinstance(shape, tuple) and bool(shape) and \
        all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)


def _check_dataset(d: DataSource, where: str) -> None:
    if d.input_shape is not None and not _is_shape(d.input_shape):
        raise PluginError(f"{where}: input_shape must be None or a tuple of positive ints (one sample), "
                          f"got {show(d.input_shape)}")
    if isinstance(d.n_classes, bool) or not isinstance(d.n_classes, int) or d.n_classes < 2:
        raise PluginError(f"{where}: n_classes must be an int >= 2, got {show(d.n_classes)}")
    if d.default_model not in vocab.MODELS:
        raise PluginError(f"{where}: default_model {d.default_model!r} is not a backbone; allowed: "
                          f"{', '.join(vocab.MODELS)} (or a backbone declared before it)")


def _check_family(f: RegimeFamily, where: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9]*", f.name) or f.name in vocab.GRAMMAR_WORDS:
        raise PluginError(f"{where}: a family name is lower-case letters and digits, starting with a letter, "
                          f"and none of {', '.join(vocab.GRAMMAR_WORDS)}")
    if f.argument is not None and not (isinstance(f.argument, str) and re.fullmatch(r"[a-z]", f.argument)):
        raise PluginError(f"{where}: argument must be one lower-case letter (regimes NAME-<letter>N) or None, "
                          f"got {show(f.argument)}")
    if f.inject is not None and not callable(f.inject):
        raise PluginError(f"{where}: inject must be a function inject(model, blocks, argument) or None")


def _in_vocabulary(plugin) -> bool:
    """True when the name is a built-in's (whose facts the vocabulary holds from the start)."""
    if plugin.kind == "backbone":
        return plugin.name in vocab.MODELS
    if plugin.kind == "dataset":
        return plugin.name in vocab.DATASETS
    return plugin.name in vocab.FAMILY_ARGUMENTS or plugin.name in vocab.REGIME_FAMILIES


def _add_to_vocabulary(plugin) -> None:
    if plugin.kind == "backbone":
        vocab.MODELS[plugin.name] = plugin.facts
    elif plugin.kind == "dataset":
        vocab.DATASETS[plugin.name] = plugin.facts
    else:
        vocab.FAMILY_ARGUMENTS[plugin.name] = plugin.argument
        vocab.FAMILY_DESCRIPTIONS[plugin.name] = plugin.description
