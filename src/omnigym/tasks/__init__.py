"""Prompt sources: procedural tasks that need no download, and dataset loaders; ``Task``, the
training and held-out examples a run gets (each a dict with at least ``question`` and ``answer``).

``--task`` itself is resolved by ``omnigym.envs.task_spec.load_task``: several of its forms come
with the text env they are played in, and envs sit above tasks in the layers
(docs/architecture.md). It tries, in this order:

1. ``arithmetic`` and ``chain`` (built in, procedural; ``chain`` is worked one checkable step a
   line: ``omnigym.tasks.steps``), ``reasoning_gym:<task>``, ``gsm8k:<file.jsonl>``,
   ``humaneval:<file.jsonl[.gz]>`` (scored by the ``code`` reward: its tests, in the sandbox),
   ``ifeval`` (procedural IFEval-style instructions, ``omnigym.tasks.instructions``, scored by
   the ``ifeval`` reward);
2. a registered text env id (``arithmetic-tools-v0``): its examples, and the env itself
   (its class and reward) to train in;
3. a ``.jsonl`` file with ``question`` and ``answer`` fields;
4. ``module:name`` from your own code: a text env id the module registers, or a function
   that returns a list of examples or a ``TextEnv``;
5. a Hugging Face dataset id, when the dataset is available offline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Task:
    train: list[dict]
    heldout: list[dict]
    env: object | None = None
    """the text env the task comes with (a registered env), else None: the trainer builds one"""
