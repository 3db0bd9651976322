"""Graph datasets (ViTs-1K, GPTs-1K, ...) stored as Parquet; arrives with issue #3."""
