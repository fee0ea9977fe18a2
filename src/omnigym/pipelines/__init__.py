"""Pipelines that chain whole runs (the offline RLHF demo)."""
