"""Prompt sources: procedural tasks that need no download, and dataset loaders."""
