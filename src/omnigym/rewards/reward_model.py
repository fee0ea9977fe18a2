"""A trained reward model as a reward like any other: ``--rewards rm:RUN_DIR:1.0``.

``RewardModelScorer`` renders each (prompt, completion) the way the reward model was trained
(a conversation through its own chat template, or prompt + completion as plain text), with
its own tokenizer, so a policy with another tokenizer can be scored. A batch is scored in
forward passes of ``batch_size`` rows. The folder is checked when the reward is named (a
folder that is not a reward model is one line before anything starts); the weights load on
the first call. Pickling sends the folder, not the weights.
"""

from __future__ import annotations

from typing import Sequence

import torch

from omnigym.errors import OmnigymError
from omnigym.models.scalar_head import pair_scores, read_reward_info, reward_model_folder
from omnigym.rewards.base import Reward

PREFIX = "rm:"


def prompt_of(example: dict):
    """The prompt of an example: its ``prompt`` (text or messages) or its ``question``."""
    prompt = example.get("prompt", example.get("question"))
    if prompt is None:
        raise OmnigymError("a reward model scores a prompt and its completion; the example has neither 'prompt' "
                           "nor 'question'")
    return prompt


class RewardModelScorer(Reward):
    PREFIX = PREFIX
    """what names it in --rewards (a process reward model's scorer, rewards/process.py, is ``prm:``)"""

    def __init__(self, given: str, device: str = "cpu", batch_size: int = 32):
        self.label = self.PREFIX + given
        self.folder = reward_model_folder(given, self.PREFIX)
        self.info = read_reward_info(self.folder)
        self.device, self.batch_size = device, batch_size
        self._model = self._tokenizer = None

    def __getstate__(self):
        return {**self.__dict__, "_model": None, "_tokenizer": None}

    def to(self, device: str) -> "RewardModelScorer":
        """Score on ``device`` (the weights load there on the first call)."""
        self.device = device
        if self._model is not None:
            self._model.to(device)
        return self

    def load(self) -> "RewardModelScorer":
        """The weights read now rather than at the first call (a server loads before it listens)."""
        self._load()
        return self

    def _load(self):
        if self._model is None:
            from omnigym.models.lm import load_tokenizer
            from omnigym.models.scalar_head import load_scalar_model

            self._tokenizer = load_tokenizer(str(self.folder), need_chat_template=False)
            self._model = load_scalar_model(str(self.folder), self._tokenizer.pad_token_id, device=self.device).eval()
            self._model.requires_grad_(False)
        return self._model, self._tokenizer

    def rendered(self, completions: Sequence[str], examples: Sequence[dict]) -> tuple[list, list]:
        """(prompt tokens, reply tokens + EOS) as the reward model was trained on them, cut to its
        max length (the prompt's beginning goes first, then the reply's end). An empty reply
        is scored too (its end token alone)."""
        from omnigym.tasks.sft_data import prompt_tokens

        _, tokenizer = self._load()
        limit = self.info.get("max_length")
        prompts, replies = [], []
        for i, (completion, example) in enumerate(zip(completions, examples)):
            prompt = prompt_of(example)
            if isinstance(prompt, str) and self.info.get("conversational"):
                prompt = [{"role": "user", "content": prompt}]
            ids = prompt_tokens(f"completion {i}", prompt, tokenizer)
            reply = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            if limit and len(ids) + len(reply) > limit:
                ids = ids[-max(2, limit - len(reply)):]
                reply = reply[:max(1, limit - len(ids))]
            prompts.append(ids)
            replies.append(reply)
        return prompts, replies

    @torch.no_grad()
    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        if len(completions) != len(examples):
            raise OmnigymError(f"{len(completions)} completions but {len(examples)} examples")
        model, tokenizer = self._load()
        prompts, replies = self.rendered(completions, examples)
        scores = [pair_scores(model, prompts[i:i + self.batch_size], replies[i:i + self.batch_size],
                              tokenizer.pad_token_id, self.device) for i in range(0, len(replies), self.batch_size)]
        return torch.cat(scores).double().cpu() if scores else torch.zeros(0, dtype=torch.float64)
