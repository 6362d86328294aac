"""Configuration: the vocabulary, protocol loading and validation, frozen specs (torch-free)."""
