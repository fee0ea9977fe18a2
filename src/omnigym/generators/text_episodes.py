"""A ``TextEnv`` episode as a coroutine: the episode source the asynchronous scheduler runs.

What crosses it::

    source = TextEnvEpisodes(env, service, tokenizer, params, max_turns, max_episode_tokens)
    trajectories = await source.play(example, group_id)   # one episode: usually one Trajectory
    source.update_weights(named_tensors, version)          # through the service, between engine batches

Each turn awaits ``service.sample`` (``inference/service.py``: the engine's worker thread
batches whatever episodes are waiting at that moment), then runs the env's ``respond`` in a
thread (a tool may block: a sandboxed program, a search, a remote call), and a final reply
is scored the same way. So an episode that waits on a slow tool holds no one else up; the
batch-synchronous ``TextEnvGenerator`` (``text_env.py``) is the baseline this replaces when
``--rollouts async`` asks for it.

Every model call is a ``Turn`` (its prompt, its tokens, their log-probs, the policy version
that sampled them) and ``generators.turns.stitch`` joins them: the env's reply between two
turns is the chat template's rendering of it, appended with loss mask 0, and the next turn's
prompt is the sequence so far, so nothing is re-tokenized. ``info["versions"]`` carries each
response token's policy version (-1 on inserted tokens): an episode that ran across a weight
update says which of its tokens came from which policy.
"""

from __future__ import annotations

import asyncio
import copy

from omnigym.generators.base import Trajectory
from omnigym.generators.episode_rules import budget_cut, inserted_tokens, out_of_budget, render, with_overlong
from omnigym.generators.turns import Turn, stitch
from omnigym.inference.engine import SamplingParams
from omnigym.rewards import scored_with_notes


class TextEnvEpisodes:
    def __init__(self, env, service, tokenizer, params: SamplingParams, max_turns: int = 8,
                 max_episode_tokens: int | None = None, overlong_buffer: int = 0, owns_service: bool = False):
        """``env`` is copied for each episode; ``max_turns`` replies at most (then truncated, reward
        0); ``max_episode_tokens``: generated tokens of the whole episode at most (a reply is cut
        there; an episode that reaches it without a final reply is truncated, reward 0);
        ``overlong_buffer``: DAPO's soft overlong penalty (``rl/overlong.py``), as the
        batch-synchronous generator applies it; ``owns_service``: ``close`` closes ``service``."""
        self.env, self.service, self.tokenizer, self.params = env, service, tokenizer, params
        self.max_turns, self.max_episode_tokens, self.overlong_buffer = max_turns, max_episode_tokens, overlong_buffer
        self.owns_service = owns_service

    def update_weights(self, named_tensors, version: int) -> None:
        self.service.update_weights(named_tensors, version)

    def close(self) -> None:
        if self.owns_service:
            self.service.close()

    async def play(self, example: dict, group_id: int) -> list[Trajectory]:
        env = copy.copy(self.env)
        messages, _ = env.reset(options={"example": example})
        prompt = render(self.tokenizer, messages)
        tokens, turns = list(prompt), []
        info = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "truncated": False, "cut_off": False,
                "budget_cut": False, "reward_parts": {}}
        reward = 0.0
        for _ in range(self.max_turns):
            samples, version = await self.service.sample(tokens, self.params, 1)
            sample = samples[0]
            used = sum(len(t.completion_ids) for t in turns)
            left = None if self.max_episode_tokens is None else self.max_episode_tokens - used
            ids, logprobs, cut = budget_cut(sample.completion_ids, sample.logprobs, left)
            turns.append(Turn(list(tokens), list(ids), list(logprobs), version, sample.finished and not cut))
            tokens += ids
            info["turns"] += 1
            info["cut_off"] |= cut or not sample.finished
            if cut:  # the episode's token budget ends it mid-reply: the env never reads the fragment
                info["truncated"] = info["budget_cut"] = True
                break
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            messages, terminated, truncated, step_info = await asyncio.to_thread(env.respond, text)
            info["tool_calls"] += step_info.get("tool_calls", 0)
            info["tool_errors"] += step_info.get("tool_errors", 0)
            if terminated:
                totals, parts, notes = await asyncio.to_thread(scored_with_notes, env.reward, [text], [env.example])
                reward = float(totals[0])
                info["reward_parts"] = {name: float(values[0]) for name, values in parts.items()}
                info.update({name: values[0] for name, values in notes.items()})  # sandbox_blocked
                break
            if truncated:
                info["truncated"] = True
                break
            if out_of_budget(self.max_episode_tokens, used + len(ids)):
                info["truncated"] = info["budget_cut"] = True
                break
            tokens += inserted_tokens(self.tokenizer, messages, tokens)
        else:
            info["truncated"] = True  # out of turns
        generated = sum(len(t.completion_ids) for t in turns)
        reward, info["reward_parts"] = with_overlong(reward, info["reward_parts"], generated,
                                                     self.max_episode_tokens or self.params.max_new_tokens,
                                                     self.overlong_buffer)
        out = []
        for sequence in stitch(turns):
            generated = [v for v in sequence.versions if v >= 0]
            out.append(Trajectory(sequence.prompt_ids, sequence.response_ids, sequence.loss_mask, sequence.logprobs,
                                  reward, group_id, min(generated) if generated else self.service.version,
                                  env.example, {**info, "versions": sequence.versions}))
        return out

