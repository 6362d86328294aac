"""A regime-family plug-in: train the weight matrices and kernels, freeze biases and normalisation.

Regimes of the family are `kernels` (every shared block) and `last-k:kernels`; it is the
complement of bitfit within Linear and Conv layers.
"""
from torch import nn

from harness.api.plugins import RegimeFamily


def selects(module, param_name: str, argument) -> bool:
    """True for the weight of a Linear or Conv layer."""
    return param_name == "weight" and isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d))


PLUGINS = (
    RegimeFamily("kernels", selects, description="the weights of the Linear/Conv layers of the trainable "
                 "blocks; biases and normalisation frozen"),
)
