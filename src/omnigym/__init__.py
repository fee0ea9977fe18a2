"""omnigym: reinforcement learning in every action space with one API."""

from omnigym.errors import OmnigymError

__version__ = "0.1.0"
__all__ = ["OmnigymError", "make_vec", "__version__"]


def __getattr__(name):
    # Lazy so that `import omnigym` stays cheap (the CLI's start-up time is benchmarked).
    if name == "make_vec":
        from omnigym.envs.vector import make_vec

        return make_vec
    raise AttributeError(name)
