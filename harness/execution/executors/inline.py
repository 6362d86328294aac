"""Runs specs one after another in this process."""
from __future__ import annotations

from .base import Executor, init_worker, run_spec


class InlineExecutor(Executor):
    """Runs specs one after another in this process."""

    name = "inline"

    def run(self, specs):
        """Yield one record per spec, in order; after a run that left this process in a state that could
        not be put back (its record says so), the rest run in a fresh worker process."""
        from ...run.isolation import process_dirty
        from .process import ProcessExecutor

        init_worker(self.options.threads)
        specs = iter(specs)
        for spec in specs:
            yield run_spec(spec, self.options)
            if process_dirty():
                yield from ProcessExecutor(self.options, 1, self.max_retries).run(specs)
                return
