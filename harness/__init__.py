"""cl-bench: continual-learning benchmarks under controlled fine-tuning depth regimes."""
__version__ = "0.1.0"
