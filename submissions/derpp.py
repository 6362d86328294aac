"""DER++ as a plugin: replay stored logits and labels from a reservoir buffer, three passes per step.

Each optimizer step runs the current minibatch (Avalanche's own forward pass) and two minibatches
drawn from the buffer, each through the model in its own forward pass, and back-propagates
loss = CE(current) + alpha * MSE(outputs on memory batch 1, their stored logits)
                   + beta * CE(outputs on memory batch 2, their stored labels).
After the step the current minibatch offers its rows (inputs, labels, task labels, the logits of
that step's forward pass) to a reservoir buffer over the whole stream. A small, readable version of
the built-in `derpp` (harness/methods/dark_replay.py), for task-incremental protocols.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from avalanche.core import SupervisedPlugin

from harness.api.contract import MemoryUse, Range

NAME = "derpp-plugin"
DEFAULTS = {"mem_size": 200, "alpha": 0.1, "beta": 0.5}
HPARAM_RANGES = {"mem_size": Range(low=1), "alpha": Range(low=0), "beta": Range(low=0)}
DESCRIPTION = "DER++ written as an Avalanche plugin: logit and label replay, three forward/backward passes per step"
REFERENCE = ("Buzzega et al., Dark Experience for General Continual Learning: a Strong, Simple Baseline, "
             "NeurIPS 2020")
FAMILY = "rehearsal"
SCENARIOS = ("task-il",)  # one head per task: stored logits keep their width (a growing class-IL head would not)
CAPTIONS = {"derpp_buffer_rows": "rows in the reservoir buffer after each task",
            "derpp_replay_loss": "mean replay term (alpha * MSE + beta * CE) per step of each task"}


class DerppPlugin(SupervisedPlugin):
    """A reservoir buffer of (x, y, task label, logits) and the two replay terms of DER++."""

    def __init__(self, mem_size: int, alpha: float, beta: float, seed: int):
        super().__init__()
        self.size, self.alpha, self.beta = int(mem_size), float(alpha), float(beta)
        self.rng = torch.Generator().manual_seed(seed)  # seeded by the run: same seed, same buffer
        self.store: list[torch.Tensor] = []  # x, y, t, logits: `size` rows each once the first batch comes
        self.seen = 0
        self.rows_per_task: list[int] = []
        self.replay: list[float] = []
        self._sum, self._steps = 0.0, 0

    def rows(self) -> int:
        """How many buffer slots hold an example."""
        return min(self.seen, self.size)

    def draw(self, n: int) -> list[torch.Tensor]:
        """min(n, rows) stored rows, without replacement."""
        index = torch.randperm(self.rows(), generator=self.rng)[:n]
        return [s[index.to(s.device)] for s in self.store]

    def before_backward(self, strategy, **kwargs):
        """Add the replay terms, each memory batch through the model in its own forward pass."""
        if self.rows() < 2:  # nothing stored yet (and BatchNorm cannot train on one row)
            return
        x, _, t, logits = self.draw(strategy.train_mb_size)
        term = self.alpha * F.mse_loss(strategy.model(x, t), logits)
        x, y, t, _ = self.draw(strategy.train_mb_size)
        term = term + self.beta * strategy._criterion(strategy.model(x, t), y)
        strategy.loss = strategy.loss + term
        self._sum, self._steps = self._sum + float(term.detach()), self._steps + 1

    def after_update(self, strategy, **kwargs):
        """Offer the step's rows and their logits to the reservoir (slot n while filling, then a random one)."""
        batch = [strategy.mb_x, strategy.mb_y, strategy.mb_task_id, strategy.mb_output]
        batch = [b.detach() for b in batch]
        if not self.store:
            self.store = [b.new_zeros((self.size, *b.shape[1:])) for b in batch]
        for i in range(len(batch[0])):
            slot = self.seen if self.seen < self.size else int(torch.randint(self.seen + 1, (1,), generator=self.rng))
            self.seen += 1
            if slot < self.size:
                for stored, new in zip(self.store, batch):
                    stored[slot] = new[i]

    def after_training_exp(self, strategy, **kwargs):
        """Per-task diagnostics."""
        self.rows_per_task.append(self.rows())
        self.replay.append(self._sum / self._steps if self._steps else 0.0)
        self._sum, self._steps = 0.0, 0

    def harness_diagnostics(self):
        """Called by the harness after every task; lands in record["diagnostics"]."""
        return {"derpp_buffer_rows": list(self.rows_per_task), "derpp_replay_loss": list(self.replay)}

    def harness_memory(self):
        """What the method keeps between tasks: the buffer's rows."""
        return MemoryUse(samples=self.rows(), tensors=tuple(s[:self.rows()] for s in self.store))


def build(ctx, mem_size: int, alpha: float, beta: float):
    """Sequential fine-tuning (Avalanche Naive) with the DER++ plugin."""
    from avalanche.training.supervised import Naive

    return Naive(**ctx.strategy_kwargs(DerppPlugin(mem_size, alpha, beta, ctx.seed)))
