"""Agents written against the OpenAI API, trained unchanged (``--agent MODULE:FUNCTION``).

- ``server.py``: the OpenAI-compatible endpoint the run serves from its own engine (loopback,
  a per-run bearer token, one base URL per episode), recording every request as sampled;
- ``recorder.py``: an episode's recorded turns, and the Trajectories they make;
- ``episodes.py``: the user's ``async def run(client, example)`` loaded and checked, its
  episodes played (``play``) with a timeout and their errors contained, and a Generator;
- ``chat.py``: chat-template rendering with tools, tool calls parsed, OpenAI's reply shape;
- ``config.py``: the ``--agent`` flags.

Nothing here is imported by ``import omnigym``: FastAPI, uvicorn and openai come with the ``[agents]``
extra and are imported when an agent run starts.
"""
