"""Generators: prompts (or env states) in, scored trajectories out (``base.py``)."""
