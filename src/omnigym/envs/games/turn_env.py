"""One seat of a two-seat game as a gymnasium env: the learner's moves are the actions, the
other seat's moves are an opponent's, played inside ``step`` until the learner is to move
again. So any masked single-agent algorithm (PPO) plays games unchanged.

The learner's seat alternates from one episode to the next (the first from the env's seed),
so it learns both sides. Observations are the board as the learner sees it; the info of
every reset and step holds ``action_mask`` (all True on the final step, which has no legal
move and whose action the vector env never takes). The reward is the learner's return:
+1 win, -1 loss, 0 draw in the classic games. An illegal action (from an algorithm without
masks) loses the game.

Self-play puts a league into ``opponents`` (rl/league.py): each episode it draws the other
seat's player and hears the result. Without one the opponent is ``opponent`` (random or search).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from omnigym.envs.games import default_search_depth, make_game
from omnigym.envs.games.opponents import check_search_depth, fixed_opponent
from omnigym.envs.games.threats import WithThreats, check_threats
from omnigym.errors import OmnigymError

SEATS = 2


def check_two_seats(game, env_id: str) -> None:
    if game.num_seats != SEATS:
        seats = f"{game.num_seats} seat" + ("" if game.num_seats == 1 else "s")
        raise OmnigymError(f"{env_id} has {seats}; omnigym plays one seat against an opponent, and "
                           f"self-play supports {SEATS}-seat games")


_DEPTHS_TRIED: set = set()


def _check_depth_once(game, env_id: str, game_kwargs: dict, depth: int) -> None:
    """``check_search_depth`` once per game, settings and depth in a process, not in each of a
    vector env's copies (a deep search's probe takes up to seconds)."""
    tried = (env_id, repr(sorted(game_kwargs.items())), depth)
    if tried not in _DEPTHS_TRIED:
        check_search_depth(game, depth, "--env-kwargs search_depth=")
        _DEPTHS_TRIED.add(tried)


def score(learner_return: float) -> float:
    """1 for a win, 0.5 for a draw, 0 for a loss."""
    return 0.5 * (1 + float(np.sign(learner_return)))


class TurnEnv(gym.Env):
    metadata = {"render_modes": []}
    opponents = None
    """self-play's league, set by rl/league.py: ``draw(rng) -> (move, tag)`` and ``report(tag, score)``"""

    def __init__(self, game: str, opponent: str = "random", search_depth: int = 0, threats: bool = False,
                 **game_kwargs):
        if search_depth and opponent != "search":  # it was ignored, and the run trained against random play
            raise OmnigymError(f"--env-kwargs search_depth={search_depth} is the search opponent's depth; add "
                               f"opponent=search, or leave it out (the opponent is {opponent})")
        self.game = make_game(game, **game_kwargs)
        check_two_seats(self.game, game)
        if check_threats(game, threats):
            self.game = WithThreats(game, self.game)
        self.opponent = fixed_opponent(opponent, search_depth or default_search_depth(game))
        if opponent == "search" and search_depth and search_depth != default_search_depth(game):
            _check_depth_once(self.game, game, game_kwargs, search_depth)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (self.game.obs_size,), np.float32)
        self.action_space = gym.spaces.Discrete(self.game.num_actions)
        self._episodes, self._first_seat = 0, None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self._first_seat is None or seed is not None:
            self._first_seat = int(self.np_random.integers(SEATS))
        self.seat = (self._first_seat + self._episodes) % SEATS
        self._episodes += 1
        self.game.reset(seed=int(self.np_random.integers(2**31)))
        self._move, self._tag = (self.opponent, None) if self.opponents is None else self.opponents.draw(self.np_random)
        self._before = 0.0
        self._play_opponent()
        return self._observe()

    def step(self, action):
        if not self.game.legal_mask()[int(action)]:
            return self._end(-1.0, {"illegal_action": True})
        self.game.step(int(action))
        self._play_opponent()
        ret = self.game.returns()[self.seat]
        reward, self._before = ret - self._before, ret
        if self.game.done():
            return self._end(reward, {}, ret)
        obs, info = self._observe()
        return obs, reward, False, False, info

    def _play_opponent(self):
        while not self.game.done() and self.game.current() != self.seat:
            self.game.step(self._move(self.game, self.np_random))

    def _observe(self):
        return self.game.observation(self.seat), {"action_mask": self.game.legal_mask()}

    def _end(self, reward: float, info: dict, final_return: float | None = None):
        final_return = reward if final_return is None else final_return
        if self._tag is not None:
            self.opponents.report(self._tag, score(final_return))
        info = {**info, "action_mask": np.ones(self.game.num_actions, dtype=bool), "seat": self.seat}
        truncated = self.game.truncated()
        return self.game.observation(self.seat), float(reward), not truncated, truncated, info
