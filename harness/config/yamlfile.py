"""The one YAML reader of cl-bench's input files: what a file says is what the harness reads.

PyYAML's safe loader follows YAML 1.1, which reads some text otherwise than a researcher means it:
a key written twice keeps its last value silently, `1e-3` (no dot) is a string while `1.0e-3` is a
number, `010` is the octal 8 and `1:20` the base-60 number 80. `read_yaml` refuses a duplicate key
at any depth and an ambiguous number (one line: file, line, key path), reads every float literal
(`1e-3`, `5E-1`, `.5`, `-.5`, `1.e3`) as a number, leaves a quoted scalar a string, and refuses
aliases that expand past `MAX_NODES` nodes ("billion laughs").
"""
from __future__ import annotations

import re
from functools import lru_cache

from .errors import UserError

# A protocol has a few hundred nodes; refuse to build more than this many.
MAX_NODES = 100_000
_FLOAT_TAG = "tag:yaml.org,2002:float"
_INT_TAG = "tag:yaml.org,2002:int"
_MERGE_TAG = "tag:yaml.org,2002:merge"
# YAML 1.2's float literals (exponent with or without a dot, an optional sign everywhere), plus 1.1's
# base-60 form, which the constructor refuses by name rather than reading it as a string.
FLOAT_LITERAL = re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.VERBOSE)
_OLD_OCTAL = re.compile(r"^[-+]?0[0-9_]+$")


class YamlError(UserError, ValueError):
    """A YAML file that cannot mean what it says: one line naming the file, the line and the key."""


def read_yaml(text: str, source: str, error: type[UserError] = YamlError):
    """The document of `text` (None when empty); every refusal raises `error` with one line that
    names `source` (a YAML syntax error raises yaml.YAMLError, as yaml.safe_load does)."""
    loader = _loader_class()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_NODES:
            raise error(f"{source}: its YAML aliases expand to more than {MAX_NODES:,} nodes; "
                        "allowed: a file without alias bombs (write the values out)")
        problem = _duplicate_key(node, "", set())
        if problem:
            raise error(f"{source}:{problem}")
        try:
            return loader.construct_document(node)
        except _Ambiguous as exc:
            raise error(f"{source}:{exc}") from None
    finally:
        loader.dispose()


class _Ambiguous(Exception):
    """A number YAML 1.1 reads otherwise than it reads to a person."""


@lru_cache(maxsize=1)
def _loader_class():
    """yaml.SafeLoader with float literals as YAML 1.2 reads them and ambiguous numbers refused
    (built on first use: importing yaml is left to the commands that read a file)."""
    import yaml

    class Loader(yaml.SafeLoader):
        """SafeLoader whose float and int scalars mean what they read as."""

        def construct_yaml_int(self, node):
            text = str(node.value)
            if ":" in text or _OLD_OCTAL.match(text):
                reading = super().construct_yaml_int(node)
                raise _Ambiguous(f"{node.start_mark.line + 1}: {text!r} is an ambiguous number (YAML 1.1 reads it "
                                 f"as {reading}, in base {60 if ':' in text else 8}); allowed: a decimal number "
                                 "without leading zeros, or a quoted string")
            return super().construct_yaml_int(node)

        def construct_yaml_float(self, node):
            if ":" in str(node.value):
                raise _Ambiguous(f"{node.start_mark.line + 1}: {node.value!r} is an ambiguous number (YAML 1.1 "
                                 "reads it in base 60); allowed: a decimal number, or a quoted string")
            return super().construct_yaml_float(node)

    Loader.yaml_implicit_resolvers = {
        first: [(tag, FLOAT_LITERAL if tag == _FLOAT_TAG else regexp) for tag, regexp in resolvers]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_constructor(_INT_TAG, Loader.construct_yaml_int)
    Loader.add_constructor(_FLOAT_TAG, Loader.construct_yaml_float)
    return Loader


def _children(node) -> list:
    return [c for item in node.value for c in (item if isinstance(item, tuple) else (item,))]


def _expanded_size(node, memo: dict) -> int:
    """Nodes after every alias is expanded (memoised: shared nodes are counted, not walked, again)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = MAX_NODES + 1  # a node inside itself (recursive alias) is unbounded
    if isinstance(node.value, list):
        size = 1 + sum(min(_expanded_size(c, memo), MAX_NODES + 1) for c in _children(node))
    else:
        size = 1
    memo[id(node)] = size
    return size


def _duplicate_key(node, path: str, seen: set) -> str | None:
    """`LINE: PATH: ...` of the first key written twice in one mapping (merge keys `<<` excepted: their
    keys are meant to be overridden), else None; a node reached again through an alias is not re-walked."""
    import yaml

    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict = {}
        for key, value in node.value:
            if key.tag == _MERGE_TAG:
                continue
            label = key.value if isinstance(key, yaml.ScalarNode) else None
            where = f"{path}.{label}" if path else str(label)
            if label is not None and (key.tag, label) in first:
                return (f"{key.start_mark.line + 1}: {where}: duplicate key (first at line "
                        f"{first[(key.tag, label)]}); allowed: each key once per mapping")
            if label is not None:
                first[(key.tag, label)] = key.start_mark.line + 1
            problem = _duplicate_key(value, where, seen)
            if problem:
                return problem
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            problem = _duplicate_key(item, f"{path}[{i}]", seen)
            if problem:
                return problem
    return None
