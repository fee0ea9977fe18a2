"""AlphaZero on OpenSpiel games (algos/control/alphazero.py): the search finds a forced win and
spends exactly its simulations, value targets are each mover's own outcome, evaluation gives
OpenSpiel's MCTS bot the same simulations, a resumed run equals an uninterrupted one, bad games
are one line with nothing written, and (slow) tic-tac-toe self-play beats the MCTS bot it lost to."""

import json

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel", reason="needs the [games] extra: pip install 'omnigym[games]'")

from omnigym.algos.control import alphazero as az  # noqa: E402
from omnigym.cli import main  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from test_bad_input import snapshot  # noqa: E402

TTT = pyspiel.load_game("tic_tac_toe")


def uniform(state):
    """An evaluator that knows nothing: equal priors, value 0. What the search finds, it finds by searching."""
    legal = state.legal_actions()
    return legal, np.full(len(legal), 1.0 / len(legal)), 0.0


def position(*moves):
    state = TTT.new_initial_state()
    for move in moves:
        state.apply_action(move)
    return state


def small(tmp_path, name, **overrides):
    values = dict(iterations=3, games_per_iteration=4, simulations=8, train_steps=4, batch_size=16, eval_every=1,
                  eval_games=2, eval_random_games=2, checkpoint_every=1, hidden=(16,), run_dir=str(tmp_path / name),
                  progress=False, plot=False, tensorboard=False, seed=3)
    return az.AlphaZeroConfig(**{**values, **overrides})


def rows(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


@pytest.mark.parametrize("moves, win", [
    ((0, 3, 1, 4), 2),      # x: 0 1 _, o: 3 4 _ -> x completes the top row
    ((0, 4, 8, 2, 1), 6),   # o to move: o holds 2 and 4 -> 6 completes the anti-diagonal
])
def test_search_finds_the_winning_move_with_no_knowledge(moves, win):
    state = position(*moves)
    root = az.search(state, uniform, simulations=200, c_puct=1.0)
    assert az.most_visited(root) == win
    assert root.children[win].mean() == 1.0  # every descent through it ends in the mover's win
    assert state.history() == list(moves)  # the search played on clones


def test_search_blocks_a_threat_it_cannot_beat():
    # o to move; x threatens 0 1 (2) and o has no win of its own: every other move loses
    root = az.search(position(0, 4, 1), uniform, simulations=400, c_puct=1.0)
    assert az.most_visited(root) == 2


@pytest.mark.parametrize("simulations", [1, 7, 50])
def test_visit_counts_sum_to_the_simulations(simulations):
    rng = np.random.default_rng(0)
    root = az.search(TTT.new_initial_state(), uniform, simulations, c_puct=2.0, rng=rng, noise=(0.25, 1.0))
    assert sum(child.visits for child in root.children.values()) == simulations
    pi = az.visit_distribution(root, TTT.num_distinct_actions())
    assert pi.sum() == pytest.approx(1.0) and (pi * simulations).round().sum() == simulations


def test_root_noise_changes_the_priors_but_keeps_them_a_distribution():
    root = az.search(TTT.new_initial_state(), uniform, 1, c_puct=2.0, rng=np.random.default_rng(1), noise=(0.25, 0.3))
    priors = np.array([child.prior for child in root.children.values()])
    assert priors.sum() == pytest.approx(1.0) and priors.std() > 0.01  # uniform before the noise


def test_value_targets_are_each_movers_own_outcome():
    cfg = az.AlphaZeroConfig(simulations=4, temperature_moves=9)
    decisive = 0
    for seed in range(20):
        observations, policies, targets, returns = az.self_play(TTT, uniform, cfg, np.random.default_rng(seed))
        # players alternate in tic-tac-toe, x (player 0) first
        assert targets == [returns[i % 2] for i in range(len(targets))]
        assert len(observations) == len(policies) == len(targets)
        assert all(p.sum() == pytest.approx(1.0) for p in policies)
        decisive += returns[0] != 0
    assert decisive >= 5  # the check above saw wins and losses, not only draws (where both views agree)


def test_memory_keeps_the_newest_positions():
    memory = az.GameMemory(3, obs_size=2, num_actions=2)
    memory.add([[i, i] for i in range(5)], [[1, 0]] * 5, [1, -1, 1, -1, 1])
    assert memory.size == 3 and sorted(memory.obs[:, 0].tolist()) == [2, 3, 4]


def test_evaluation_gives_the_mcts_bot_the_same_simulations(monkeypatch):
    from open_spiel.python.algorithms import mcts

    made = []
    real = mcts.MCTSBot

    def spy(game, uct_c, max_simulations, evaluator, **kwargs):
        made.append((max_simulations, type(evaluator)))
        return real(game, uct_c, max_simulations, evaluator, **kwargs)

    monkeypatch.setattr(mcts, "MCTSBot", spy)
    cfg = az.AlphaZeroConfig(simulations=13, eval_games=2, eval_random_games=2)
    metrics = az.evaluate_against_baselines(TTT, uniform, cfg, [0, 0])
    assert made == [(13, mcts.RandomRolloutEvaluator)]
    assert set(metrics) >= {"eval/vs_mcts/score", "eval/vs_random/win_rate"}
    assert 0 <= metrics["eval/vs_mcts/score"] <= 1


def test_the_evaluators_memory_plays_the_games_an_evaluator_without_one_plays(tmp_path, monkeypatch):
    """The evaluator keeps its answers until training changes the network: a run logs what it
    logs when every position is evaluated afresh (no answer outlives the weights it came from)."""
    az.train(small(tmp_path, "memory"))
    remembered = az.NetworkEvaluator.__call__
    monkeypatch.setattr(az.NetworkEvaluator, "__call__", lambda self, state: (self.forget(), remembered(self, state))[1])
    az.train(small(tmp_path, "afresh"))
    drop = ("perf/",)
    clean = lambda r: [{k: v for k, v in row.items() if not k.startswith(drop)} for row in r]  # noqa: E731
    assert clean(rows(tmp_path / "memory")) == clean(rows(tmp_path / "afresh"))


def test_a_resumed_run_logs_what_an_uninterrupted_one_does(tmp_path):
    whole = az.train(small(tmp_path, "whole"))
    az.train(small(tmp_path, "cut", iterations=2))
    resumed = az.train(small(tmp_path, "cut", iterations=3, resume=str(tmp_path / "cut"), run_dir=None))
    assert whole["games"] == resumed["games"] == 12

    def comparable(run):
        return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows(tmp_path / run)]

    assert comparable("cut") == comparable("whole")
    assert {"eval/vs_mcts/score", "eval/vs_random/win_rate", "losses/policy_loss", "losses/value_loss"} <= set(
        rows(tmp_path / "whole")[-1])
    assert rows(tmp_path / "whole")[0]["global_step"] == 0  # the evaluation before training


@pytest.mark.parametrize("stopped_evaluation", [1, 3, 4], ids=["before-training", "after-iteration-2", "the-last"])
def test_an_evaluation_a_stop_cut_short_is_played_on_resume(tmp_path, monkeypatch, stopped_evaluation):
    """A SIGTERM during an evaluation makes it give way to the checkpoint (its games could outlast the stop's
    grace); the resumed run went on from the next iteration, and that evaluation's row was lost for good. Here the
    stop is as the CLI's: the evaluation returns nothing, the checkpoint is written, and the process stops."""
    from omnigym.track.run import Run

    az.train(small(tmp_path, "whole"))
    real_evaluation, real_save, calls = az.evaluate_against_baselines, Run.save, {"n": 0, "stopping": False}

    def giving_way(*args):
        calls["n"] += 1
        if calls["n"] == stopped_evaluation:
            calls["stopping"] = True
            return {}
        return real_evaluation(*args)

    def save_then_stop(self, components, **counters):
        real_save(self, components, **counters)
        if calls["stopping"]:
            raise KeyboardInterrupt

    monkeypatch.setattr(az, "evaluate_against_baselines", giving_way)
    monkeypatch.setattr(Run, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        az.train(small(tmp_path, "cut"))
    monkeypatch.undo()
    az.train(small(tmp_path, "cut", resume=str(tmp_path / "cut"), run_dir=None))

    def comparable(run):
        return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows(tmp_path / run)]

    assert comparable("cut") == comparable("whole") and len(rows(tmp_path / "whole")) == 4
    # the last evaluation's resume finished the run: another resume is refused, the log left as it is (the resume
    # of a run stopped in its last evaluation was refused as finished, and its last row never came)
    with pytest.raises(OmnigymError, match="is already at iteration 3 of --iterations 3"):
        az.train(small(tmp_path, "cut", resume=str(tmp_path / "cut"), run_dir=None))
    assert comparable("cut") == comparable("whole")


@pytest.mark.parametrize("env_id, message", [
    ("openspiel/tic_tac_tow", "unknown OpenSpiel game 'tic_tac_tow' in --env-id openspiel/tic_tac_tow"),
    ("openspiel/kuhn_poker", "kuhn_poker has chance events, hidden information"),
    ("openspiel/matrix_rps", "matrix_rps has simultaneous moves"),
    ("openspiel/goofspiel", "goofspiel has simultaneous moves, chance events"),
    ("CartPole-v1", "alphazero plays OpenSpiel games: --env-id openspiel/NAME"),
    ("openspiel/connect_four(rows=x)", "--env-id openspiel/connect_four(rows=x): "),
    # loaded, then crashed the process at the first position (SIGSEGV), or raised in the first game (a traceback)
    ("openspiel/connect_four(rows=0)", "openspiel/connect_four(rows=0) crashed OpenSpiel"),
    ("openspiel/connect_four(columns=0)", "openspiel/connect_four(columns=0) has no legal move in a position before"),
])
def test_a_game_alphazero_cannot_play_is_one_line_and_nothing_is_written(tmp_path, monkeypatch, capsys, env_id,
                                                                         message):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main(["train", "alphazero", "--env-id", env_id]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_tic_tac_toe_self_play_beats_openspiels_mcts_at_equal_simulations(tmp_path):
    """Seed 1: the untrained network's search scored 0.325 against OpenSpiel's MCTS bot (25
    simulations each, 40 games). After 640 self-play games (40 iterations) the trained one scored
    0.7125 on an AMD Zen 3 (docs/alphazero.md; seed 2: 0.3125 -> 0.65), but 0.55 and 0.80 against
    random on an Intel Xeon with AVX-512 (float rounding changes the games played); after 1280
    (80 iterations, what this test runs) 0.675 and 0.95 there (seed 2: 0.6625, 0.85)."""
    cfg = az.AlphaZeroConfig(iterations=80, eval_every=80, eval_games=40, eval_random_games=20, seed=1,
                             run_dir=str(tmp_path / "r"), progress=False, plot=False, tensorboard=False)
    result = az.train(cfg)
    before = rows(tmp_path / "r")[0]
    assert before["global_step"] == 0 and before["eval/vs_mcts/score"] <= 0.45
    assert result["eval/vs_mcts/score"] >= 0.6
    assert result["eval/vs_random/win_rate"] >= 0.85


def test_without_the_games_extra_the_line_names_it(monkeypatch):
    import sys

    from omnigym.errors import OmnigymError

    monkeypatch.setitem(sys.modules, "pyspiel", None)  # import pyspiel raises ImportError
    with pytest.raises(OmnigymError, match=r"open-spiel is not installed; install it with: pip install 'omnigym\[games\]'"):
        az.load_game("openspiel/tic_tac_toe")
