"""The toolkit a method, backbone, data set or regime-family file may import.

- `contract`: the adapter, the context `build(ctx, **hparams)` receives, the strategy hooks;
- `registry` / `index`: how methods are found (built-ins, files, entry points) and listed;
- `subspace`: effective weights of the shared blocks under every regime family.
"""
