"""Self-play with a league, for a masked policy playing one seat of a two-seat game.

The game is a gymnasium vector env of ``TurnEnv`` s (envs/games/turn_env.py): the learner
plays one seat, alternating, and the league plays the other. Each episode the league draws
the other seat's player:

- with probability ``--latest-share`` the learner's current policy (plain self-play);
- with probability ``--random-share`` the uniform random player: it visits every line of
  play, so the learner also sees (and learns to punish) positions that no policy in the
  league reaches any more;
- otherwise a member, by AlphaStar's prioritised fictitious self-play (PFSP, "hard"
  weighting): member ``i`` with weight ``(1 - p_i)^2``, ``p_i`` the learner's recent score
  against it (an exponential average of 1 win / 0.5 draw / 0 loss, starting at 0.5), so the
  members that still beat the learner are played most and the ones it has mastered fade out.
  Members are the uniform random player (kept: it anchors the ratings at 1000, and a policy
  that learns to punish random mistakes is what ``eval/vs_random/win_rate`` asks for), with
  ``--league-search-depth D`` a fixed search player of ``D`` plies (envs/games/opponents.py),
  and a frozen snapshot of the learner every ``--league-every`` updates (the newest
  ``--league-size`` kept). The search member is a teacher of tactics: at depth 1 it takes
  every win in one, so a move that leaves one loses at once, which snapshots that sample their
  moves punish only now and then (connect four's learner lost 42 of 47 games to the depth-2
  search that way, docs/games.md); PFSP plays it for as long as it still beats the learner.

Ratings are Elo (K = ``--elo-k``): every finished game between the learner and a member
moves both ratings, except the random anchor's; a snapshot starts at the learner's rating
when it is taken. Every ``--eval-every`` updates the greedy learner plays ``--eval-games``
games against the random player and against the search opponent (envs/games/opponents.py),
half on each seat, logged as ``eval/vs_random/win_rate``, ``eval/vs_search/score`` (win 1,
draw 0.5, loss 0), ``eval/elo`` (the learner's rating) and ``eval/train_seconds`` (the wall
time since the league started, the evaluations' own left out). docs/games.md.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from omnigym.envs.games import default_search_depth, game_family, is_game_id
from omnigym.envs.games.opponents import Search, check_search_depth, random_move
from omnigym.envs.games.turn_env import TurnEnv, score
from omnigym.errors import OmnigymError, require
from omnigym.track import stopping

ANCHOR_RATING = 1000.0
LATEST = "latest"


@dataclass
class SelfPlayConfig:
    self_play: bool = False
    """play a pettingzoo/NAME or openspiel/NAME two-seat game against the policy itself and a league of its past
    snapshots (PFSP), with Elo ratings and evaluation against random and search opponents (docs/games.md)"""
    latest_share: float = 0.5
    """--self-play: share of games against the current policy"""
    random_share: float = 0.0
    """--self-play: share of games against the random player; the rest (1 - latest - random) against league members
    drawn by PFSP"""
    league_every: int = 10
    """--self-play: updates between snapshots added to the league"""
    league_size: int = 20
    """--self-play: snapshots kept in the league (the oldest leave first)"""
    elo_k: float = 16.0
    """--self-play: the Elo K-factor of each game between the learner and a member"""
    eval_every: int = 10
    """--self-play: updates between evaluations against the random and search opponents (and at the end)"""
    eval_games: int = 100
    """--self-play: games per evaluation and opponent, half on each seat"""
    search_depth: int = 0
    """--self-play: the search opponent's depth in plies; 0 = the game's default (tic-tac-toe: 9, a perfect player;
    others: 2)"""
    league_search_depth: int = 0
    """--self-play: a search player of this many plies joins the league as a fixed member, drawn by PFSP as the
    snapshots are (1: it takes any win in one, else moves at random); 0: none. Each ply multiplies its time a move by
    the moves it tries: on connect four 3 plies take ~1-7 ms a move, 5 plies seconds"""

    def preset_field_applies(self, name: str) -> bool:
        """A preset's league settings are for --self-play: a game played against a fixed opponent has no league."""
        return self.self_play or name not in SELF_PLAY_FLAGS

    def flags_without_effect(self, given: set[str]) -> str | None:
        """What to say of league flags given on a command line without --self-play (they were ignored in
        silence). The command line's, not the config's: a saved config may hold a preset's values."""
        idle = [name for name in SELF_PLAY_FLAGS if name in given]
        if self.self_play or not idle:
            return None
        return (f"--{idle[0].replace('_', '-')} is for --self-play (the league and its evaluations); add --self-play, "
                "or leave it out (a fixed opponent's search depth is --env-kwargs opponent=search search_depth=N)")

    def check_self_play(self) -> None:
        if not self.self_play:
            return
        require(is_game_id(self.env_id), f"--self-play plays two-seat games, pettingzoo/NAME or openspiel/NAME; "
                                         f"{self.env_id} is not one (docs/games.md)")
        require(self.backend in ("auto", "sync"), f"--self-play keeps its league in this process: use --backend sync "
                                                  f"(or auto), not {self.backend}")
        require(getattr(self, "runtime", "sync") == "sync", "--self-play steps its games in this process; "
                                                            "--runtime ray is not supported with it")
        require(0 <= self.latest_share and 0 <= self.random_share and self.latest_share + self.random_share <= 1,
                f"--latest-share and --random-share must be at least 0 and sum to at most 1, got {self.latest_share} "
                f"and {self.random_share}")
        for name in ("league_every", "league_size", "eval_every", "eval_games"):
            require(getattr(self, name) > 0, f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        fixed = [pair for pair in getattr(self, "env_kwargs", ()) if pair.split("=", 1)[0] in ("opponent",
                                                                                             "search_depth")]
        # the league plays the other seat, so a fixed opponent asked for here would be ignored
        require(not fixed, f"--env-kwargs {fixed[0] if fixed else ''} picks a fixed opponent, which --self-play "
                           "replaces with its league; leave it out (the evaluation's search depth is --search-depth)")
        require(self.elo_k > 0, f"--elo-k must be positive, got {self.elo_k}")
        require(self.search_depth >= 0, f"--search-depth must be 0 (the game's default) or more, got "
                                        f"{self.search_depth}")
        require(self.league_search_depth >= 0, f"--league-search-depth must be 0 (no search member) or more, got "
                                               f"{self.league_search_depth}")


SELF_PLAY_FLAGS = ("latest_share", "random_share", "league_every", "league_size", "elo_k", "eval_every", "eval_games",
                   "search_depth", "league_search_depth")
"""the settings of --self-play alone"""


def elo_expected(rating: float, other: float) -> float:
    """The expected score of a player rated ``rating`` against one rated ``other``."""
    return 1.0 / (1.0 + 10.0 ** ((other - rating) / 400.0))


def elo_update(rating: float, other: float, result: float, k: float) -> tuple[float, float]:
    """Both ratings after one game that the first player scored ``result`` in (1, 0.5, 0)."""
    delta = k * (result - elo_expected(rating, other))
    return rating + delta, other - delta


def turn_envs(envs: gym.vector.VectorEnv) -> list[TurnEnv]:
    """The ``TurnEnv`` s of a sync vector env, or one line saying why self-play cannot use them."""
    sync = envs.unwrapped
    require(isinstance(sync, gym.vector.SyncVectorEnv), "--self-play needs the sync backend (its league lives in "
                                                        "this process)")
    games = [env.unwrapped for env in sync.envs]
    require(all(isinstance(env, TurnEnv) for env in games), "--self-play plays pettingzoo/NAME or openspiel/NAME "
                                                            "games (docs/games.md)")
    return games


def policy_move(net: torch.nn.Module, greedy: bool = False):
    """A network (``ActorCritic``) as an opponent: its move for the seat to move, sampled with
    the game's generator, or its best. Only the actor runs: this is most of a self-play step."""
    device = next(net.parameters()).device

    @torch.inference_mode()
    def move(game, rng) -> int:
        obs = torch.as_tensor(game.observation(game.current()), device=device)[None]
        mask = game.legal_mask()
        logits = net.head.masked_logits(net.actor_torso(net.encoder(obs)), torch.as_tensor(mask, device=device)[None])
        logits = logits[0].double().cpu().numpy()
        if greedy:
            return int(logits.argmax())
        probs = np.exp(logits - logits.max())
        return int(rng.choice(len(probs), p=probs / probs.sum()))

    return move


class Member:
    """A league player: a frozen snapshot (``net``), or a fixed player (``move``: the random one, a search)."""

    def __init__(self, name: str, net: torch.nn.Module | None, rating: float, move=random_move):
        self.name, self.net, self.rating = name, net, rating
        self.learner_score, self.games = 0.5, 0
        self.move = move if net is None else policy_move(net)

    def state(self) -> dict:
        return {"name": self.name, "rating": self.rating, "learner_score": self.learner_score, "games": self.games,
                "net": None if self.net is None else self.net.state_dict()}


class League:
    """The other seat's players, their results and ratings (module docstring)."""

    SCORE_RATE = 0.05
    """the step of each member's exponential average of the learner's score: about the last 20 games against it"""

    def __init__(self, cfg: SelfPlayConfig, envs: gym.vector.VectorEnv, agent: torch.nn.Module):
        self.cfg, self.agent = cfg, agent
        games = turn_envs(envs)
        self.game = games[0].game.clone()  # evaluation plays its own copy
        self.latest = policy_move(agent)
        self.members = [Member("random", None, ANCHOR_RATING)]
        if cfg.league_search_depth:
            depth = cfg.league_search_depth
            self.members.append(Member(f"search_{depth}", None, ANCHOR_RATING, move=Search(depth)))
        self.fixed = {member.name: member.move for member in self.members}
        """the members that are not snapshots, by name (a checkpoint stores their names, not their moves)"""
        self.rating = ANCHOR_RATING
        self.search = Search(cfg.search_depth or default_search_depth(cfg.env_id))
        self.rng = np.random.default_rng(cfg.seed)
        self.snapshots_taken = 0
        self.owed = False
        """an evaluation a stop cut short: the resumed run plays it first (evaluate again)"""
        self.started, self.eval_seconds = time.perf_counter(), 0.0
        self.trained_before = 0.0
        """training seconds of the run before this process resumed it (its checkpoint's)"""
        for env in games:
            env.opponents = self

    # -- what the envs call -------------------------------------------------------------
    def draw(self, rng: np.random.Generator):
        """The other seat's player for one episode: ``(move, tag)``, the tag reported back."""
        u = rng.random()
        if u < self.cfg.latest_share:
            return self.latest, LATEST
        if u < self.cfg.latest_share + self.cfg.random_share:
            return self.members[0].move, self.members[0]
        weights = np.array([(1.0 - m.learner_score) ** 2 for m in self.members]) + 1e-3
        member = self.members[rng.choice(len(self.members), p=weights / weights.sum())]
        return member.move, member

    def report(self, tag, result: float) -> None:
        """The learner's score in a finished game against ``tag``'s player."""
        if tag == LATEST:
            return
        tag.games += 1
        tag.learner_score += self.SCORE_RATE * (result - tag.learner_score)
        learner, member = elo_update(self.rating, tag.rating, result, self.cfg.elo_k)
        self.rating = learner
        if tag is not self.members[0]:  # the random player anchors the scale
            tag.rating = member

    # -- what the trainer calls ---------------------------------------------------------
    def after_update(self, update: int, last: bool) -> dict:
        """Takes a snapshot and evaluates when due; the metrics to log (update counts from 1)."""
        metrics = {"eval/elo": self.rating, "league/size": len(self.members)}
        if update % self.cfg.league_every == 0:
            self.add_snapshot()
        if update % self.cfg.eval_every == 0 or last:
            metrics.update(self.evaluate())
        return metrics

    def add_snapshot(self) -> None:
        net = copy.deepcopy(self.agent).requires_grad_(False).eval()
        self.snapshots_taken += 1
        self.members.append(Member(f"snapshot_{self.snapshots_taken}", net, self.rating))
        self.keep_league_size()

    def keep_league_size(self) -> None:
        """At most ``--league-size`` snapshots, the oldest dropped first; the fixed members stay.
        All that are past it go at once: a run resumed with a smaller --league-size kept its old
        league whole, one dropped per one taken, while its config said the smaller size."""
        snapshots = [i for i, member in enumerate(self.members) if member.net is not None]
        for index in reversed(snapshots[:max(0, len(snapshots) - self.cfg.league_size)]):
            del self.members[index]

    def evaluate(self) -> dict:
        """The evaluation's metrics; none when a stop (SIGTERM) is requested before or during it:
        the checkpoint the stop waits for comes right after, and an evaluation can outlast the
        stop's grace (hundreds of games against a search), which then lost the run's work since
        its last checkpoint (all of it, in a run whose only checkpoint is its last update's)."""
        began, rng_before = time.perf_counter(), self.rng.bit_generator.state
        learner = policy_move(self.agent, greedy=True)
        vs_random = self.play(learner, random_move, self.cfg.eval_games)
        vs_search = self.play(learner, self.search, self.cfg.eval_games) if self.game.perfect_information else []
        self.owed = stopping.stop_requested()
        if self.owed:  # the random stream as before it: the resumed run's evaluation plays the same games
            self.rng.bit_generator.state = rng_before
            self.eval_seconds += time.perf_counter() - began
            return {}
        metrics = {"eval/vs_random/win_rate": float(np.mean(np.asarray(vs_random) == 1.0))}
        if vs_search:  # a game with hidden information or chance has no search opponent
            metrics["eval/vs_search/score"] = float(np.mean(vs_search))
        self.eval_seconds += time.perf_counter() - began
        # training time so far, evaluations left out: what bench/selfplay_vs_maskable_ppo.py compares
        metrics["eval/train_seconds"] = self.train_seconds()
        return metrics

    def train_seconds(self) -> float:
        """The run's training time so far, evaluations left out, across resumes."""
        return self.trained_before + time.perf_counter() - self.started - self.eval_seconds

    def play(self, learner, opponent, games: int) -> list[float]:
        """The learner's scores in ``games`` games against ``opponent``, seats alternating."""
        scores = []
        for i in range(games):
            if stopping.stop_requested():
                break  # evaluate() logs nothing of a part-played evaluation
            seat = i % 2
            self.game.reset(seed=int(self.rng.integers(2**31)))
            while not self.game.done():
                player = learner if self.game.current() == seat else opponent
                self.game.step(player(self.game, self.rng))
            scores.append(score(self.game.returns()[seat]))
        return scores

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"rating": self.rating, "snapshots_taken": self.snapshots_taken, "rng": self.rng.bit_generator.state,
                "owed": self.owed,
                "members": [m.state() for m in self.members], "train_seconds": self.train_seconds()}

    def load_state_dict(self, state: dict) -> None:
        self.rating, self.snapshots_taken = state["rating"], state["snapshots_taken"]
        self.owed = state.get("owed", False)
        # the clock goes on from the checkpoint's (a checkpoint from before it was saved: from 0)
        self.trained_before = state.get("train_seconds", 0.0)
        self.started, self.eval_seconds = time.perf_counter(), 0.0
        self.rng.bit_generator.state = state["rng"]
        self.members = []
        for saved in state["members"]:
            net = None
            if saved["net"] is not None:
                net = copy.deepcopy(self.agent).requires_grad_(False).eval()
                net.load_state_dict(saved["net"])
            member = Member(saved["name"], net, saved["rating"], move=self.fixed.get(saved["name"], random_move))
            member.learner_score, member.games = saved["learner_score"], saved["games"]
            self.members.append(member)
        self.keep_league_size()  # resumed with a smaller --league-size


def check_games_envs(envs, cfg: SelfPlayConfig) -> None:
    """Before a run directory exists: the envs are games self-play can play, with the league asked for."""
    try:
        game = turn_envs(envs)[0].game
        require(not cfg.league_search_depth or game.perfect_information,
                f"--league-search-depth adds a search player, which plays games with nothing hidden and no chance; "
                f"{cfg.env_id} is not one: leave --league-search-depth out")
        # the evaluation's search opponent, a depth given for a game without one was taken in silence
        require(not cfg.search_depth or game.perfect_information,
                f"--search-depth sets the evaluation's search opponent, which plays games with nothing hidden and no "
                f"chance; {cfg.env_id} is not one (it is evaluated against random play alone): leave it out")
        if cfg.search_depth not in (0, default_search_depth(cfg.env_id)) or game_family(cfg.env_id) is None:
            # the default depth too, where no one measured it (chess): its evaluation never finished
            check_search_depth(game, cfg.search_depth or default_search_depth(cfg.env_id), "--search-depth ")
        if cfg.league_search_depth:
            check_search_depth(game, cfg.league_search_depth, "--league-search-depth ")
    except OmnigymError:
        envs.close()
        raise
