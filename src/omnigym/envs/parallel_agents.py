"""A cooperative team of agents that act at once (PettingZoo's parallel API), as the arrays
MAPPO learns from.

``pettingzoo/NAME`` is looked up in mpe2 (the Multi-Particle Environments' home since PettingZoo
1.25) and then in PettingZoo's own families. What MAPPO can train is refused here, in one line,
before anything is written: a turn-based game (PettingZoo's AEC API, one agent moves at a time),
a task whose agents have rewards of their own (MPE's ``world.collaborative`` is False: predators
and prey, adversaries), and agents whose observation or action spaces differ (one shared policy
needs one input and one output shape).

``TeamEnvs`` steps ``num_envs`` copies in a loop (the team envs are small Python worlds: a
subprocess per env would cost more than it saves on 2 cores) and starts the next episode when
one ends. Arrays are ``[envs, agents, ...]`` in ``possible_agents`` order. The global state the
critic sees is the agents' observations joined in that order: MAPPO's ``share_obs`` for MPE,
and what mpe2's ``env.state()`` returns, available at the last step of an episode too.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import warnings

import gymnasium as gym
import numpy as np

from omnigym.envs.games import check_max_cycles
from omnigym.errors import OmnigymError, missing_extra, require

PREFIX = "pettingzoo/"
FAMILIES = ("mpe2", "pettingzoo.butterfly", "pettingzoo.sisl", "pettingzoo.classic")
"""where ``pettingzoo/NAME`` is looked for, in this order"""
COOPERATIVE = "simple_spread_v3, simple_reference_v3"


def env_module(env_id: str):
    """The module that makes ``pettingzoo/NAME`` (its ``parallel_env``, or only ``env`` for a
    turn-based game); a missing [games] extra or an unknown name is one line."""
    require(isinstance(env_id, str) and env_id.startswith(PREFIX),
            f"mappo trains PettingZoo parallel envs named pettingzoo/NAME, e.g. pettingzoo/simple_spread_v3; "
            f"got --env-id {env_id}")
    name = env_id[len(PREFIX):]
    for package in ("pettingzoo", "mpe2"):
        if importlib.util.find_spec(package) is None:
            raise missing_extra(package, "games")
    require(re.fullmatch(r"[a-z0-9_]+_v[0-9]+", name) is not None,
            f"unknown PettingZoo env {env_id!r}: names look like simple_spread_v3 (name_vN)")
    with warnings.catch_warnings():  # PettingZoo warns on every direct import of an env module
        warnings.simplefilter("ignore", DeprecationWarning)
        for family in FAMILIES:
            try:
                found = importlib.util.find_spec(f"{family}.{name}") is not None
            except ImportError:  # a family whose own dependencies are not installed (pettingzoo[atari])
                continue
            if found:
                return importlib.import_module(f"{family}.{name}")
    raise OmnigymError(f"unknown PettingZoo env {env_id!r}: there is no {name} in mpe2 or PettingZoo's butterfly, "
                       f"sisl or classic families; cooperative tasks mappo trains: {COOPERATIVE}")


def make_team_env(env_id: str, env_kwargs: dict | None = None):
    """One parallel env of ``env_id``, checked to be a team one shared policy can play."""
    module = env_module(env_id)
    check_max_cycles(env_id, env_kwargs or {})
    require(hasattr(module, "parallel_env"),
            f"{env_id} is turn-based (PettingZoo's AEC API: one agent moves at a time); mappo steps every agent "
            f"at once and trains a cooperative team: {COOPERATIVE}")
    try:
        env = module.parallel_env(**(env_kwargs or {}))
    except (TypeError, ValueError, AssertionError) as exc:
        raise OmnigymError(f"{env_id} does not take --env-kwargs {env_kwargs}: {str(exc).splitlines()[0]}") from None
    world = getattr(env.unwrapped, "world", None)
    if world is None:  # butterfly, sisl: their shared-reward settings differ per env and are not read here
        env.close()
        raise OmnigymError(f"{env_id} is not an MPE task; mappo knows a team's shared reward only from MPE's "
                           f"collaborative worlds: {COOPERATIVE}")
    if not getattr(world, "collaborative", False):
        env.close()
        raise OmnigymError(f"{env_id} is not a cooperative task (its agents have rewards of their own: adversaries, "
                           f"predators and prey); mappo trains one team on a shared reward: {COOPERATIVE}")
    agents = list(env.possible_agents)
    obs_space, action_space = env.observation_space(agents[0]), env.action_space(agents[0])
    same = all(env.observation_space(a) == obs_space and env.action_space(a) == action_space for a in agents)
    if not same or not isinstance(action_space, gym.spaces.Discrete) or len(obs_space.shape) != 1:
        env.close()
        raise OmnigymError(f"{env_id}'s agents do not share one vector observation space and one discrete action "
                           f"space, which the one policy they share needs; cooperative tasks mappo trains: "
                           f"{COOPERATIVE}")
    if env_kwargs:  # a value of the wrong kind (max_cycles=abc) is taken by the constructor and fails at a step
        try:
            env.reset(seed=0)
            env.step({a: 0 for a in env.agents})
            env.reset(seed=0)
        except (TypeError, ValueError, AssertionError) as exc:
            env.close()
            raise OmnigymError(f"{env_id} does not run with --env-kwargs {env_kwargs}: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    return env


class TeamEnvs:
    """``num_envs`` copies of a team env, stepped together; an ended episode restarts at once."""

    def __init__(self, env_id: str, num_envs: int, seed: int, env_kwargs: dict | None = None):
        self.envs = [make_team_env(env_id, env_kwargs) for _ in range(num_envs)]
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        self.num_envs, self.num_agents = num_envs, len(self.agents)
        self.obs_dim = first.observation_space(self.agents[0]).shape[0]
        self.n_actions = int(first.action_space(self.agents[0]).n)
        self.state_dim = self.obs_dim * self.num_agents
        self.seed = seed
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def _array(self, obs: dict) -> np.ndarray:
        missing = [a for a in self.agents if a not in obs]
        require(not missing, f"agents {missing} left the episode before its end; mappo needs every agent present "
                             "at every step")
        return np.stack([np.asarray(obs[a], dtype=np.float32) for a in self.agents])

    def reset(self) -> np.ndarray:
        """The first observations ``[envs, agents, obs]``; env i is seeded with ``seed + i``, once
        (later episodes continue each env's own random stream)."""
        return np.stack([self._array(env.reset(seed=self.seed + i)[0]) for i, env in enumerate(self.envs)])

    def step(self, actions: np.ndarray):
        """``actions [envs, agents]`` -> ``(obs, rewards [envs, agents], terminated [envs], truncated [envs],
        final_obs, episodes)``: ``obs`` is the next episode's first observation where one ended,
        whose last observation is then in ``final_obs`` (else ``final_obs`` repeats ``obs``);
        ``episodes``: the (team return, length) of each episode that ended, the team return being
        the sum over agents and steps of the env's rewards."""
        obs = np.empty((self.num_envs, self.num_agents, self.obs_dim), dtype=np.float32)
        final_obs = np.empty_like(obs)
        rewards = np.zeros((self.num_envs, self.num_agents), dtype=np.float32)
        terminated, truncated = np.zeros(self.num_envs, dtype=bool), np.zeros(self.num_envs, dtype=bool)
        episodes = []
        for i, env in enumerate(self.envs):
            step_obs, step_rewards, step_term, step_trunc, _ = env.step(
                {a: int(actions[i, j]) for j, a in enumerate(self.agents)})
            final_obs[i] = obs[i] = self._array(step_obs)
            rewards[i] = [step_rewards.get(a, 0.0) for a in self.agents]
            self._returns[i] += float(rewards[i].sum())
            self._lengths[i] += 1
            terminated[i] = any(step_term.get(a, False) for a in self.agents)
            truncated[i] = not terminated[i] and any(step_trunc.get(a, False) for a in self.agents)
            if terminated[i] or truncated[i] or not env.agents:
                truncated[i] = truncated[i] or not terminated[i]  # an episode that just stops is cut off
                episodes.append((float(self._returns[i]), int(self._lengths[i])))
                self._returns[i], self._lengths[i] = 0.0, 0
                obs[i] = self._array(env.reset()[0])
        return obs, rewards, terminated, truncated, final_obs, episodes

    def state_dict(self) -> dict:
        # the episodes under way restart on resume; their partial returns would belong to envs that are gone
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        for env in self.envs:
            env.close()
