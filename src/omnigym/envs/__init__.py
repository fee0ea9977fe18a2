from omnigym.envs.vector import BACKENDS, available_backends, make_vec

__all__ = ["BACKENDS", "available_backends", "make_vec"]
