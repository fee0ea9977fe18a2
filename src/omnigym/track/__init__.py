"""Tracking: the run directory, metrics log, checkpoints, progress and plots."""
