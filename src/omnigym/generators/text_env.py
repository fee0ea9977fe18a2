"""Episodes of a ``TextEnv`` played by an inference engine, many at a time.

Every episode starts from ``env.reset(options={"example": ...})``. Each turn, the engine
samples a reply for every episode still running, in one batched call (the first turn
samples ``group_size`` replies of each distinct prompt, reading each prompt once); each
env answers with ``respond``; the final replies of the turn are scored together by the
env's batched reward. What an env adds between turns is rendered by the chat template and
appended with loss mask 0, so single-turn tasks and multi-turn tool envs train through
the same code.
"""

from __future__ import annotations

import copy

from omnigym.generators.base import Trajectories, Trajectory
from omnigym.inference.engine import SamplingParams
from omnigym.rewards import scored_with_parts


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class _Episode:
    def __init__(self, env, prompt: list[int], group_id: int):
        self.env, self.prompt, self.group_id = env, prompt, group_id
        self.response: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.turns, self.truncated, self.done, self.cut_off = 0, False, False, False
        self.reward, self.parts = 0.0, {}

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response


class TextEnvGenerator:
    def __init__(self, env, engine, tokenizer, params: SamplingParams, max_turns: int = 8):
        """``env`` is copied for each episode; ``max_turns`` caps an env that never ends (the
        episode is then truncated with reward 0)."""
        self.env, self.engine, self.tokenizer, self.params, self.max_turns = env, engine, tokenizer, params, max_turns

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def generate(self, examples: list[dict], group_size: int) -> Trajectories:
        episodes = []
        for group_id, example in enumerate(examples):
            for _ in range(group_size):
                env = copy.copy(self.env)
                messages, _ = env.reset(options={"example": example})
                episodes.append(_Episode(env, render(self.tokenizer, messages), group_id))
        version = self.engine.version
        running = episodes
        for turn in range(self.max_turns):
            if turn == 0:
                prompts = [episodes[g * group_size].prompt for g in range(len(examples))]
                samples = [s for group in self.engine.generate(prompts, group_size, self.params) for s in group]
            else:
                samples = [group[0] for group in self.engine.generate([e.tokens for e in running], 1, self.params)]
            finished, texts = [], []
            for episode, sample in zip(running, samples):
                episode.response += sample.completion_ids
                episode.mask += [1] * len(sample.completion_ids)
                episode.logprobs += sample.logprobs
                episode.turns += 1
                episode.cut_off |= not sample.finished  # stopped by max_new_tokens, not by the model
                text = self.tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
                messages, terminated, truncated, _ = episode.env.respond(text)
                if terminated:
                    finished.append(episode)
                    texts.append(text)
                elif truncated:
                    episode.done = episode.truncated = True
                else:
                    self._append_env_turn(episode, messages)
            self._score(finished, texts)
            running = [e for e in running if not e.done]
            if not running:
                break
        for episode in running:  # out of turns
            episode.truncated = True
        return Trajectories([Trajectory(e.prompt, e.response, e.mask, e.logprobs, e.reward, e.group_id, version,
                                        e.env.example, {"reward_parts": e.parts, "turns": e.turns,
                                                        "truncated": e.truncated, "cut_off": e.cut_off})
                             for e in episodes])

    def _append_env_turn(self, episode: _Episode, messages: list[dict]) -> None:
        """The env's reply, rendered by the chat template, continues the sequence."""
        full = render(self.tokenizer, messages)
        tokens = episode.tokens
        inserted = full[len(tokens):] if full[:len(tokens)] == tokens else \
            render(self.tokenizer, messages[-1:], add_generation_prompt=True)
        episode.response += inserted
        episode.mask += [0] * len(inserted)
        episode.logprobs += [0.0] * len(inserted)

    def _score(self, finished: list[_Episode], texts: list[str]) -> None:
        if not finished:
            return
        totals, parts = scored_with_parts(self.env.reward, texts, [e.env.example for e in finished])
        totals, parts = totals.tolist(), {name: values.tolist() for name, values in parts.items()}
        for i, episode in enumerate(finished):
            episode.done = True
            episode.reward = totals[i]
            episode.parts = {name: values[i] for name, values in parts.items()}
