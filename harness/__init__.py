"""cl-bench: continual-learning benchmarks under controlled fine-tuning regimes (depth, bitfit, norm, LoRA)."""
__version__ = "0.1.0"
