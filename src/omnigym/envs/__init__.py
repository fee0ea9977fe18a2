from omnigym.envs.vector import BACKENDS, available_backends, make_vec
from omnigym.envs.text import register_text_env
# The tool envs live in modules of their own (each subclasses envs/text.py's ToolEnv, so text.py
# cannot import them); they are registered here, which every import of omnigym.envs.* runs first.
from omnigym.envs.guess_env import guess_env
from omnigym.envs.python_env import python_env
from omnigym.envs.search_env import search_env
from omnigym.envs.text_games import tictactoe_env

register_text_env("python-v0", python_env)
register_text_env("search-v0", search_env)
register_text_env("guess-v0", guess_env)
register_text_env("tictactoe-v0", tictactoe_env)

__all__ = ["BACKENDS", "available_backends", "make_vec"]

from omnigym.envs.locomotion import register as register_locomotion

register_locomotion()  # omnigym/Go2-Velocity-Flat-v0, omnigym/Go2-Velocity-Rough-v0 (docs/robots.md)

from omnigym.envs.memory import register as register_memory

register_memory()  # omnigym/CartPoleNoVel-v1: CartPole without its velocities, for policies with memory (docs/recurrent.md)
