"""Which sample shapes a backbone takes (torch-free): checked when a protocol is loaded and planned.

A backbone is built for its data set's sample shape, but not every architecture can take every
shape: a 2-D CNN needs (C, H, W) images large enough for its pooling, a 1-D CNN (L,) or (C, L)
signals. Each backbone declares `InputShapes`; `shape_problem` says, in one clause, why a data set's
samples do not fit, so a protocol pairing them is refused before any run (each would fail alike).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_AXES = {1: ("L",), 2: ("C", "L"), 3: ("C", "H", "W")}  # the layouts a message names


@dataclass(frozen=True)
class InputShapes:
    """Sample shapes of `ranks` dimensions (empty: any number), each of the last `spatial` dimensions
    at least `minimum` (e.g. three 2x2 poolings need 8)."""

    ranks: tuple[int, ...] = ()
    spatial: int = 0
    minimum: int = 1

    def admits(self, shape) -> bool:
        """True when a sample of `shape` fits."""
        shape = tuple(shape)
        if self.ranks and len(shape) not in self.ranks:
            return False
        return all(d >= self.minimum for d in shape[len(shape) - min(self.spatial, len(shape)):]) and \
            all(d >= 1 for d in shape)

    def describe(self) -> str:
        """What it takes, in words: `samples of shape (C, H, W) with H, W >= 8`."""
        if not self.ranks:
            return "samples of any shape"
        layouts = " or ".join(f"({', '.join(_AXES[r])}{',' if r == 1 else ''})" if r in _AXES
                              else f"{r} dimensions" for r in self.ranks)
        if self.spatial and self.minimum > 1:
            axes = dict.fromkeys(a for r in self.ranks for a in _AXES.get(r, ("D",) * r)[-self.spatial:])
            return f"samples of shape {layouts} with {', '.join(axes)} >= {self.minimum}"
        return f"samples of shape {layouts}"


ANY_SHAPE = InputShapes()


def shape_problem(model: str, dataset: str, shape, accepts: Mapping[str, InputShapes]) -> str | None:
    """Why backbone `model` cannot take the samples of `dataset` (of `shape`), else None; `accepts`
    maps every backbone to the shapes it takes (the message names those that take these samples)."""
    shape = tuple(int(d) for d in shape)
    if accepts[model].admits(shape):
        return None
    fitting = [name for name, a in accepts.items() if a.admits(shape)]
    return (f"model {model!r} takes {accepts[model].describe()}, but dataset {dataset!r} has samples of shape "
            f"{shape}; allowed: a model that takes them ({', '.join(fitting) or 'none registered'})")
