"""A backbone plug-in: a residual MLP whose four blocks are the units depth regimes count.

`cl-bench check submissions/examples/residual_mlp.py` builds it; a protocol uses it as
`model: residual-mlp` once the file is given (`--plugin FILE.py` or the protocol's `plugins:`).
"""
from torch import nn

from harness.api.plugins import Backbone

WIDTH = 64


class Residual(nn.Module):
    """x + MLP(LayerNorm(x)): a pre-norm residual block of constant width."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def build(input_shape, width: int = WIDTH):
    """One module per block, input side first: a flattening stem, three residual blocks."""
    features = 1
    for d in input_shape:
        features *= d
    stem = nn.Sequential(nn.Flatten(), nn.Linear(features, width), nn.GELU())
    return [stem, Residual(width), Residual(width), nn.Sequential(Residual(width), nn.LayerNorm(width))]


PLUGINS = (
    Backbone("residual-mlp", build, blocks=("stem", "res1", "res2", "res3"), input_shape=(1, 8, 8),
             description="pre-norm residual MLP, width 64: stem + 3 residual blocks",
             norm_blocks=("res1", "res2", "res3"), bias_blocks=("stem", "res1", "res2", "res3"),
             feature_dim=WIDTH),
)
