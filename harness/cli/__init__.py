"""The `cl-bench` command line: parser -> typed request -> one service call (harness.service) -> print.

Importing this package imports argparse, the torch-free vocabulary and the defaults table
only, so `--help` starts fast; the commands and services are imported after parsing. Every
user error is a `UserError` (config/errors.py), printed as one line with exit code 2.
"""
from __future__ import annotations

import sys

from ..config.errors import UsageError, UserError
from .parser import build_parser

EXIT_USAGE = 2
__all__ = ["main", "build_parser", "one_line", "UsageError", "EXIT_USAGE"]


def main(argv=None) -> int:
    """Entry point of the `cl-bench` console script."""
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help()
            return 0
        from .commands import COMMANDS
        from .requests import request_from_args

        _no_final_collection()
        return COMMANDS[args.command](request_from_args(args))
    except UsageError as exc:
        print(one_line(str(exc)), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM outside a sweep (which returns its own exit code)
        return _interrupted(str(exc))
    except BrokenPipeError:  # `cl-bench list | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        message = _user_error_message(exc)
        if message is None:
            raise
        print(f"cl-bench: error: {one_line(message)}", file=sys.stderr)
        return EXIT_USAGE


_FREEZE_AT_EXIT: list = []


def _no_final_collection() -> None:
    """At exit, skip the interpreter's last garbage collections over everything a command loaded
    (torch, Avalanche: ~0.8 s of shutdown per process, benchmarks/small_grid.py): `gc.freeze()` as
    an exit handler. The other exit handlers still run, and every object still finalises when its
    last reference goes; only garbage in reference cycles is left to the OS (as at os._exit)."""
    if not _FREEZE_AT_EXIT:
        import atexit
        import gc

        _FREEZE_AT_EXIT.append(atexit.register(gc.freeze))


def _interrupted(name: str) -> int:
    """One line, and 128 + the signal's number (130 for Ctrl-C), as a stopped sweep exits."""
    import signal

    sig = signal.SIGTERM if name == "SIGTERM" else signal.SIGINT  # DriverInterrupt names its signal
    print(f"cl-bench: interrupted ({sig.name})", file=sys.stderr)
    return 128 + sig.value


def one_line(text: str) -> str:
    """The message with control, bidi/format characters and line separators escaped: one terminal line."""
    from ..config.text import terminal_safe

    return terminal_safe(text)


def _user_error_message(exc: Exception) -> str | None:
    """One-line message for errors caused by the user's input; None for bugs."""
    if isinstance(exc, UserError):
        return str(exc) or type(exc).__name__  # main() escapes any line break in it
    if isinstance(exc, OSError) and exc.filename is not None:  # a path given by the user is unusable
        name = str(exc.filename)
        return f"{name if len(name) <= 120 else name[:117] + '...'}: {exc.strerror or exc}"
    return None
