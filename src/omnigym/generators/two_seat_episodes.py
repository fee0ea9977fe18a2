"""Self-play: one game, both seats played by the policy, each seat's turns its own trajectory.

What crosses it::

    source = TwoSeatEpisodes(env, service, tokenizer, params)
    trajectories = await source.play(example, group_id)   # one game: [seat 0's, seat 1's]
    TwoSeatGenerator(env, engine, tokenizer, params).generate(examples, group_size)  # the generator seam

``env`` is a text game env (``envs/text_games.py``): it lends the rules and the words
(``new_game``, ``opening``, ``move``, ``report``) and plays no seat itself. Each seat has its
own conversation: its opening (its mark and the board), then its replies, and between them
what the env tells it of the other seat's move. The other seat's tokens never appear in a
seat's sequence: a move reaches it as the env's text, rendered by the chat template and
appended with loss mask 0 (``episode_rules.inserted_tokens``), as a tool's output is in
``text_episodes.py``. Each seat's model calls are ``Turn``s joined by ``stitch``, so the
trainer sees exactly the tokens the engine saw.

Both trajectories of a game share its outcome, each from its own seat's view (win 1, draw
0.5, loss 0). A reply that is not exactly one legal move loses the game for its seat.

``TwoSeatGenerator.generate`` plays a step's games batch-synchronously: every game's
coroutine runs until it waits for a sample, then one engine call answers all of them
(``LockstepService``), so a seeded run samples the same batches every time.
``examples`` are played ``group_size`` times each; seat ``s`` of example ``g``'s games is
group ``2 g + s``: a seat is compared with the same seat, since moving first is worth more.

Against a frozen snapshot (``opponent``, an engine on a frozen copy of the policy: ``Snapshot``),
the other seat of example ``g``'s games, ``1 - example["seat"]``, is sampled from that engine in
the same lockstep, and only the learner's seat's trajectories are returned (group ``g``): the
snapshot's tokens are never trained. Its moves reach the learner as the env's text, as in
self-play. A snapshot's reply that is not a legal move is replaced by a random free cell
(seeded by the game), as a masked opponent only plays legal moves: the learner is not paid for
the snapshot's errors, and always gets to move (a learner at O facing an X that erred on move
one would otherwise have no turn, and a step of such games nothing to train). The learner's
trajectories count the snapshot's moves and the replaced ones (``info["opponent_moves"]``,
``info["opponent_moves_replaced"]``).
"""

from __future__ import annotations

import asyncio
import random

from omnigym.errors import OmnigymError
from omnigym.generators.base import Trajectories, Trajectory
from omnigym.generators.episode_rules import inserted_tokens, render
from omnigym.generators.turns import Turn, stitch
from omnigym.inference.engine import SamplingParams


def check_two_seats(env) -> None:
    seats = getattr(env, "seats", None)
    if seats != 2:
        raise OmnigymError(f"self-play plays games of two seats; {type(env).__name__} has {seats}")


class TwoSeatEpisodes:
    """``against_opponent``: False in self-play (both seats the policy, both returned); True: the
    seat ``example["seat"]`` does not give the learner is sampled from the service's opponent
    engine, and only the learner's seat is returned."""

    def __init__(self, env, service, tokenizer, params: SamplingParams, against_opponent: bool = False):
        check_two_seats(env)
        self.env, self.service, self.tokenizer, self.params = env, service, tokenizer, params
        self.against_opponent = against_opponent

    def update_weights(self, named_tensors, version: int) -> None:
        self.service.update_weights(named_tensors, version)

    def _conversation(self, seat: int, game, last: int | None) -> tuple[list[dict], list[int]]:
        system = [{"role": "system", "content": self.env.system_prompt}] if self.env.system_prompt else []
        messages = system + [{"role": "user", "content": self.env.opening(seat, game, last)}]
        return messages, render(self.tokenizer, messages)

    async def play(self, example: dict, group_id: int) -> list[Trajectory]:
        """One game from the start; returns seat 0's trajectory, then seat 1's (against an
        opponent: the learner's seat's only)."""
        frozen = 1 - example["seat"] if self.against_opponent else None
        game = self.env.new_game()
        messages, tokens = [None, None], [None, None]
        turns: list[list[Turn]] = [[], []]
        seat, last, loser, cut_off = 0, None, None, [False, False]
        stand_in, replaced, frozen_moves = random.Random(int(example.get("seed", 0))), 0, 0
        while True:
            if tokens[seat] is None:  # the seat's first turn: its opening shows the move before it
                messages[seat], tokens[seat] = self._conversation(seat, game, last)
            samples, version = await self.service.sample(tokens[seat], self.params, 1, opponent=seat == frozen)
            sample = samples[0]
            turns[seat].append(Turn(list(tokens[seat]), list(sample.completion_ids), list(sample.logprobs), version,
                                    sample.finished))
            cut_off[seat] |= not sample.finished
            tokens[seat] = tokens[seat] + list(sample.completion_ids)
            text = self.tokenizer.decode(sample.completion_ids, skip_special_tokens=True)
            messages[seat].append({"role": "assistant", "content": text})
            cell = self.env.move(text, game)
            if seat == frozen:
                frozen_moves += 1
                if cell is None:  # as a masked opponent's would be: a legal move, never a forfeit to the learner
                    cell, replaced = stand_in.choice(game.legal()), replaced + 1
            if cell is None:
                loser = seat
                break
            game.play(cell)
            if game.over():
                break
            other = 1 - seat
            if messages[other] is not None:  # the other seat hears of the move as the env's text
                messages[other].append({"role": "user", "content": self.env.report(game, seat, cell)})
                tokens[other] = tokens[other] + inserted_tokens(self.tokenizer, messages[other], tokens[other])
            seat, last = other, cell
        out = []
        for s in (0, 1) if frozen is None else (1 - frozen,):
            score = game.score(s) if loser is None else float(s != loser)
            for sequence in stitch(turns[s]):
                versions = [v for v in sequence.versions if v >= 0]
                info = {"turns": sequence.turns, "truncated": False, "cut_off": cut_off[s], "budget_cut": False,
                        "reward_parts": {}, "invalid_move": loser == s, "versions": sequence.versions}
                if frozen is not None:
                    info.update(opponent_moves=frozen_moves, opponent_moves_replaced=replaced)
                out.append(Trajectory(sequence.prompt_ids, sequence.response_ids, sequence.loss_mask, sequence.logprobs,
                                      score, group_id, min(versions) if versions else self.service.version,
                                      {**example, "seat": s, "score": score}, info))
        return out


class LockstepService:
    """``EngineService``'s ``sample``, answered batch by batch: once every live episode waits
    for a sample, one ``engine.generate`` call answers them all, in the order they asked (and,
    with an ``opponent`` engine, one call of it answers the opponent's seats, after the
    learner's). With no threads and no timing in it, a seeded run samples the same batches
    every time."""

    def __init__(self, engine, opponent=None):
        self.engine, self.opponent, self.live, self.waiting = engine, opponent, 0, []

    @property
    def version(self) -> int:
        return self.engine.version

    async def sample(self, prompt_ids: list[int], params: SamplingParams, n: int = 1, opponent: bool = False):
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((list(prompt_ids), params, n, opponent, future))
        self._answer_if_all_wait()
        return await future

    def _answer_if_all_wait(self) -> None:
        if not self.waiting or len(self.waiting) < self.live:
            return
        waiting, self.waiting = self.waiting, []
        for engine, whose in ((self.engine, False), (self.opponent, True)):
            asked = [w for w in waiting if w[3] == whose]
            if not asked:
                continue
            params, n = asked[0][1], asked[0][2]  # one step's episodes share them
            groups = engine.generate([prompt for prompt, *_ in asked], n, params)
            for (*_, future), samples in zip(asked, groups):
                future.set_result((samples, engine.version))

    async def run(self, coroutines: list) -> list:
        self.live = len(coroutines)

        async def one(coroutine):
            try:
                return await coroutine
            finally:
                self.live -= 1
                self._answer_if_all_wait()  # the episodes still running may all be waiting now

        return await asyncio.gather(*(one(c) for c in coroutines))


class TwoSeatGenerator:
    """The generator seam over self-play games: ``generate(examples, group_size)`` plays each
    example's game ``group_size`` times and returns both seats' trajectories; with an
    ``opponent`` engine (a frozen snapshot's), the learner's seat only."""

    def __init__(self, env, engine, tokenizer, params: SamplingParams, opponent=None):
        check_two_seats(env)
        self.env, self.engine, self.tokenizer, self.params = env, engine, tokenizer, params
        self.opponent = opponent

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)  # the learner's; the snapshot's is Snapshot.refresh

    def generate(self, examples: list[dict], group_size: int) -> Trajectories:
        service = LockstepService(self.engine, self.opponent)
        against = self.opponent is not None
        source = TwoSeatEpisodes(self.env, service, self.tokenizer, self.params, against_opponent=against)
        # self-play: seat s of example g is group 2 g + s; against a snapshot the learner's seat is g's
        games = [source.play(example, g if against else 2 * g) for g, example in enumerate(examples)
                 for _ in range(group_size)]
        played = asyncio.run(service.run(games))
        items = []
        for trajectories in played:
            for t in trajectories:
                t.group_id += 0 if against else t.example["seat"]
                items.append(t)
        return Trajectories(items)


class Snapshot:
    """The frozen seat's policy: ``model``, a copy of the policy that is never trained, and
    ``engine`` sampling from it. Taken when the run starts; ``refresh`` copies the learner's
    weights in (every ``--snapshot-every`` steps). A checkpoint component: its weights and
    version are saved, so a resumed run plays the same opponent."""

    def __init__(self, model, engine):
        self.model, self.engine = model, engine

    @property
    def version(self) -> int:
        return self.engine.version

    def refresh(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def state_dict(self) -> dict:
        return {"version": self.engine.version, "weights": {k: v.detach().clone()
                                                             for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["weights"])
        self.engine.update_weights((), state["version"])
