"""A pre-imported parent that forks `cl-bench` sweeps on request (the kill tests' process factory).

Starting a fresh interpreter costs seconds (torch, avalanche); forking this one costs
milliseconds, so a kill test can afford many kills. Protocol: one JSON object per line on
stdin, one JSON reply per line on stdout:
  {"op": "fork", "argv": [...], "log": PATH, "marker": PATH|null, "write_delay": S}
      -> {"pid": PID}   the child is a session leader (its own process group) and runs
         harness.cli.main(argv); with a marker, every record fsync first appends a line to
         the marker file and sleeps write_delay seconds (a window to kill it mid-write)
  {"op": "wait", "pid": PID} -> {"code": exit code or -signal}   (reaps the child)
"""
from __future__ import annotations

import json
import os
import sys
import time


def _child(request: dict) -> None:
    os.setsid()
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if request.get("marker"):
        real_fsync, marker, delay = os.fsync, request["marker"], float(request["write_delay"])

        def slow_fsync(fileno):
            with open(marker, "a") as fh:
                fh.write(f"{time.monotonic()}\n")
            time.sleep(delay)
            real_fsync(fileno)

        os.fsync = slow_fsync
    from harness.cli import main

    try:
        code = main(request["argv"])
    except BaseException:  # pragma: no cover - shown in the log
        import traceback

        traceback.print_exc()
        code = 99
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def serve() -> None:
    """Import everything a sweep needs once, then answer requests until stdin closes."""
    import harness.cli  # noqa: F401
    import harness.cli.commands  # noqa: F401
    import harness.execution.sweep  # noqa: F401
    import harness.run.engine  # noqa: F401
    import harness.service  # noqa: F401
    from harness.api.registry import get_registry
    from harness.run.datasets import load_dataset

    load_dataset("digits")
    get_registry()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "fork":
            pid = os.fork()
            if pid == 0:
                _child(request)
            reply = {"pid": pid}
        else:
            _, status = os.waitpid(request["pid"], 0)
            reply = {"code": os.waitstatus_to_exitcode(status)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
