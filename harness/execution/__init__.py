"""Execution: planning a grid, the records store, executors, the sweep driver, submissions."""
