"""PettingZoo and OpenSpiel games behind one turn-based interface, ``Game``.

A game has ``num_seats`` seats; ``current()`` is the seat to move; ``observation(seat)`` is
the board as that seat sees it (a flat float32 vector; PettingZoo's classic boards are
already from the mover's side, OpenSpiel's get the seat's one-hot appended, since its
tic-tac-toe tensor is the same for both players); ``legal_mask()`` is one bool per action
for the mover; ``step(action)``; ``done()``; ``returns()`` the per-seat sums of rewards so far
(at the end: +1 win, -1 loss, 0 draw in the classic games); ``clone()`` an independent copy
for search; ``key()`` a hashable for the position (search's transposition table).
"""

from __future__ import annotations

import copy

import numpy as np

from omnigym.errors import OmnigymError


class Game:
    name: str
    num_seats: int
    num_actions: int
    obs_size: int
    perfect_information: bool = True
    """deterministic, no hidden information: what the search opponent needs"""

    def reset(self, seed: int | None = None) -> None: ...
    def current(self) -> int: ...
    def observation(self, seat: int) -> np.ndarray: ...
    def legal_mask(self) -> np.ndarray: ...
    def step(self, action: int) -> None: ...
    def done(self) -> bool: ...
    def truncated(self) -> bool:
        return False
    def returns(self) -> np.ndarray: ...
    def clone(self) -> "Game": ...
    def key(self): ...


# The attributes a PettingZoo env shares with its clones: they never change during a game,
# and copying them (spaces, pygame screens) is most of what a deepcopy costs.
_SHARED = frozenset({"action_spaces", "observation_spaces", "possible_agents", "screen", "clock", "render_mode",
                     "_ezpickle_args", "_ezpickle_kwargs", "metadata", "screen_scaling"})


class PettingZooGame(Game):
    """A PettingZoo AEC env (a parallel env goes through PettingZoo's own ``parallel_to_aec``)."""

    def __init__(self, name: str, env, perfect_information: bool = False):
        self.name, self.env = name, env
        self.raw = env.unwrapped
        self.agents = list(env.possible_agents)
        self.num_seats = len(self.agents)
        spaces = [env.action_space(a) for a in self.agents]
        if any(not hasattr(s, "n") for s in spaces):
            raise OmnigymError(f"pettingzoo/{name} has {spaces[0]} actions; omnigym plays games with discrete "
                               "actions (one mask entry each)")
        self.num_actions = max(int(s.n) for s in spaces)
        self.perfect_information = perfect_information
        self.reset(seed=0)
        self.obs_size = len(self.observation(0))

    def reset(self, seed=None):
        self.env.reset(seed=seed)
        self.returns_so_far = np.zeros(self.num_seats)
        self._over = False

    def current(self):
        return self.agents.index(self.raw.agent_selection)

    def observation(self, seat):
        obs = self.raw.observe(self.agents[seat])
        obs = obs["observation"] if isinstance(obs, dict) else obs
        return np.asarray(obs, dtype=np.float32).reshape(-1)

    def legal_mask(self):
        agent = self.raw.agent_selection
        obs = self.raw.observe(agent)
        if isinstance(obs, dict) and "action_mask" in obs:
            mask = np.asarray(obs["action_mask"], dtype=bool)
        elif "action_mask" in self.raw.infos.get(agent, {}):
            mask = np.asarray(self.raw.infos[agent]["action_mask"], dtype=bool)
        else:
            mask = np.ones(int(self.env.action_space(agent).n), dtype=bool)
        return np.pad(mask, (0, self.num_actions - len(mask)))

    def step(self, action):
        self.raw.step(int(action))
        self.returns_so_far += [self.raw.rewards.get(a, 0.0) for a in self.agents]
        # An AEC game is over once any seat is terminated or truncated (the classic boards end
        # every seat together); the dead seats' None steps are PettingZoo's bookkeeping, not moves.
        self._over = any(self.raw.terminations.get(a, True) or self.raw.truncations.get(a, True) for a in self.agents)

    def done(self):
        return self._over

    def truncated(self):
        return self._over and not any(self.raw.terminations.get(a, False) for a in self.agents)

    def returns(self):
        return self.returns_so_far.copy()

    def __getstate__(self):
        """A PettingZoo env pickles as its constructor's arguments (EzPickle): unpickled, it is a new
        env that was never reset. A checkpoint holds the envs mid-game, so the game itself goes with
        it: each layer (the wrappers, the raw env) as its class and attributes, pygame's aside."""
        layers, env = [], self.env
        while env is not None:
            layers.append((type(env), {k: None if k in ("screen", "clock") else v for k, v in vars(env).items()
                                       if k != "env"}))
            env = getattr(env, "env", None)
        return {**{k: v for k, v in vars(self).items() if k not in ("env", "raw")}, "_layers": layers}

    def __setstate__(self, state):
        inner = None
        for cls, attributes in reversed(state.pop("_layers")):  # the raw env first, then each wrapper around it
            layer = object.__new__(cls)  # not the constructor: EzPickle's would build a new env
            layer.__dict__.update(attributes)
            if inner is not None:
                layer.env = inner
            inner = layer
        self.__dict__.update(state)
        self.env, self.raw = inner, inner.unwrapped

    def clone(self):
        new = copy.copy(self)
        raw = object.__new__(type(self.raw))  # not copy.copy: EzPickle's copy would build a new env
        raw.__dict__.update({name: value if name in _SHARED else copy.deepcopy(value)
                             for name, value in vars(self.raw).items()})
        new.raw = new.env = raw  # clones step the raw env: the moves search tries are legal ones
        new.returns_so_far = self.returns_so_far.copy()
        return new

    def key(self):
        seat = self.current()
        return seat, self.observation(seat).tobytes()


class OpenSpielGame(Game):
    """An OpenSpiel game; chance nodes are sampled, simultaneous-move games made turn-based."""

    def __init__(self, name: str, game):
        import pyspiel

        kind = game.get_type()
        if kind.dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
            game = pyspiel.convert_to_turn_based(game)
            kind = game.get_type()
        self.name, self.game = name, game
        self.num_seats = game.num_players()
        self.num_actions = game.num_distinct_actions()
        self.perfect_information = (kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION
                                    and kind.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC)
        if kind.provides_observation_tensor:
            self._tensor = "observation_tensor"
        elif kind.provides_information_state_tensor:
            self._tensor = "information_state_tensor"
        else:
            raise OmnigymError(f"openspiel/{name} gives no observation tensor for a network to read")
        self.rng = np.random.default_rng(0)
        self.reset(seed=0)
        self.obs_size = len(self.observation(0))

    def reset(self, seed=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.state = self.game.new_initial_state()
        self._chance()

    def _chance(self):
        while self.state.is_chance_node():
            actions, probs = zip(*self.state.chance_outcomes())
            self.state.apply_action(int(self.rng.choice(actions, p=probs)))

    def current(self):
        return self.state.current_player()

    def observation(self, seat):
        board = np.asarray(getattr(self.state, self._tensor)(seat), dtype=np.float32)
        return np.concatenate([board, np.eye(self.num_seats, dtype=np.float32)[seat]])

    def legal_mask(self):
        mask = np.zeros(self.num_actions, dtype=bool)
        mask[self.state.legal_actions()] = True
        return mask

    def step(self, action):
        self.state.apply_action(int(action))
        self._chance()

    def done(self):
        return self.state.is_terminal()

    def returns(self):
        return np.asarray(self.state.returns(), dtype=float)

    def clone(self):
        new = copy.copy(self)
        new.state = self.state.clone()
        return new

    def key(self):
        return self.current(), str(self.state)
