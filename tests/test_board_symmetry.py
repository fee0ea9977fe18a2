"""Tic-tac-toe's 8 board symmetries and connect four's mirror (envs/games/symmetry.py) and the
network that averages over them (models/control.py, PPO's --symmetric, the tictactoe preset's):
the cell permutations by hand, the observation and mask layouts against the libraries' own
boards, and the policy and value the same on symmetric positions."""

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo", reason="needs the [games] extra")
pytest.importorskip("pyspiel", reason="needs the [games] extra")

from omnigym.cli import main  # noqa: E402
from omnigym.envs.games import make_game  # noqa: E402
from omnigym.envs.games.symmetry import board_symmetries, mirror_symmetries, square_symmetries  # noqa: E402
from omnigym.models.control import ActorCritic  # noqa: E402

TIC_TAC_TOE = ("pettingzoo/tictactoe_v3", "openspiel/tic_tac_toe")
BOARDS = (*TIC_TAC_TOE, "pettingzoo/connect_four_v3", "openspiel/connect_four")
# per game: moves that put pieces on every kind of cell (tic-tac-toe: a corner, the centre, an edge; connect
# four: both edges, the middle, a stacked column), and a game the first seat wins (tic-tac-toe: X's top row;
# connect four: X's four in column 0)
GAMES = {"tic_tac_toe": ((0, 4, 5, 2, 6), (0, 4, 1, 5, 2)), "connect_four": ((0, 3, 1, 1, 6, 2, 5), (0, 1, 0, 1, 0, 1, 0))}


def game_moves(env_id):
    return GAMES["connect_four" if "connect_four" in env_id else "tic_tac_toe"]


def test_the_eight_cell_permutations_checked_by_hand():
    cells = square_symmetries()
    # 0 1 2      a quarter turn (counter-clockwise)  2 5 8     the transpose  0 3 6
    # 3 4 5      holds, cell by cell, the original   1 4 7                    1 4 7
    # 6 7 8      cells                               0 3 6                    2 5 8
    hand = {(0, 1, 2, 3, 4, 5, 6, 7, 8), (2, 5, 8, 1, 4, 7, 0, 3, 6), (8, 7, 6, 5, 4, 3, 2, 1, 0),
            (6, 3, 0, 7, 4, 1, 8, 5, 2), (0, 3, 6, 1, 4, 7, 2, 5, 8), (2, 1, 0, 5, 4, 3, 8, 7, 6),
            (8, 5, 2, 7, 4, 1, 6, 3, 0), (6, 7, 8, 3, 4, 5, 0, 1, 2)}
    assert {tuple(row) for row in cells} == hand and tuple(cells[0]) == tuple(range(9))
    # a group: every composition is one of the eight; the centre never moves, corners stay corners
    assert all(tuple(a[b]) in hand for a in cells for b in cells)
    assert (cells[:, 4] == 4).all() and set(cells[:, 0]) == {0, 2, 6, 8}


def test_connect_fours_mirror_checked_by_hand():
    """On a 2 x 3 board (0 1 2 / 3 4 5) the mirror holds 2 1 0 / 5 4 3, and its column k stands for
    column 2 - k; connect four's own (6 x 7) mirrors every row and never moves a piece up or down."""
    cells, columns = mirror_symmetries(2, 3)
    assert cells.tolist() == [[0, 1, 2, 3, 4, 5], [2, 1, 0, 5, 4, 3]] and columns.tolist() == [[0, 1, 2], [2, 1, 0]]
    cells, columns = mirror_symmetries()
    assert cells.shape == (2, 42) and (cells[1] // 7 == np.arange(42) // 7).all() and columns[1].tolist() == [6, 5, 4, 3, 2, 1, 0]
    assert (cells[1][cells[1]] == np.arange(42)).all()  # mirrored twice is the board itself


@pytest.mark.parametrize("env_id", BOARDS)
def test_a_transformed_game_is_the_libraries_own_board_transformed(env_id):
    """Play a game, and the same game with every move mapped by a symmetry: the second
    library board's observation and mask are the first's, permuted as board_symmetries says."""
    features, actions = board_symmetries(env_id)
    moves, won = game_moves(env_id)
    for g in range(len(actions)):
        original, mirrored = make_game(env_id), make_game(env_id)
        original.reset(seed=0), mirrored.reset(seed=0)
        to_view = np.argsort(actions[g])  # original action -> the transformed board's action
        for move in moves:
            original.step(move), mirrored.step(int(to_view[move]))
            seat = original.current()
            assert np.array_equal(mirrored.observation(seat), original.observation(seat)[features[g]]), (env_id, g)
            assert np.array_equal(mirrored.legal_mask(), original.legal_mask()[actions[g]]), (env_id, g)
        # a game that ends: the first seat's line, mapped, is a winning line of the library's own board too
        original, mirrored = make_game(env_id), make_game(env_id)
        original.reset(seed=0), mirrored.reset(seed=0)
        for move in won:
            original.step(move), mirrored.step(int(to_view[move]))
        assert np.array_equal(mirrored.returns(), original.returns()) and original.returns()[0] == 1, (env_id, g)


def test_the_pettingzoo_layout_by_hand():
    """X on cell 0 (a corner) and O on cell 1 (an edge), seen by the next mover (X): plane 0 is
    the mover's marks, feature 2 * cell + plane. The quarter turn's board holds cell 2 at 0,
    cell 5 at 1, cell 8 at 2, cell 1 at 3: so X's mark (cell 0) shows at 6, O's (cell 1) at 3."""
    features, actions = board_symmetries("pettingzoo/tictactoe_v3")
    game = make_game("pettingzoo/tictactoe_v3")
    game.step(0), game.step(1)
    obs = game.observation(game.current())
    assert obs[0] == 1 and obs[3] == 1 and obs.sum() == 2  # cell 0 plane 0, cell 1 plane 1
    turn = next(g for g in range(8) if tuple(actions[g]) == (2, 5, 8, 1, 4, 7, 0, 3, 6))
    view = obs[features[turn]]
    assert view[2 * 6 + 0] == 1 and view[2 * 3 + 1] == 1 and view.sum() == 2
    assert list(game.legal_mask()[actions[turn]]) == [True, True, True, False, True, True, False, True, True]


@pytest.mark.parametrize("env_id", BOARDS)
def test_the_symmetric_network_plays_symmetric_positions_alike_and_a_plain_one_does_not(env_id):
    features, actions = board_symmetries(env_id)
    game = make_game(env_id)
    for move in (0, 5, 4):
        game.step(move)
    obs = torch.as_tensor(game.observation(game.current()))[None]
    mask = torch.as_tensor(game.legal_mask())[None]
    space = gym.spaces.Box(-np.inf, np.inf, obs.shape[1:], np.float32)

    def logits_and_value(net, g):
        view, view_mask = obs[:, features[g]], mask[:, actions[g]]
        logits = net.head.masked_logits(net.actor_torso(net.encoder(view)), view_mask)[0]
        return logits, net.value(view)[0]

    torch.manual_seed(0)
    for symmetric in (True, False):
        net = ActorCritic(space, gym.spaces.Discrete(mask.shape[1]), (16,), (features, actions) if symmetric else None)
        for module in net.modules():  # large weights: a plain network's views then differ clearly
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight)
        logits, value = logits_and_value(net, 0)
        alike = []
        for g in range(1, len(actions)):
            view_logits, view_value = logits_and_value(net, g)
            # the view's action i is the original action actions[g, i]
            alike.append(torch.allclose(view_logits, logits[actions[g]], atol=1e-4)
                         and torch.allclose(view_value, value, atol=1e-5))
        assert all(alike) if symmetric else not any(alike), (symmetric, alike)
    assert sorted(net.state_dict()) == sorted(ActorCritic(space, gym.spaces.Discrete(mask.shape[1]), (16,), (features, actions))
                                              .state_dict())  # a checkpoint's keys are a plain network's


def test_the_tictactoe_preset_is_symmetric_and_symmetric_elsewhere_is_one_line(tmp_path, monkeypatch, capsys):
    from omnigym.algos.control.ppo import PPOConfig

    cfg, line = PPOConfig(env_id="pettingzoo/tictactoe_v3", self_play=True).apply_preset()
    assert cfg.symmetric and "--symmetric" in line
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "--env-id", "openspiel/breakthrough", "--symmetric", "--run-dir", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--symmetric knows the board symmetries of tic-tac-toe and connect four" in err[0], err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("env_id", BOARDS)
def test_the_rollouts_numpy_actor_averages_the_views_as_torch_does(env_id):
    """The collector samples with the numpy actor (models/numpy_actor.py): its log-probs are the
    symmetric torch actor's, masks respected, not those of the network's plain (unaveraged) view."""
    from omnigym.models.numpy_actor import NumpyActor

    game = make_game(env_id)
    rng = np.random.default_rng(0)
    obs, masks = [], []
    for _ in range(32):  # positions from random games
        game.reset(seed=int(rng.integers(1000)))
        for _ in range(rng.integers(0, 5)):  # a game ends in 5 moves at the soonest
            game.step(random_legal(game, rng))
        obs.append(game.observation(game.current())), masks.append(game.legal_mask())
    obs, masks = np.stack(obs), np.stack(masks)
    space = gym.spaces.Box(-np.inf, np.inf, obs.shape[1:], np.float32)
    torch.manual_seed(0)
    net = ActorCritic(space, gym.spaces.Discrete(masks.shape[1]), (16,), board_symmetries(env_id))
    with torch.no_grad():
        for p in net.head.parameters():
            p.add_(torch.randn_like(p))
    actor = NumpyActor.of(net)
    assert actor is not None and actor.views is not None
    actions, log_probs = actor.act(obs, np.random.default_rng(1), masks)
    assert masks[np.arange(len(obs)), actions].all()
    with torch.no_grad():
        _, torch_log_probs, _, _ = net.act(torch.from_numpy(obs), torch.from_numpy(actions), torch.from_numpy(masks))
    np.testing.assert_allclose(log_probs, torch_log_probs.numpy(), rtol=1e-5, atol=1e-5)


def random_legal(game, rng):
    return int(rng.choice(np.flatnonzero(game.legal_mask())))


def test_a_symmetric_run_evaluates_and_exports_its_averaged_policy(tmp_path, capsys):
    """eval and export rebuild the network from the run's config: a plain one would load the
    same weights (the keys are the same) and play another policy. The export checks its actions
    against the checkpoint's on probe observations; a traced len(obs) froze the batch size."""
    run = str(tmp_path / "run")
    assert main(["train", "ppo", "--env-id", "pettingzoo/tictactoe_v3", "--total-timesteps", "256", "--num-envs", "2",
                 "--num-steps", "32", "--run-dir", run, "--no-progress", "--no-plot"]) == 0
    assert "--symmetric" in capsys.readouterr().out  # the preset's
    assert main(["eval", run, "--episodes", "2"]) == 0
    assert main(["export", run, "--format", "torchscript"]) == 0
    assert "its actions equal the checkpoint policy's" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--env-id", "openspiel/breakthrough", "--symmetric"], "--symmetric knows the board symmetries of tic-tac-toe"),
    (["--env-id", "openspiel/conect_four", "--symmetric"], "openspiel/conect_four is not one: did you mean "
                                                           "openspiel/connect_four?"),
    (["--env-id", "pettingzoo/tictactoe_v3", "--symmetric", "--normalize-obs"], "statistics are not symmetric"),
    # another board than the layout's: the views indexed past the observation (an IndexError traceback)
    (["--env-id", "openspiel/connect_four", "--env-kwargs", "columns=5", "--symmetric"],
     "--symmetric knows openspiel/connect_four's standard board (128 observation features, 7 moves); this one has "
     "92 and 5"),
])
def test_symmetric_where_it_cannot_hold_is_one_line(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "ppo", "--self-play", *flags, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_the_tictactoe_preset_on_another_board_leaves_symmetric_out():
    """The preset's --symmetric is for the boards it knows: on breakthrough the preset applies the
    rest and trains without it, as before the flag existed (it was refused, naming a flag never typed)."""
    from omnigym.algos.control.ppo import PPOConfig

    cfg, _ = PPOConfig(env_id="openspiel/breakthrough", self_play=True, preset="tictactoe").apply_preset(set())
    cfg.check()
    assert not cfg.symmetric and cfg.ent_coef == 0.05
    cfg, _ = PPOConfig(env_id="pettingzoo/tictactoe_v3", self_play=True, preset="tictactoe").apply_preset(set())
    assert cfg.symmetric
