"""What the harness offers and whether a method file fits it: `list` and `check`."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.defaults import LIST_SECTIONS
from .requests import CheckRequest, ListRequest

if TYPE_CHECKING:
    from ..execution.check import CheckResult


@dataclass(frozen=True)
class Section:
    """One section of a listing; its lines are computed as they are read (the methods' need the registry)."""

    name: str
    lines: Iterator[str]


def list_sections(req: ListRequest) -> tuple[Section, ...]:
    """The sections `req.what` asks for (every one for "all"), in order."""
    names = LIST_SECTIONS if req.what == "all" else (req.what,)
    from ..api.codefile import code_bytes

    for path in (*req.method_files, *req.plugin_files):  # a bad file fails before a section is printed
        code_bytes(path)
    if req.plugin_files:  # registering adds their names to the vocabulary the sections read (imports torch)
        from ..api.registry import get_registry

        get_registry(req.plugin_files)
    return tuple(Section(name, LISTERS[name](req)) for name in names)


def check(req: CheckRequest) -> CheckResult:
    """The adapter contract of a method file (or a registered method) on a tiny synthetic stream."""
    from ..execution.check import check as check_contract

    return check_contract(req.file, device=req.device)


def _list_protocols(req: ListRequest):
    from ..config.protocol import available_protocols, resolve_protocol_path
    from ..config.yamlfile import read_yaml

    for name in available_protocols():
        try:
            path = resolve_protocol_path(name)
            raw = read_yaml(path.read_text(), str(path)) or {}
        except Exception:  # listing must not die on one broken file
            raw = {}
        desc = str(raw.get("description", "")).strip().splitlines()[0] if raw.get("description") else ""
        yield f"{name:<20} v{raw.get('version', '?'):<5} {desc}"


def _list_datasets(req: ListRequest):
    from ..config.vocabulary import DATASETS

    for name, facts in DATASETS.items():
        plugin = _plugin_source("dataset", name)
        where = (f"plug-in ({plugin})" if plugin else "embedded" if facts.source == "embedded"
                 else f"{facts.source} (--data-dir, --download)")
        yield f"{name:<16} {facts.n_classes:>3} classes  default model {facts.default_model:<17} {where}"
    yield "npz:PATH         your own arrays x_train, y_train, x_test, y_test"


def _list_methods(req: ListRequest):
    # metadata by content hash: importing every adapter (torch, Avalanche) takes seconds
    from ..api.index import method_infos

    # a plug-in file may declare methods too, as `run --plugin` registers them
    for m in sorted(method_infos((*req.method_files, *req.plugin_files)), key=lambda m: m["name"]):
        hp = ", ".join(f"{k}={v}" for k, v in m["defaults"].items()) or "-"
        yield f"{m['name']:<16} {m['description'][:60]:<60} [{hp}]  ({m['source']})"


def _prompted(facts) -> str:
    """`, N take prompts` for a backbone with transformer blocks (where the prompt families put tokens)."""
    return f", {len(facts.token_blocks)} take prompts" if facts.token_blocks else ""


def _list_regimes(req: ListRequest):
    from ..config.vocabulary import FAMILY_ARGUMENTS, FAMILY_DESCRIPTIONS, MODELS, REGIME_FAMILIES

    yield "head       train the task heads only"
    yield "last-k     train the last k blocks + heads (k = 1, 2, 3, ... up to the model's depth)"
    yield "full       train every block + heads"
    yield "bitfit     train the biases of every block + heads (last-k:bitfit: of the last k blocks)"
    yield "norm       train the normalisation layers' scale and shift + heads (last-k:norm)"
    yield "lora-rR    train rank-R LoRA adapters on every Linear/Conv, base frozen + heads (last-k:lora-rR)"
    yield "prompt-lL  train L prompt tokens at the input of the first transformer block (VPT-shallow), backbone " \
          "frozen + heads (no depth)"
    yield "prompt-deep-lL  train L prompt tokens at every transformer block (VPT-deep), backbone frozen + heads " \
          "(last-k:prompt-deep-lL: the transformer blocks among the last k)"
    for family in (f for f in FAMILY_ARGUMENTS if f not in REGIME_FAMILIES):
        form = family if FAMILY_ARGUMENTS[family] is None else f"{family}-{FAMILY_ARGUMENTS[family]}N"
        yield (f"{form:<10} plug-in family ({_plugin_source('regime', family)}), also last-k:{form}: "
               f"{FAMILY_DESCRIPTIONS.get(family) or '(no description)'}")
    yield "families: " + "; ".join(f"{f}: {d}" for f, d in FAMILY_DESCRIPTIONS.items())
    yield "models: " + ", ".join(f"{name} ({facts.n_blocks} blocks{_prompted(facts)}{_from_plugin('backbone', name)})"
                                 for name, facts in MODELS.items())


def _plugin_source(kind: str, name: str) -> str | None:
    """Where the plug-in `name` of `kind` was declared; None for a built-in."""
    from ..api.plugins import BUILT_IN, lookup
    from ..config.errors import PluginError

    try:
        source = lookup(kind, name).source
    except PluginError:  # a built-in whose engine module (run/) is not imported: in the vocabulary only
        return None
    return None if source == BUILT_IN else source


def _from_plugin(kind: str, name: str) -> str:
    source = _plugin_source(kind, name)
    return f", plug-in {source}" if source else ""


LISTERS = {"protocols": _list_protocols, "datasets": _list_datasets, "methods": _list_methods,
           "regimes": _list_regimes}
