"""Excerpts of methods' official code, kept as published (see README.md), for cross-checks on identical tensors."""
