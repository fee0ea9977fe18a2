"""AlphaZero (Silver et al., 2017, 2018) at CPU scale, on OpenSpiel's two-player board games.

Read top to bottom: each iteration plays ``--games-per-iteration`` games of the network
against itself, each move chosen by a Monte-Carlo tree search of ``--simulations``
simulations guided by the network (PUCT: ``Q + c * prior * sqrt(N_parent) / (1 + N_child)``);
every position goes into a replay memory with the search's visit distribution and the
game's final outcome from the view of the player to move there; then ``--train-steps``
minibatches fit the policy to the visit distributions (cross-entropy) and the value to the
outcomes (squared error). Self-play explores by Dirichlet noise on the root's priors and by
sampling the first ``--temperature-moves`` moves of a game in proportion to the visits
(later ones take the most visited move). No time limit per move: a fixed simulation count,
so that the comparison below is fair.

Measured against OpenSpiel's own MCTS bot (``open_spiel.python.algorithms.mcts.MCTSBot``, UCT
with one random rollout per simulation and MCTS-Solver's proven values, as OpenSpiel's
alpha_zero evaluates) at the same number of simulations per move, and against a uniformly
random player; before training (logged at step 0) and every ``--eval-every`` iterations:
``eval/vs_mcts/score`` (win 1, draw 0.5, loss 0) and ``eval/vs_random/win_rate``. In
evaluation the network plays the most visited move of a search without noise. The step of
the log is the number of self-play games.

Games are pyspiel states used directly (``observation_tensor``, ``legal_actions``,
``returns``): ``--env-id openspiel/NAME`` names a two-player zero-sum game with sequential
turns, perfect information, no chance and rewards at the end (tic_tac_toe, connect_four,
breakthrough, hex, ...). The network is an MLP on the flat observation tensor with a policy
head and a tanh value head. One process, no batched leaf evaluation: readable before fast.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnigym.config import RunConfig, require_fraction, require_non_negative, require_positive
from omnigym.envs.games import check_openspiel_settings
from omnigym.errors import OmnigymError, missing_extra, require
from omnigym.optim import Adam
from omnigym.process import scoped_run
from omnigym.rl.losses import check_finite
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.run import start_run
from omnigym.track.stopping import checkpoint_due, stop_requested

PREFIX = "openspiel/"


@dataclass
class AlphaZeroConfig(RunConfig):
    env_id: str = "openspiel/tic_tac_toe"
    """openspiel/NAME: a two-player zero-sum OpenSpiel game with sequential turns, perfect information and no
    chance (tic_tac_toe, connect_four, ...); needs omnigym[games]"""
    iterations: int = 40
    """self-play then training, this many times"""
    games_per_iteration: int = 16
    """self-play games per iteration"""
    simulations: int = 25
    """MCTS simulations per move, in self-play and in evaluation (OpenSpiel's MCTS bot gets as many)"""
    c_puct: float = 2.0
    """PUCT's exploration constant"""
    dirichlet_alpha: float = 1.0
    """Dirichlet noise on the root's priors in self-play (OpenSpiel's tic-tac-toe setting; AlphaZero: 0.3 for chess)"""
    dirichlet_epsilon: float = 0.25
    """the noise's share of the root's priors"""
    temperature_moves: int = 2
    """the first this-many moves of a self-play game are sampled in proportion to the visits, later ones take the
    most visited (OpenSpiel's tic-tac-toe temperature_drop)"""
    replay_size: int = 8192
    """positions kept for training (the newest)"""
    batch_size: int = 128
    train_steps: int = 32
    """minibatch steps after each iteration's games"""
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    hidden: tuple[int, ...] = (128, 128)
    """the MLP's hidden widths"""
    eval_every: int = 10
    """iterations between evaluations (one before training, one at the end)"""
    eval_games: int = 20
    """games against OpenSpiel's MCTS bot per evaluation, half with each colour"""
    eval_random_games: int = 20
    """games against a random player per evaluation, half with each colour"""
    mcts_uct_c: float = 2.0
    """the MCTS bot's UCT constant (OpenSpiel's mcts example's default)"""
    checkpoint_every: int = 10
    """iterations between checkpoints (one is always written at the end)"""

    RESUME_FIXED = RunConfig.RESUME_FIXED + ("env_id", "hidden", "replay_size",
                                             "simulations")  # the search's strength, and the MCTS bot's in evaluation
    SAVED_REQUIRED = ("env_id",)
    BUDGET = ("iterations", "iteration")

    def check(self) -> None:
        super().check()
        # train_steps 0 played its games and trained nothing, and exited 0
        require_positive(self, "iterations", "games_per_iteration", "simulations", "replay_size", "batch_size",
                         "learning_rate", "hidden", "eval_every", "dirichlet_alpha", "train_steps")
        require_non_negative(self, "c_puct", "temperature_moves", "weight_decay", "eval_games",
                             "eval_random_games", "mcts_uct_c", "checkpoint_every")
        require_fraction(self, "dirichlet_epsilon")
        load_game(self.env_id)  # an unknown or unfit game: one line, before the run directory exists


CONFIG = AlphaZeroConfig


def load_game(env_id: str):
    """The pyspiel game ``openspiel/NAME`` names, refused in one line unless AlphaZero's
    self-play fits it: two players, zero-sum, turns one after the other, perfect information,
    no chance, rewards at the end."""
    require(env_id.startswith(PREFIX), f"alphazero plays OpenSpiel games: --env-id openspiel/NAME "
                                       f"(openspiel/tic_tac_toe, openspiel/connect_four), got {env_id!r}")
    try:
        import pyspiel
    except ImportError:
        raise missing_extra("open-spiel", "games") from None
    name = env_id[len(PREFIX):]
    require(name.split("(")[0] in pyspiel.registered_names(),
            f"unknown OpenSpiel game {name.split('(')[0]!r} in --env-id {env_id}; e.g. openspiel/tic_tac_toe, "
            "openspiel/connect_four (python -c 'import pyspiel; print(pyspiel.registered_names())' lists them)")
    try:
        game = pyspiel.load_game(name)
    except pyspiel.SpielError as exc:
        raise OmnigymError(f"--env-id {env_id}: {str(exc).strip().splitlines()[0]}") from None
    if "(" in name:  # parameters OpenSpiel loads but cannot play: connect_four(rows=0) crashed the process (SIGSEGV)
        check_openspiel_settings(env_id, game, {})
    kind = game.get_type()
    unfit = [why for why, ok in (
        (f"{game.num_players()} players", game.num_players() == 2),
        ("not zero-sum", kind.utility == pyspiel.GameType.Utility.ZERO_SUM),
        ("simultaneous moves", kind.dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL),
        ("chance events", kind.chance_mode == pyspiel.GameType.ChanceMode.DETERMINISTIC),
        ("hidden information", kind.information == pyspiel.GameType.Information.PERFECT_INFORMATION),
        ("rewards before the end", kind.reward_model == pyspiel.GameType.RewardModel.TERMINAL),
        ("no observation tensor", kind.provides_observation_tensor),
    ) if not ok]
    require(not unfit, f"--env-id {env_id}: alphazero plays two-player zero-sum games with sequential turns, "
                       f"perfect information and no chance; {name} has {', '.join(unfit)}")
    return game


class PolicyValueNet(nn.Module):
    """Observation tensor -> (logits over the game's distinct actions, value in [-1, 1] for the player to move)."""

    def __init__(self, obs_size: int, num_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        layers, width = [], obs_size
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        self.trunk = nn.Sequential(*layers)
        self.policy = nn.Linear(width, num_actions)
        self.value = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(obs)
        return self.policy(x), torch.tanh(self.value(x)).squeeze(-1)


class NetworkEvaluator:
    """The network as the search asks it: a state's priors over its legal moves and its value.

    Answers are kept per (observation, legal moves), the whole input of the answer, until the
    network changes (``forget``, called after each training phase): every search of a game, and
    every game of an iteration, expands the same positions again (tic-tac-toe has 5,478), and a
    position's forward pass cost more than the rest of its search step. The same input gives the
    same numbers, so the games played are the ones an evaluator without memory plays."""

    CAPACITY = 200_000
    """answers kept at most (a bigger game's iteration starts over past this)"""

    def __init__(self, net: PolicyValueNet, device: str):
        self.net, self.device, self.answers = net, device, {}

    def forget(self) -> None:
        self.answers.clear()

    @torch.inference_mode()
    def __call__(self, state) -> tuple[list[int], np.ndarray, float]:
        legal, observation = state.legal_actions(), state.observation_tensor()
        key = (tuple(observation), tuple(legal))
        answer = self.answers.get(key)
        if answer is None:
            logits, value = self.net(torch.as_tensor(observation, dtype=torch.float32, device=self.device))
            priors = torch.softmax(logits[legal], dim=-1)  # the illegal moves are left out before the softmax
            answer = (legal, priors.cpu().numpy(), value.item())
            if len(self.answers) >= self.CAPACITY:
                self.answers.clear()
            self.answers[key] = answer
        return answer


# -- the search ---------------------------------------------------------------------------------

class Node:
    """A search node: the state after ``player`` chose the move into it. ``value_sum`` adds
    up the values backed up through it from ``player``'s view, so its parent picks the child
    with the highest mean for the player choosing there."""

    __slots__ = ("prior", "player", "visits", "value_sum", "children")

    def __init__(self, prior: float, player: int):
        self.prior, self.player = prior, player
        self.visits, self.value_sum = 0, 0.0
        self.children: dict[int, Node] = {}

    def mean(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0


def expand(node: Node, state, evaluate) -> np.ndarray:
    """Give ``node`` a child per legal move with the network's prior; return the leaf's value
    for each player (zero-sum: the other player's is its negative)."""
    legal, priors, value = evaluate(state)
    mover = state.current_player()
    for action, prior in zip(legal, priors):
        node.children[action] = Node(float(prior), mover)
    values = np.full(2, -value)
    values[mover] = value
    return values


def select(node: Node, c_puct: float) -> tuple[int, Node]:
    """PUCT: the child with the highest mean value plus prior-weighted exploration (unvisited children count 0)."""
    scale = c_puct * math.sqrt(node.visits)
    return max(node.children.items(), key=lambda item: item[1].mean() + scale * item[1].prior / (1 + item[1].visits))


def search(state, evaluate, simulations: int, c_puct: float, rng: np.random.Generator | None = None,
           noise: tuple[float, float] | None = None) -> Node:
    """``simulations`` descents from ``state`` (not changed); the root's children's visits sum
    to ``simulations``. ``noise``: (epsilon, alpha) Dirichlet noise mixed into the root's priors."""
    root = Node(1.0, -1)
    root.visits = 1  # the root's own evaluation: sqrt(N) is not 0 at the first descent
    expand(root, state, evaluate)
    if noise is not None:
        epsilon, alpha = noise
        for child, n in zip(root.children.values(), rng.dirichlet([alpha] * len(root.children))):
            child.prior = (1 - epsilon) * child.prior + epsilon * n
    for _ in range(simulations):
        node, path, leaf = root, [], state.clone()
        while node.children and not leaf.is_terminal():
            action, node = select(node, c_puct)
            leaf.apply_action(action)
            path.append(node)
        values = np.asarray(leaf.returns()) if leaf.is_terminal() else expand(node, leaf, evaluate)
        for visited in path:
            visited.visits += 1
            visited.value_sum += values[visited.player]
        root.visits += 1
    return root


def visit_distribution(root: Node, num_actions: int) -> np.ndarray:
    pi = np.zeros(num_actions, dtype=np.float32)
    for action, child in root.children.items():
        pi[action] = child.visits
    return pi / pi.sum()


def most_visited(root: Node) -> int:
    return max(root.children.items(), key=lambda item: (item[1].visits, item[1].mean()))[0]


# -- self-play and its memory -------------------------------------------------------------------

def self_play(game, evaluate, cfg: AlphaZeroConfig, rng: np.random.Generator):
    """One game of the network against itself: (observations, visit distributions, outcomes
    from the view of the player to move at each position), and the game's returns."""
    state, observations, policies, movers = game.new_initial_state(), [], [], []
    while not state.is_terminal():
        root = search(state, evaluate, cfg.simulations, cfg.c_puct, rng, (cfg.dirichlet_epsilon, cfg.dirichlet_alpha))
        pi = visit_distribution(root, game.num_distinct_actions())
        observations.append(state.observation_tensor())
        policies.append(pi)
        movers.append(state.current_player())
        if len(movers) <= cfg.temperature_moves:
            action = int(rng.choice(len(pi), p=pi))
        else:
            action = most_visited(root)
        state.apply_action(action)
    returns = state.returns()
    return observations, policies, outcome_targets(movers, returns), returns


def outcome_targets(movers: list[int], returns) -> list[float]:
    """Each position's value target: the final return of the player who was to move there."""
    return [float(returns[player]) for player in movers]


class GameMemory:
    """The newest ``capacity`` positions: observation, visit distribution, outcome. Saved in checkpoints."""

    def __init__(self, capacity: int, obs_size: int, num_actions: int):
        self.obs = np.zeros((capacity, obs_size), np.float32)
        self.pi = np.zeros((capacity, num_actions), np.float32)
        self.z = np.zeros(capacity, np.float32)
        self.size, self.next = 0, 0

    def add(self, observations, policies, outcomes) -> None:
        for row in zip(observations, policies, outcomes):
            self.obs[self.next], self.pi[self.next], self.z[self.next] = row
            self.next = (self.next + 1) % len(self.z)
            self.size = min(self.size + 1, len(self.z))

    def sample(self, batch_size: int, rng: np.random.Generator, device: str):
        rows = rng.integers(0, self.size, batch_size)
        return (torch.as_tensor(x[rows], device=device) for x in (self.obs, self.pi, self.z))

    def state_dict(self) -> dict:
        return {"obs": self.obs, "pi": self.pi, "z": self.z, "size": self.size, "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        if state["obs"].shape != self.obs.shape or state["pi"].shape != self.pi.shape:
            raise ValueError(f"replay memory of shape {state['obs'].shape}, this run's is {self.obs.shape}")
        self.obs, self.pi, self.z = state["obs"], state["pi"], state["z"]
        self.size, self.next = state["size"], state["next"]


# -- evaluation ---------------------------------------------------------------------------------

def play(game, players) -> list[float]:
    """One game, ``players[p](state) -> action`` for seat p; the returns."""
    state = game.new_initial_state()
    while not state.is_terminal():
        state.apply_action(players[state.current_player()](state))
    return state.returns()


def match_score(game, ours, theirs, games: int) -> tuple[float, float]:
    """``games`` games, ours in seat 0 then 1 in turn: (score: win 1, draw 0.5, loss 0; win rate)."""
    results = []
    for g in range(games):
        if stop_requested():
            break  # evaluate_against_baselines logs nothing of a part-played match
        seat = g % 2
        returns = play(game, [ours, theirs] if seat == 0 else [theirs, ours])
        results.append(np.sign(returns[seat]))
    if not results:
        return float("nan"), float("nan")
    results = np.asarray(results)
    return float(np.mean((results + 1) / 2)), float(np.mean(results > 0))


def evaluate_against_baselines(game, evaluate, cfg: AlphaZeroConfig, seed) -> dict:
    """The network's greedy search against OpenSpiel's MCTS bot at equal simulations, and against random play."""
    from open_spiel.python.algorithms import mcts

    def ours(state):
        return most_visited(search(state, evaluate, cfg.simulations, cfg.c_puct))

    metrics = {}
    if cfg.eval_games:
        bot_rng = np.random.RandomState(np.random.SeedSequence(seed).generate_state(1))
        bot = mcts.MCTSBot(game, cfg.mcts_uct_c, cfg.simulations, mcts.RandomRolloutEvaluator(1, bot_rng), solve=True,
                           random_state=bot_rng)
        metrics["eval/vs_mcts/score"], metrics["eval/vs_mcts/win_rate"] = match_score(game, ours, bot.step,
                                                                                    cfg.eval_games)
    if cfg.eval_random_games:
        rng = np.random.default_rng([*seed, 1])
        metrics["eval/vs_random/score"], metrics["eval/vs_random/win_rate"] = match_score(
            game, ours, lambda state: int(rng.choice(state.legal_actions())), cfg.eval_random_games)
    # A stop (SIGTERM) waits for the checkpoint that follows, and hundreds of searched games could outlast its grace.
    return {} if stop_requested() else metrics


# -- the run ------------------------------------------------------------------------------------

@scoped_run
def train(cfg: AlphaZeroConfig) -> dict:
    game = load_game(cfg.env_id)
    run = start_run(cfg, "alphazero", cfg.env_id)
    obs_size, num_actions = int(np.prod(game.observation_tensor_shape())), game.num_distinct_actions()
    net = PolicyValueNet(obs_size, num_actions, cfg.hidden).to(cfg.device)
    optimizer = Adam(net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    memory = GameMemory(cfg.replay_size, obs_size, num_actions)
    components = {"model": net, "optimizer": optimizer, "memory": memory}
    counters = run.begin(components)  # restores the checkpoint when resuming
    first, games = counters.get("iteration", 0), counters.get("games", 0)
    trained_seconds = counters.get("trained_seconds", 0.0)
    evaluate = NetworkEvaluator(net, cfg.device)
    progress = ProgressBar(cfg.iterations * cfg.games_per_iteration, "alphazero", start=games, enabled=cfg.progress)
    clock = Clock(games)

    net.eval()
    last_eval = {}
    if first == 0:  # before any training: the untrained network's search
        last_eval = evaluate_against_baselines(game, evaluate, cfg, [cfg.seed, 0])
        if not last_eval:  # a stop cut it short: the resumed run starts here again
            run.save(components, games=0, iteration=0, trained_seconds=0.0)
        run.log(0, {**last_eval, "perf/trained_seconds": 0.0})
    unlogged = counters.get("unlogged")
    if unlogged is not None:  # the row of an iteration whose evaluation a stop cut short: played now, then logged
        last_eval = evaluate_against_baselines(game, evaluate, cfg, [cfg.seed, first])
        if not last_eval:  # stopped again
            run.save(components, games=games, iteration=first, trained_seconds=trained_seconds, unlogged=unlogged)
        run.log(games, {**unlogged, **last_eval})
        if last_eval:  # played: a later resume (of a run whose last evaluation this was) owes nothing
            run.save(components, games=games, iteration=first, trained_seconds=trained_seconds)
    for iteration in range(first, cfg.iterations):
        # Each iteration draws from its own generator: a resumed run plays the games an uninterrupted one would.
        rng = np.random.default_rng([cfg.seed, iteration + 1])
        started = time.perf_counter()

        # 1. Self-play: positions with their visit distributions and outcomes into the memory.
        outcomes, lengths = [], []
        for _ in range(cfg.games_per_iteration):
            observations, policies, targets, returns = self_play(game, evaluate, cfg, rng)
            memory.add(observations, policies, targets)
            outcomes.append(np.sign(returns[0]))
            lengths.append(len(targets))
        games += cfg.games_per_iteration

        # 2. Fit the policy to the visit distributions and the value to the outcomes.
        net.train()
        policy_losses, value_losses = [], []
        for _ in range(cfg.train_steps):
            obs, pi, z = memory.sample(min(cfg.batch_size, memory.size), rng, cfg.device)
            logits, value = net(obs)
            policy_loss = -(pi * F.log_softmax(logits, dim=-1)).sum(-1).mean()
            value_loss = F.mse_loss(value, z)
            loss = policy_loss + value_loss
            check_finite(loss, games)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            policy_losses.append(policy_loss.item())
            value_losses.append(value_loss.item())
        evaluate.forget()  # the network's answers changed with its weights
        net.eval()
        trained_seconds += time.perf_counter() - started

        # 3. Evaluate now and then, log, checkpoint.
        last = iteration == cfg.iterations - 1
        metrics = {
            "losses/policy_loss": float(np.mean(policy_losses)) if policy_losses else float("nan"),
            "losses/value_loss": float(np.mean(value_losses)) if value_losses else float("nan"),
            "charts/first_player_score": float(np.mean((np.asarray(outcomes) + 1) / 2)),
            "charts/game_length": float(np.mean(lengths)), "charts/replay_size": memory.size,
            "perf/games_per_second": clock.sps(games), "perf/trained_seconds": trained_seconds,
        }
        if (iteration + 1) % cfg.eval_every == 0 or last:
            last_eval = evaluate_against_baselines(game, evaluate, cfg, [cfg.seed, iteration + 1])
            if not last_eval:  # a stop cut it short: the resumed run plays it and logs this row (it was lost)
                run.save(components, games=games, iteration=iteration + 1, trained_seconds=trained_seconds,
                         unlogged=metrics)
            metrics.update(last_eval)
        run.log(games, metrics)
        progress.update(games, vs_mcts=last_eval.get("eval/vs_mcts/score"))
        if last or checkpoint_due(iteration + 1, iteration, cfg.checkpoint_every):  # a stop or the clock too
            run.save(components, games=games, iteration=iteration + 1, trained_seconds=trained_seconds)
    progress.close()
    plot_path = run.close(plot=cfg.plot, metric="eval/vs_mcts/score")
    shown = ", ".join(f"{k} {v:.2f}" for k, v in last_eval.items() if k in ("eval/vs_mcts/score",
                                                                            "eval/vs_random/win_rate"))
    run.say(f"run: {run.dir}", *([f"learning curve: {plot_path}"] if plot_path else []),
            f"{games} self-play games, {trained_seconds:.0f} s of self-play and training; last evaluation "
            f"({cfg.simulations} simulations per move, the MCTS bot too): {shown or 'none'}")
    return {"run_dir": str(run.dir), "games": games, "trained_seconds": trained_seconds,
            "plot": str(plot_path) if plot_path else None, **last_eval}
