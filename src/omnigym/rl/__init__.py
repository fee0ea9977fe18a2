"""The RL core shared by control and language: advantages, losses, buffers, statistics."""
