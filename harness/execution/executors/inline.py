"""Runs specs one after another in this process."""
from __future__ import annotations

from .base import Executor, init_worker, run_spec


class InlineExecutor(Executor):
    """Runs specs one after another in this process."""

    name = "inline"

    def run(self, specs):
        """Yield one record per spec, in order."""
        init_worker(self.options.threads)
        for spec in specs:
            yield run_spec(spec, self.options)
