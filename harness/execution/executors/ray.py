"""RayExecutor: each spec a Ray task, locally (`--jobs` CPUs) or on a cluster (`--ray-address`).

Records come back to the driver, which is the only writer. A worker crash or a lost node
is retried by Ray (`max_retries`); after that the spec becomes a failed record, so every
spec yields exactly one record. Ctrl-C stops dispatch and hands over the records that
have already finished before re-raising.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass

from ...config.errors import SweepError
from ...config.specs import RunRecord, RunSpec
from .base import Executor, init_worker, lost_record, run_spec

DIRTY_EXIT = 75  # a worker's exit status once a run left it dirty (counted as a crash, retried)


@dataclass(frozen=True)
class RayOptions:
    """Where and how Ray runs: cluster address (None: start a local Ray), per-run resources."""

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_retries: int = 1


def _ray_task(spec_dict: dict, options, threads: int) -> dict:
    """Runs on a Ray worker: one spec -> the record as a plain dict."""
    from ...run.isolation import process_dirty

    if process_dirty():  # an earlier run left this reused worker in a state that could not be put back:
        os._exit(DIRTY_EXIT)  # end it before it runs anything; Ray reruns the task on a fresh worker
    init_worker(threads)  # Ray reuses worker processes: setting threads again is harmless
    return run_spec(RunSpec.from_dict(spec_dict), options).to_dict()


def import_ray():
    """The ray module, or a one-line error naming the extra to install."""

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise SweepError("--executor ray: Ray is not installed; pip install 'cl-bench[ray]'") from None
    return ray


def start_ray(ray, address: str | None, num_cpus: int) -> bool:
    """Join `address`, or start a private local Ray with `num_cpus` CPUs; True if we started it."""

    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address)
    common = dict(log_to_driver=False, logging_level=logging.WARNING)
    try:
        if address:  # the cluster's own settings (dashboard, CPUs) are the cluster's business
            ray.init(address=address, **common)
        else:  # "local": never silently join a cluster found via RAY_ADDRESS or `ray start`
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **common)
    except (OSError, RuntimeError, ValueError) as exc:
        where = f"join the Ray cluster at {address}" if address else "start a local Ray"
        raise SweepError(f"--ray-address: could not {where}: {str(exc).splitlines()[0]}") from None
    return True


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a cluster address nobody answers at (ray.init retries for many minutes)."""
    import socket

    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return  # "auto" or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise SweepError(f"--ray-address: nothing answers at {address} ({exc.strerror or exc}); "
                         "is the Ray head running (`ray start --head`)?") from None


class RayExecutor(Executor):
    """Runs specs as Ray tasks; yields records as they finish (the driver writes them)."""

    name = "ray"

    def __init__(self, options, jobs: int = 1, ray_options: RayOptions = RayOptions()):
        super().__init__(options, jobs, ray_options.max_retries)
        self.ray_options = ray_options

    def run(self, specs):
        """Yield exactly one record per spec, in completion order."""
        ray = import_ray()
        started = start_ray(ray, self.ray_options.address, self.jobs)
        try:
            yield from self._dispatch(ray, deque(specs))
        finally:
            if started:
                ray.shutdown()

    def _remote(self, ray):
        ro = self.ray_options
        return ray.remote(_ray_task).options(num_cpus=ro.num_cpus, num_gpus=ro.num_gpus,
                                             max_retries=ro.max_retries, retry_exceptions=False)

    def _window(self, ray) -> int:
        """Tasks kept in flight: twice the cluster's slots, so dispatch stays bounded (Ctrl-C)."""
        ro = self.ray_options
        total = ray.cluster_resources()
        slots = total.get("GPU", 0) / ro.num_gpus if ro.num_gpus else total.get("CPU", 1) / max(ro.num_cpus, 1e-9)
        return max(2, 2 * int(slots))

    def _dispatch(self, ray, todo: deque):
        remote, window = self._remote(ray), self._window(ray)
        threads = self.options.threads or max(1, int(self.ray_options.num_cpus))
        pending = {}
        try:
            while todo or pending:
                while todo and len(pending) < window:
                    spec = todo.popleft()
                    pending[remote.remote(spec.to_dict(), self.options, threads)] = spec
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    yield _record(ray, ref, pending.pop(ref), self.ray_options.max_retries)
        except KeyboardInterrupt:
            todo.clear()            # stop dispatch; keep what already finished
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0) if pending else ([], [])
            for ref in ready:
                yield _record(ray, ref, pending.pop(ref), self.ray_options.max_retries)
            raise
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)


def _record(ray, ref, spec, retries: int):
    try:
        return RunRecord.from_dict(ray.get(ref))
    except ray.exceptions.RayTaskError as exc:   # the task raised (run_one itself never does)
        return lost_record(spec, f"ray task raised: {str(exc).strip().splitlines()[-1]}")
    except ray.exceptions.RayError as exc:       # worker crashed, node lost, object lost
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return lost_record(spec, f"worker lost after {retries} retries: {type(exc).__name__}: {first}")
