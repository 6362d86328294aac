"""The toolkit a method, backbone, data set or regime-family file may import.

- `contract`: the adapter, the context `build(ctx, **hparams)` receives, the strategy hooks;
- `registry` / `index`: how methods and plug-in files are found (built-ins, files, entry points)
  and how methods are listed;
- `plugins`: the typed declarations of backbones, data sets and regime families, and their table;
- `subspace`: effective weights of the shared blocks under every regime family.
"""
