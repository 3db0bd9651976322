"""Graph datasets stored as Parquet in the Hugging Face layout.

``store`` holds the schema and the lossless graph <-> row conversion with atomic shard writes;
generation from recipes and the browsing API build on it (issue #3).
"""
