"""cl-bench: continual-learning benchmarks under controlled fine-tuning regimes (depth, bitfit, norm, LoRA, prompts)."""
__version__ = "0.1.0"
