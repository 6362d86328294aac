"""Built-in method adapters, one module per method family.

A module exposes either `ADAPTERS` (a tuple of MethodAdapter, for a family of methods) or
the submission form `NAME`, `DEFAULTS`, `build(ctx, **hparams)`.
"""
