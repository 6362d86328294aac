"""The one user-error type: bad input the CLI prints as one line, with exit code 2."""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a file, key, flag or value); never a bug in cl-bench."""
