"""Training backends: where the forward/backward pass and the optimizer step run (``base.py``)."""
