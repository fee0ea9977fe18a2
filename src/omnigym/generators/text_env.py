"""Episodes of a ``TextEnv`` played by an inference engine, many at a time.

Every episode starts from ``env.reset(options={"example": ...})``. Each turn, the engine
samples a reply for every episode still running, in one batched call (the first turn
samples ``group_size`` replies of each distinct prompt, reading each prompt once); each
env answers with ``respond``; the final replies of the turn are scored together by the
env's batched reward. The envs of one turn answer at the same time, each in a thread (a tool
may block on a sandboxed program or a search), so a turn waits for the slowest reply, not for
their sum: the batch-synchronous baseline, ``--rollouts sync``. What an env adds between
turns is rendered by the chat template and appended with loss mask 0, so single-turn tasks
and multi-turn tool envs train through the same code.

Scoring can overlap generation (``overlap_scoring`` K > 1, ``--overlap-scoring``): the prompts
are played in K consecutive parts, and the replies a part finishes are scored in a thread
while the next part generates (a reward model, a served one over HTTP, a sandbox: a verl user
measured the reward stage at 140 s of a 180 s rollout). Scoring draws no random numbers, so
the rollouts are those of playing the K parts one after another, whether the scores arrive
early or late.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor

from omnigym.generators.base import Trajectories, Trajectory
from omnigym.generators.episode_rules import budget_cut, inserted_tokens, out_of_budget, render, with_overlong
from omnigym.generators.text_episodes import TextEnvEpisodes
from omnigym.inference import engine_on_own_copy
from omnigym.inference.engine import SamplingParams
from omnigym.inference.service import EngineService
from omnigym.rewards import scored_with_notes

__all__ = ["TextEnvGenerator", "render"]


class _Episode:
    def __init__(self, env, prompt: list[int], group_id: int):
        self.env, self.prompt, self.group_id = env, prompt, group_id
        self.response: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.turns, self.truncated, self.done, self.cut_off = 0, False, False, False
        self.tool_calls = self.tool_errors = 0
        self.budget_cut = False
        self.reward, self.parts = 0.0, {}
        self.notes: dict[str, float] = {}
        """what the reward observed beside its score (``sandbox_blocked``), into the info"""

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response


class TextEnvGenerator:
    def __init__(self, env, engine, tokenizer, params: SamplingParams, max_turns: int = 8,
                 max_episode_tokens: int | None = None, overlong_buffer: int = 0, overlap_scoring: int = 1):
        """``env`` is copied for each episode; ``max_turns`` caps an env that never ends (the
        episode is then truncated with reward 0); ``max_episode_tokens`` caps the tokens an
        episode generates (a reply is cut there; no final reply by then: truncated, reward 0);
        ``overlong_buffer``: DAPO's soft overlong penalty over that many tokens before the limit
        (``max_episode_tokens``, else ``params.max_new_tokens``; ``rl/overlong.py``);
        ``overlap_scoring``: parts a batch is played in, each scored while the next generates."""
        self.env, self.engine, self.tokenizer, self.params, self.max_turns = env, engine, tokenizer, params, max_turns
        self.max_episode_tokens, self.overlong_buffer = max_episode_tokens, overlong_buffer
        self.overlap_scoring = overlap_scoring

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def episode_source(self) -> TextEnvEpisodes:
        """The same episodes (env, budgets, penalty) as coroutines that run independently
        (``--rollouts async``), sampled through an ``EngineService`` on an engine with its own
        copy of the policy, so that sampling can go on while the trainer changes the original;
        closing the source closes that service."""
        return TextEnvEpisodes(self.env, EngineService(engine_on_own_copy(self.engine)), self.tokenizer, self.params,
                               self.max_turns, self.max_episode_tokens, self.overlong_buffer, owns_service=True)

    def generate(self, examples: list[dict], group_size: int) -> Trajectories:
        version = self.engine.version
        parts = min(self.overlap_scoring, len(examples))
        bounds = [len(examples) * i // parts for i in range(parts + 1)]
        episodes, pending = [], []
        # one scoring thread: the parts' scores are computed in the order they were played
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnigym-scoring") as scoring:
            submit = scoring.submit if parts > 1 else _now
            for start, end in zip(bounds, bounds[1:]):
                played, scores = self._play(examples[start:end], group_size, start, submit)
                episodes += played
                pending += scores
            for future, finished in pending:
                self._take_scores(finished, *future.result())
        for episode in episodes:
            episode.reward, episode.parts = with_overlong(episode.reward, episode.parts, sum(episode.mask),
                                                          self.max_episode_tokens or self.params.max_new_tokens,
                                                          self.overlong_buffer)
        return Trajectories([Trajectory(e.prompt, e.response, e.mask, e.logprobs, e.reward, e.group_id, version,
                                        e.env.example, {"reward_parts": e.parts, "turns": e.turns,
                                                        "truncated": e.truncated, "cut_off": e.cut_off,
                                                        "tool_calls": e.tool_calls, "tool_errors": e.tool_errors,
                                                        "budget_cut": e.budget_cut, **e.notes,
                                                        "versions": [version if m else -1 for m in e.mask]})
                             for e in episodes])

    def _play(self, examples: list[dict], group_size: int, first_group: int, submit) -> tuple[list, list]:
        """Every episode of ``examples`` played to its end; the scoring of the replies that end
        them handed to ``submit`` (a thread's, or ``_now``): (episodes, [(future, episodes)])."""
        episodes, pending = [], []
        for group_id, example in enumerate(examples, first_group):
            for _ in range(group_size):
                env = copy.copy(self.env)
                messages, _ = env.reset(options={"example": example})
                episodes.append(_Episode(env, render(self.tokenizer, messages), group_id))
        running = episodes
        for turn in range(self.max_turns):
            if turn == 0:
                prompts = [episodes[g * group_size].prompt for g in range(len(examples))]
                samples = [s for group in self.engine.generate(prompts, group_size, self.params) for s in group]
            else:
                samples = [group[0] for group in self.engine.generate([e.tokens for e in running], 1, self.params)]
            finished, texts, replies, answering = [], [], [], []
            for episode, sample in zip(running, samples):
                left = None if self.max_episode_tokens is None else self.max_episode_tokens - sum(episode.mask)
                ids, logprobs, cut = budget_cut(sample.completion_ids, sample.logprobs, left)
                episode.response += ids
                episode.mask += [1] * len(ids)
                episode.logprobs += logprobs
                episode.turns += 1
                episode.cut_off |= cut or not sample.finished  # stopped by max_new_tokens or the budget
                if cut:
                    episode.done = episode.truncated = episode.budget_cut = True
                else:
                    answering.append(episode)
                    replies.append(self.tokenizer.decode(ids, skip_special_tokens=True))
            with ThreadPoolExecutor(max_workers=max(1, min(32, len(answering)))) as pool:
                answers = list(pool.map(lambda e, text: e.env.respond(text), answering, replies))
            for episode, text, (messages, terminated, truncated, info) in zip(answering, replies, answers):
                episode.tool_calls += info.get("tool_calls", 0)
                episode.tool_errors += info.get("tool_errors", 0)
                if terminated:
                    finished.append(episode)
                    texts.append(text)
                elif truncated:
                    episode.done = episode.truncated = True
                elif out_of_budget(self.max_episode_tokens, sum(episode.mask)):
                    episode.done = episode.truncated = episode.budget_cut = True
                else:
                    self._append_env_turn(episode, messages)
            if finished:  # they are done now; their rewards arrive with the future
                for episode in finished:
                    episode.done = True
                pending.append((submit(scored_with_notes, self.env.reward, texts, [e.env.example for e in finished]),
                                finished))
            running = [e for e in running if not e.done]
            if not running:
                break
        for episode in running:  # out of turns
            episode.truncated = True
        return episodes, pending

    def _append_env_turn(self, episode: _Episode, messages: list[dict]) -> None:
        """The env's reply, rendered by the chat template, continues the sequence."""
        inserted = inserted_tokens(self.tokenizer, messages, episode.tokens)
        episode.response += inserted
        episode.mask += [0] * len(inserted)
        episode.logprobs += [0.0] * len(inserted)

    @staticmethod
    def _take_scores(finished: list[_Episode], totals, parts: dict, notes: dict) -> None:
        totals, parts = totals.tolist(), {name: values.tolist() for name, values in parts.items()}
        for i, episode in enumerate(finished):
            episode.reward = totals[i]
            episode.parts = {name: values[i] for name, values in parts.items()}
            episode.notes = {name: values[i] for name, values in notes.items()}


def _now(function, *args) -> Future:
    """``function(*args)`` run at once, as a finished future (no overlap: the same code path)."""
    future: Future = Future()
    try:
        future.set_result(function(*args))
    except Exception as error:  # raised where a thread's would be: at ``result()``
        future.set_exception(error)
    return future
