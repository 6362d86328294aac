"""Outputs: MLflow tracking, exports (CSV/Parquet) and the static leaderboard site."""
