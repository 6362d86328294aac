"""The driver's own interrupts: Ctrl-C and SIGTERM stop whatever runs `run_one` here (a sweep, `reproduce`,
`check`), where an exit or interrupt that a method raises only fails its run (harness.run.engine).

While `signals_interrupt()` is active the first SIGINT or SIGTERM raises DriverInterrupt (a
KeyboardInterrupt naming the signal), which the engine lets through. A method that swallows it
cannot keep the process going: the second signal stops the process at once, by the signal's
default action (the results lock it leaves is stale and the next sweep takes it over).
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

from ..config.errors import DriverInterrupt


class Stop:
    """Which signal interrupted the driver (None: none, or a KeyboardInterrupt no signal raised)."""

    signal: str | None = None


@contextmanager
def signals_interrupt():
    """While active (main thread only: handlers can be set nowhere else), SIGTERM and Ctrl-C raise
    DriverInterrupt; a second one ends the process. Yields the `Stop` that names the signal."""
    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.signal is not None:  # the first was swallowed (or the clean-up after it hangs): stop now
            _end_process(signum)
        stop.signal = signal.Signals(signum).name
        raise DriverInterrupt(stop.signal)

    caller = signal.getsignal(signal.SIGINT)

    def noted(signum, frame):  # a caller's own SIGINT handler decides; if it interrupts, so does the driver
        try:
            return caller(signum, frame)
        except KeyboardInterrupt:
            stop.signal = stop.signal or signal.Signals(signum).name
            raise

    handlers = {signal.SIGTERM: handler}
    if caller is signal.default_int_handler:
        handlers[signal.SIGINT] = handler
    elif callable(caller):
        handlers[signal.SIGINT] = noted
    previous = {sig: signal.signal(sig, new) for sig, new in handlers.items()}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _end_process(signum: int) -> None:
    """End this process by `signum`'s default action (its exit status says which signal), now."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the signal is delivered before kill() returns
