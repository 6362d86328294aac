"""Every user error: bad input the CLI prints as one line (`cl-bench: error: ...`), with exit code 2.

Each wing raises the subclass that names its kind of input; a library caller catches
`UserError` for all of them. Anything else that escapes is a bug in cl-bench.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input from the user (a file, key, flag or value); never a bug in cl-bench."""


class UsageError(UserError):
    """A command line argparse rejects (unknown flag, bad value): one line, exit code 2."""


class ProtocolError(UserError, ValueError):
    """A protocol mistake: one line naming file, key, value and what is allowed."""


class PretrainError(UserError, ValueError):
    """A `pretrain:` mistake or an unusable pretrained backbone: one line saying what and why."""


class RegistryError(UserError, ValueError):
    """A method or plug-in module is unusable; the message names the file and the reason."""


class PluginError(RegistryError):
    """A plug-in is unusable or not registered; the message names the file and the reason."""


class DatasetError(UserError, ValueError):
    """A dataset cannot be loaded; the message says why and how to fix it."""


class DatasetMissing(DatasetError):
    """A data set's files are not there (a dry run plans without it); damaged or refused files are not this."""


class SweepError(UserError, RuntimeError):
    """The sweep cannot start or continue (locked or unwritable results folder, unknown run id, …)."""


class ExportError(UserError, ValueError):
    """Bad export input (no records, unknown format, unreachable experiment)."""


class CacheError(UserError):
    """The per-user cache (paths.cache_dir) cannot be written: one line naming its variable and the path."""


class OutputError(UserError, ValueError):
    """An output path cl-bench will not write: a symbolic link in it, a path leaving its folder, the
    results folder's record area, or a non-empty folder that is not a site's (without --force)."""


class DriverInterrupt(KeyboardInterrupt):
    """The sweep driver's own Ctrl-C or SIGTERM: a run lets it through, where a KeyboardInterrupt that a
    method raises is that run's failure (harness.run.engine)."""
