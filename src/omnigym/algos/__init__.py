"""The algorithms, one file each: ``control/`` for gymnasium envs, ``lm/`` for language models.

``ALGORITHMS`` maps a CLI name to its module. A module has one config dataclass (its
``CONFIG``), a ``train(cfg)`` and, where ``omnigym eval`` can replay it, ``load_policy``.
No algorithm imports another; what they share lives in the seams (rl/, envs/, track/, ...).
"""

from __future__ import annotations

import dataclasses
import importlib

from omnigym.errors import OmnigymError

ALGORITHMS = {
    "reinforce": "omnigym.algos.control.reinforce",
    "ppo": "omnigym.algos.control.ppo",
    "dqn": "omnigym.algos.control.dqn",
    "sac": "omnigym.algos.control.sac",
    "td3": "omnigym.algos.control.td3",
    "drq": "omnigym.algos.control.drq",
    "ppo_lstm": "omnigym.algos.control.ppo_lstm",
    "bc": "omnigym.algos.control.bc",
    "td3_bc": "omnigym.algos.control.td3_bc",
    "iql": "omnigym.algos.control.iql",
    "cql": "omnigym.algos.control.cql",
    "mappo": "omnigym.algos.control.mappo",
    "alphazero": "omnigym.algos.control.alphazero",
    "grpo": "omnigym.algos.lm.grpo",
    "text_reinforce": "omnigym.algos.lm.text_reinforce",
    "sft": "omnigym.algos.lm.sft",
    "rm": "omnigym.algos.lm.rm",
    "dpo": "omnigym.algos.lm.dpo",
    "online_dpo": "omnigym.algos.lm.online_dpo",
    "rlhf": "omnigym.algos.lm.rlhf",
    "prm": "omnigym.algos.lm.prm",
    "distill": "omnigym.algos.lm.distill",
}


def get_algorithm(name: str):
    if name not in ALGORITHMS:
        raise OmnigymError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}")
    return importlib.import_module(ALGORITHMS[name])


def config_class(module) -> type:
    return module.CONFIG


def check_foreign_settings(algo: str, unknown: dict, source: str) -> None:
    """A saved config.json's keys that ``algo`` does not know but another algorithm does were
    edited in or copied from another run: refused in one line. Keys no algorithm knows here
    are a newer version's, and are kept (``track/run.py``)."""
    for key in unknown:
        owners = [name for name in ALGORITHMS if name != algo
                  and key in {f.name for f in dataclasses.fields(config_class(get_algorithm(name)))}]
        if owners:
            raise OmnigymError(f"{source}: {key!r} is a setting of {', '.join(owners)}, not of {algo}; remove it "
                               "from the file (or check its 'algo')")


def __getattr__(name: str):
    # ``from omnigym.algos import ppo`` imports the algorithm's module on demand.
    if name in ALGORITHMS:
        return importlib.import_module(ALGORITHMS[name])
    raise AttributeError(name)
