"""Threat planes (``--env-kwargs threats=True``, envs/games/threats.py): against a plain scan
of the board on random positions of each library's boards, by hand on one position, moved by
the board symmetries as the board is, through a self-play run's train, eval and export, and
one line for settings they do not fit."""

import numpy as np
import pytest

pytest.importorskip("pettingzoo", reason="needs the [games] extra")
pytest.importorskip("pyspiel", reason="needs the [games] extra")

from omnigym.cli import main  # noqa: E402
from omnigym.envs.games import make_game  # noqa: E402
from omnigym.envs.games.symmetry import board_symmetries  # noqa: E402
from omnigym.envs.games.threats import BOARDS, WithThreats, lines_of  # noqa: E402


def scanned_threats(sides, rows, cols, k):
    """The threats by walking out from each empty cell in the four directions: a side's piece
    there would make a run of k or more of its pieces."""
    sides = sides.reshape(2, rows, cols)
    planes = np.zeros_like(sides)
    for side in range(2):
        for r in range(rows):
            for c in range(cols):
                if sides[:, r, c].any():
                    continue
                for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
                    run = 1
                    for sign in (1, -1):
                        rr, cc = r + sign * dr, c + sign * dc
                        while 0 <= rr < rows and 0 <= cc < cols and sides[side, rr, cc]:
                            run, rr, cc = run + 1, rr + sign * dr, cc + sign * dc
                    planes[side, r, c] = max(planes[side, r, c], float(run >= k))
    return planes.reshape(2, -1)


def random_positions(env_id, count, seed=0):
    game, rng = WithThreats(env_id, make_game(env_id)), np.random.default_rng(seed)
    for _ in range(count):
        game.reset(seed=int(rng.integers(1000)))
        for _ in range(rng.integers(0, 30)):
            if game.done():
                break
            game.step(int(rng.choice(np.flatnonzero(game.legal_mask()))))
        yield game


def test_the_lines_counted_by_hand():
    assert len(lines_of(3, 3, 3)) == 8  # 3 rows, 3 columns, 2 diagonals
    assert len(lines_of(6, 7, 4)) == 24 + 21 + 12 + 12  # rows, columns, each diagonal: 69
    assert {tuple(line) for line in lines_of(3, 3, 3)} >= {(0, 4, 8), (2, 4, 6), (0, 3, 6), (6, 7, 8)}


@pytest.mark.parametrize("env_id", BOARDS)
def test_the_planes_are_a_plain_scan_of_the_board(env_id):
    rows, cols, k, sides_of = BOARDS[env_id]
    seen = 0
    for game in random_positions(env_id, 60):
        obs = game.observation(0 if game.done() else game.current())  # a finished game has no seat to move
        sides = sides_of(obs, rows * cols)
        assert set(np.unique(sides)) <= {0.0, 1.0} and sides.sum(0).max() <= 1  # two sides' pieces, no cell twice
        planes = obs[game.inner.obs_size:].reshape(2, -1)
        np.testing.assert_array_equal(planes, scanned_threats(sides, rows, cols, k))
        seen += int(planes.any())
    assert seen >= 10  # the positions had threats to find


@pytest.mark.parametrize("env_id", ["openspiel/connect_four", "pettingzoo/connect_four_v3"])
def test_three_in_the_bottom_row_threatens_both_ends(env_id):
    """X plays columns 3, 4, 5 and O stacks on 3 and 4: X threatens the bottom cells of columns 2 and 6."""
    game = WithThreats(env_id, make_game(env_id))
    game.reset(seed=0)
    for column in (3, 3, 4, 4, 5):
        game.step(column)
    obs = game.observation(game.current())  # O's turn: PettingZoo's first plane is O's
    planes = obs[game.inner.obs_size:].reshape(2, 6, 7)
    x_plane, bottom = (0, 0) if env_id.startswith("openspiel") else (1, 5)  # OpenSpiel's row 0 is the bottom
    assert np.flatnonzero(planes[x_plane][bottom]).tolist() == [2, 6] and planes.sum() == 2
    game.step(2)  # O blocks one end
    planes = game.observation(game.current())[game.inner.obs_size:].reshape(2, 6, 7)
    assert np.flatnonzero(planes[0][bottom]).tolist() == [6]  # X to move: the first plane on both boards


@pytest.mark.parametrize("env_id", BOARDS)
def test_a_symmetry_moves_the_planes_as_it_moves_the_board(env_id):
    features, actions = board_symmetries(env_id, threats=True)
    for g in range(1, len(actions)):
        to_view = np.argsort(actions[g])
        rng = np.random.default_rng(g)
        original, mapped = WithThreats(env_id, make_game(env_id)), WithThreats(env_id, make_game(env_id))
        original.reset(seed=0), mapped.reset(seed=0)
        while not original.done():
            move = int(rng.choice(np.flatnonzero(original.legal_mask())))
            original.step(move), mapped.step(int(to_view[move]))
            seat = original.current() if not original.done() else 0
            assert np.array_equal(mapped.observation(seat), original.observation(seat)[features[g]]), (env_id, g)


def test_a_run_with_threat_planes_trains_evaluates_and_exports(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(["train", "ppo", "--self-play", "--env-id", "openspiel/connect_four", "--symmetric",
                 "--env-kwargs", "threats=True", "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "64",
                 "--eval-every", "2", "--eval-games", "2", "--run-dir", run, "--no-progress", "--no-plot"]) == 0
    capsys.readouterr()
    assert main(["eval", run, "--episodes", "2"]) == 0
    assert main(["export", run, "--format", "torchscript"]) == 0
    assert "its actions equal the checkpoint policy's" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, message", [
    (["threats=True"], "--env-kwargs threats=True knows the k-in-a-row boards"),
    (["threats=yes"], "--env-kwargs threats= takes True or False, got 'yes'"),
    (["threats=True", "rows=5"], "knows openspiel/connect_four's standard game (6x7, 4 in a row); this one has rows=5"),
    # the same board size, so the same observation size: the planes marked lines of four on connect three
    (["threats=True", "x_in_row=3"], "knows openspiel/connect_four's standard game (6x7, 4 in a row); this one has "
                                     "x_in_row=3"),
    (["threats=True", "threats=False"], "--env-kwargs gives threats twice; give it once"),
])
def test_threats_where_they_do_not_fit_are_one_line(tmp_path, capsys, kwargs, message):
    env_id = "openspiel/breakthrough" if kwargs == ["threats=True"] else "openspiel/connect_four"
    flags = ["--self-play"] if len(kwargs) > 1 else []
    run = tmp_path / "run"
    assert main(["train", "ppo", *flags, "--env-id", env_id, "--env-kwargs", *kwargs, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1, err
    assert not run.exists()
