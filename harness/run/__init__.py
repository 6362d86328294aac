"""Running one spec: data sets, task streams, backbones, regimes, the engine and what it measures."""
