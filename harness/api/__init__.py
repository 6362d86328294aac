"""The toolkit a method, backbone, data set or regime-family file may import.

- `contract`: the adapter, the context `build(ctx, **hparams)` receives, the strategy hooks;
- `registry` / `index`: how methods and plug-in files are found (built-ins, files, entry points)
  and how methods are listed;
- `plugins`: the typed declarations of backbones, data sets and regime families, and their table;
- `subspace`: effective weights of the shared blocks under every regime family;
- `DatasetMissing`: what a data-set plug-in's `load` raises when its files are not there (a
  `--dry-run` plans without that data set; any other error is one, even in a dry run).
"""
from ..config.errors import DatasetMissing

__all__ = ["DatasetMissing"]
