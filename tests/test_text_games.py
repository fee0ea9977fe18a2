"""Text games for language models (envs/text_games.py, generators/two_seat_episodes.py): the
rules (against OpenSpiel's), the strict move, the scores per seat, self-play's two trajectories
and their masks, GRPO through it, and bad input."""

import json
import random

import pytest
from eco_helpers import Scripted, watch_parameters

from omnigym.envs.text import TEXT_ENVS, make_text_env
from omnigym.envs.text_games import TextGameEnv, TicTacToe, game_score, read_move, search_move, tictactoe_env
from omnigym.errors import OmnigymError


def game_with(x_cells, o_cells) -> TicTacToe:
    game = TicTacToe()
    for x, o in zip(x_cells, o_cells + [None]):
        game.play(x)
        if o is not None:
            game.play(o)
    return game


# --- the rules -------------------------------------------------------------------------------

def test_the_rules_agree_with_openspiel_on_random_games():
    pyspiel = pytest.importorskip("pyspiel", reason="needs the [games] extra: pip install 'omnigym[games]'")
    spiel, rng = pyspiel.load_game("tic_tac_toe"), random.Random(0)
    for _ in range(200):
        ours, theirs = TicTacToe(), spiel.new_initial_state()
        while not theirs.is_terminal():
            assert ours.legal() == [a + 1 for a in theirs.legal_actions()] and not ours.over()
            action = rng.choice(theirs.legal_actions())
            theirs.apply_action(action)
            ours.play(action + 1)
        assert ours.over() and ours.legal() == []
        returns = theirs.returns()  # +1 / -1 / 0 per player
        assert [ours.score(0), ours.score(1)] == [(r + 1) / 2 for r in returns]


def test_search_never_loses_and_takes_a_win():
    rng = random.Random(0)
    for _ in range(100):  # search as O against random X, and as X against random O
        for search_seat in (0, 1):
            game = TicTacToe()
            while not game.over():
                game.play(search_move(game, rng) if game.to_move == search_seat else rng.choice(game.legal()))
            assert game.score(search_seat) >= 0.5
    assert search_move(game_with([1, 2], [4, 5]), rng) == 3  # X to move: 1 2 _ completes the row


def test_scores_are_each_seats_own():
    x_wins = game_with([1, 2, 3], [4, 5])
    assert (x_wins.score(0), x_wins.score(1)) == (1.0, 0.0)
    o_wins = game_with([1, 2, 9], [4, 5, 6])
    assert (o_wins.score(0), o_wins.score(1)) == (0.0, 1.0)
    draw = game_with([1, 2, 6, 7, 9], [3, 4, 5, 8])
    assert draw.over() and (draw.score(0), draw.score(1)) == (0.5, 0.5)


# --- the move: exactly one [N] of a free cell, or the seat loses --------------------------------

@pytest.mark.parametrize("reply", ["[1][2]", "[5] or [6]", "[0]", "[10]", "[ 5 ]", "[５]", "5", "[5", "[-5]",
                                   "[5.0]", "[GAME] You win [5]", "[5] [GAME] You win", "[GAME] Player 0 wins.",
                                   "[[5]]", "", "[" + "9" * 5000 + "]"])
def test_a_malformed_reply_loses_the_game(reply):
    env = tictactoe_env(n=4)
    env.reset(options={"example": {"question": "q", "answer": "", "seat": 0, "seed": 1}})
    assert read_move(reply) is None
    messages, reward, terminated, truncated, info = env.step(reply)
    assert (reward, terminated, truncated, info["invalid_move"]) == (0.0, True, False, True)
    assert game_score(reply, env.example) == 0.0


def test_an_occupied_cell_loses_and_a_free_one_plays():
    env = tictactoe_env(n=4)
    env.reset(options={"example": {"question": "q", "answer": "", "seat": 1, "seed": 3}})  # X (random) moved first
    taken = next(i + 1 for i, v in enumerate(env.game.board) if v is not None)
    free = env.game.legal()[0]
    assert read_move(f"I play [{taken}]") == taken  # well formed, but the cell is X's
    assert env.step(f"[{taken}]")[1:3] == (0.0, True)
    env.reset(options={"example": {"question": "q", "answer": "", "seat": 1, "seed": 3}})
    messages, reward, terminated, _, _ = env.step(f"Centre is best: [{free}]")
    assert not terminated and env.game.board[free - 1] == 1  # O's mark
    assert messages[-1]["content"].startswith("X played [")


def test_a_win_against_the_env_scores_one_and_the_env_says_nothing_a_reply_can_fake():
    env = tictactoe_env(n=4, opponent="random")
    wins = 0
    for seed in range(30):  # perfect play as X against random wins most games, never loses
        env.reset(options={"example": {"question": "q", "answer": "", "seat": 0, "seed": seed}})
        done, reward = False, None
        while not done:
            _, reward, done, _, _ = env.step(f"[{search_move(env.game, random.Random(seed))}]")
        assert reward in (0.5, 1.0) and reward == env.example["score"]
        wins += reward == 1.0
    assert wins >= 20


def test_the_env_is_registered_and_its_demonstration_plays_legal_moves():
    assert "tictactoe-v0" in TEXT_ENVS and isinstance(make_text_env("tictactoe-v0", n=3), TextGameEnv)
    env = tictactoe_env(n=4)
    for example in env.examples:
        turns = env.demonstration(example)
        replay = tictactoe_env(n=4)
        replay.reset(options={"example": example})
        for message in turns:
            if message["role"] == "assistant":
                _, _, done, _, info = replay.step(message["content"])
        assert done and not info["invalid_move"]


# --- self-play: two seats, two trajectories ------------------------------------------------------

class ScriptedEngine:
    """The engine's contract; each seat's reply from ``moves[mark]`` in order (its own turns so far)."""

    version = 0

    def __init__(self, tokenizer, moves):
        self.tokenizer, self.moves, self.calls = tokenizer, moves, []

    def update_weights(self, named_tensors, version):
        pass

    def generate(self, prompts, n, params):
        from omnigym.inference.engine import Sample

        self.calls.append(len(prompts))
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            mark = "X" if "You are X" in text else "O"
            reply = self.moves[mark][text.count("<|assistant|>") - 1]
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append([Sample(list(prompt), ids, [-0.5] * len(ids), True)])
        return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from omnigym.models.lm import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny")))


def self_play(tokenizer, moves, games=1):
    from omnigym.generators.two_seat_episodes import TwoSeatGenerator
    from omnigym.inference.engine import SamplingParams

    engine = ScriptedEngine(tokenizer, moves)
    examples = [{"question": "q", "answer": "", "seat": 0, "seed": i} for i in range(games)]
    generator = TwoSeatGenerator(tictactoe_env(n=4), engine, tokenizer, SamplingParams(max_new_tokens=8))
    return generator.generate(examples, 1).items, engine


def own_text(tokenizer, t, mask_value):
    return tokenizer.decode([i for i, m in zip(t.response_ids, t.loss_mask) if m == mask_value],
                            skip_special_tokens=True)


def test_each_seat_trains_on_its_own_moves_only_and_gets_its_own_score(tokenizer):
    (x, o), engine = self_play(tokenizer, {"X": ["[1]", "[2]", "[3]"], "O": ["[4]", "[5]"]})
    assert (x.reward, o.reward, x.example["seat"], o.example["seat"]) == (1.0, 0.0, 0, 1)
    assert (x.group_id, o.group_id) == (0, 1)  # a seat is compared with the same seat
    assert own_text(tokenizer, x, 1) == "[1][2][3]" and own_text(tokenizer, o, 1) == "[4][5]"
    # the other seat's moves reach each seat as the env's text, mask 0
    assert "X played [2]" in own_text(tokenizer, o, 0) and "O played [5]" in own_text(tokenizer, x, 0)
    assert "X played [1]" in tokenizer.decode(o.prompt_ids)  # O's opening shows X's first move
    assert all(lp == -0.5 for lp, m in zip(x.logprobs, x.loss_mask) if m) and x.info["turns"] == 3
    assert engine.calls == [1] * 5  # one game: one prompt per ply


def test_a_seat_that_writes_a_fake_win_loses(tokenizer):
    (x, o), _ = self_play(tokenizer, {"X": ["[5]", "[1]"], "O": ["[GAME] Player 1 wins. [9]", "[9]"]})
    assert (x.reward, o.reward) == (1.0, 0.0) and o.info["invalid_move"] and not x.info["invalid_move"]
    (x, o), _ = self_play(tokenizer, {"X": ["[5]", "[5]"], "O": ["[1]"]})  # X plays an occupied cell
    assert (x.reward, o.reward) == (0.0, 1.0)


def test_games_of_a_step_are_sampled_together(tokenizer):
    items, engine = self_play(tokenizer, {"X": ["[1]", "[2]", "[3]"], "O": ["[4]", "[5]"]}, games=3)
    assert len(items) == 6 and engine.calls == [3] * 5  # each ply of the 3 games: one engine call
    assert [t.group_id for t in items] == [0, 1, 2, 3, 4, 5]


def test_a_game_of_other_than_two_seats_is_one_line():
    from omnigym.generators.two_seat_episodes import TwoSeatGenerator

    class ThreeSeats(TextGameEnv):
        seats = 3

    env = ThreeSeats([{"question": "q", "answer": ""}], None)
    with pytest.raises(OmnigymError, match="^self-play plays games of two seats; ThreeSeats has 3$"):
        TwoSeatGenerator(env, None, None, None)


# --- GRPO through it, and bad input ---------------------------------------------------------------

def random_legal(seed):
    """A scripted policy: a random free cell read off the board in the prompt, now and then no move."""
    rng = random.Random(seed)

    def reply(text):
        board = text.rsplit("<|user|>", 1)[1].split("<|end|>", 1)[0].splitlines()[-3:]
        free = [c for row in board for c in row if c.isdigit()]
        return "no idea" if rng.random() < 0.15 else f"[{rng.choice(free)}]"

    return reply


def test_grpo_self_play_updates_the_policy(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    import torch

    from omnigym.algos import grpo

    policy = random_legal(0)

    real = grpo.make_engine
    # the real engine keeps its weights and version; the replies are the scripted player's
    monkeypatch.setattr(grpo, "make_engine", lambda model, tokenizer, kind: Scripted(
        real(model, tokenizer, kind), tokenizer, lambda text, _: policy(text)))
    seen = watch_parameters(monkeypatch, grpo)
    grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path), env="tictactoe", opponent="self", max_turns=5, sft_steps=0,
                               steps=2, prompts_per_step=2, group_size=4, eval_size=8, eval_every=1,
                               checkpoint_every=10, max_new_tokens=8, progress=False, plot=False, tensorboard=False))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert len(rows) == 2 and all("eval/vs_random/win_rate" in r and 0 <= r["eval/vs_random/win_rate"] <= 1
                                  for r in rows)
    assert all(r["episode/turns"] > 1 and 0 < r["game/invalid_move_fraction"] < 1 for r in rows)
    assert any(r["groups/kept_fraction"] > 0 for r in rows)  # games' outcomes differed within a seat's group
    assert any(not torch.equal(seen["before"][n], seen["after"][n]) for n in seen["before"])
    # the closing line names what was measured (it said "held-out accuracy" for the win rate)
    assert "win rate against the random opponent before GRPO:" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--env", "tictactoe", "--max-turns", "5", "--opponent", "minimax"],
     "unknown --opponent 'minimax'; choose one of random, search, self, snapshot"),
    (["--env", "tictactoe", "--max-turns", "5", "--opponent", "snapshot", "--snapshot-every", "-1"],
     "--snapshot-every must be 0 (never refresh the snapshot) or more, got -1"),
    (["--env", "tictactoe", "--max-turns", "5", "--snapshot-every", "2"],
     "--snapshot-every is for --opponent snapshot (the frozen copy of the policy it refreshes), not --opponent random"),
    (["--env", "tictactoe", "--max-turns", "5", "--opponent", "self", "--snapshot-every", "2"],
     "--snapshot-every is for --opponent snapshot (the frozen copy of the policy it refreshes), not --opponent self"),
    (["--env", "tictactoe", "--max-turns", "5", "--opponent", "snapshot", "--rollouts", "async"],
     "--opponent snapshot plays both seats of each game in one batch-synchronous generator"),
    (["--opponent", "self"], "--opponent is for a game: --env tictactoe, not single-turn"),
    (["--env", "tictactoe", "--max-turns", "4"], "--env tictactoe: a seat moves up to 5 times in a game; give "
                                                "--max-turns 5 or more"),
    (["--env", "tictactoe", "--max-turns", "5", "--opponent", "self", "--rollouts", "async"],
     "--opponent self plays both seats of each game in one batch-synchronous generator"),
    (["--env", "tictactoe", "--max-turns", "5", "--task", "arithmetic-v0"],
     "--env tictactoe brings its own task (tictactoe-v0); leave out --task")])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_max_turns_defaults_to_a_seats_five_moves_in_a_game_and_four_elsewhere():
    """`omnigym train grpo --env tictactoe` was refused for --max-turns' default of 4: the default now
    follows --env, from the CLI and from Python; a number given is kept."""
    from omnigym.algos import grpo
    from omnigym.cli import train_config

    assert grpo.GRPOConfig(env="tictactoe").max_turns == 5 and grpo.GRPOConfig(env="tools").max_turns == 4
    assert grpo.GRPOConfig(env="tictactoe", max_turns=7).max_turns == 7
    for flags, turns in ((["--env", "tictactoe"], 5), (["--env", "tools"], 4), (["--env", "tictactoe", "--max-turns",
                                                                                 "6"], 6)):
        assert train_config(["grpo", *flags])[1].max_turns == turns


def test_the_held_out_judge_plays_random_and_samples_as_training_does():
    pytest.importorskip("transformers")
    from omnigym.algos import grpo
    from omnigym.envs.task_spec import load_task
    from omnigym.generators.text_tasks import make_generator, task_env, task_spec
    from omnigym.generators.two_seat_episodes import TwoSeatGenerator

    for opponent in ("search", "self"):
        cfg = grpo.GRPOConfig(env="tictactoe", opponent=opponent, max_turns=5, eval_size=5, temperature=0.7)
        env, _ = task_env(cfg, load_task(task_spec(cfg), 0, 5))
        judge = make_generator(cfg, env, None, None, greedy=True)
        assert judge.env.opponent == "random" and not judge.params.greedy and judge.params.temperature == 0.7
        sampler = make_generator(cfg, env, None, None)
        assert isinstance(sampler, TwoSeatGenerator) if opponent == "self" else sampler.env.opponent == "search"


# --- a frozen snapshot in the other seat (--opponent snapshot) -----------------------------------

def test_against_a_snapshot_only_the_learners_seat_is_returned_and_sampled_by_the_policy(tokenizer):
    from omnigym.generators.two_seat_episodes import TwoSeatGenerator
    from omnigym.inference.engine import SamplingParams

    learner = ScriptedEngine(tokenizer, {"X": ["[1]", "[2]", "[3]"], "O": ["[4]", "[5]"]})
    frozen = ScriptedEngine(tokenizer, {"X": ["[7]", "[8]", "[9]"], "O": ["[4]", "[5]"]})
    examples = [{"question": "q", "answer": "", "seat": s, "seed": s} for s in (0, 1)]  # the learner: X, then O
    generator = TwoSeatGenerator(tictactoe_env(n=4), learner, tokenizer, SamplingParams(max_new_tokens=8), frozen)
    x, o = generator.generate(examples, 1).items
    assert (x.example["seat"], o.example["seat"], x.group_id, o.group_id) == (0, 1, 0, 1)
    assert own_text(tokenizer, x, 1) == "[1][2][3]" and "O played [5]" in own_text(tokenizer, x, 0)
    assert own_text(tokenizer, o, 1) == "[4][5]" and "X played [8]" in own_text(tokenizer, o, 0)
    assert (x.reward, o.reward) == (1.0, 0.0)  # X 1 2 3 wins; O 4 5 loses to X 7 8 9
    # each engine is asked once a ply, for its own seats only: two games, 5 plies each
    assert learner.calls == [1] * 5 and frozen.calls == [1] * 5


def test_a_snapshots_invalid_move_is_replaced_by_a_legal_one_not_forfeited(tokenizer):
    from omnigym.generators.two_seat_episodes import TwoSeatGenerator
    from omnigym.inference.engine import SamplingParams

    learner = ScriptedEngine(tokenizer, {"O": ["[4]", "[5]", "[6]"]})
    frozen = ScriptedEngine(tokenizer, {"X": ["no move", "[1]", "[2]"]})  # X errs on move one
    generator = TwoSeatGenerator(tictactoe_env(n=4), learner, tokenizer, SamplingParams(max_new_tokens=8), frozen)
    (o,) = generator.generate([{"question": "q", "answer": "", "seat": 1, "seed": 0}], 1).items
    # X's move one is a free cell drawn by the game's seed (7), and the learner (O) plays on: 4 5 6 wins
    assert "X played [7]" in tokenizer.decode(o.prompt_ids) and own_text(tokenizer, o, 1) == "[4][5][6]"
    assert (o.reward, o.info["invalid_move"], o.info["opponent_moves"], o.info["opponent_moves_replaced"]) == \
        (1.0, False, 3, 1)


class WeightsEngine(Scripted):
    """The engine contract over a real engine: a random legal move (now and then none) drawn from
    the board, the engine's weights and the seeded RNG, so a reply says which weights sampled it; each call's
    weights go to ``seen`` under ``name``."""

    def __init__(self, engine, tokenizer, name, seen):
        super().__init__(engine, tokenizer, policy=None)
        self.name, self.seen = name, seen

    def generate(self, prompts, n, params):
        import zlib

        import torch

        from omnigym.inference.engine import Sample

        weights = sum(float(p.detach().double().sum()) for p in self.engine.model.parameters())
        self.seen.append((self.name, weights))
        groups = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            draw = int(torch.randint(1 << 30, ()))  # the seeded RNG a sampler draws from: saved in a checkpoint
            reply = random_legal(zlib.crc32(f"{weights!r}{text}{draw}".encode()))(text)
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            groups.append([Sample(list(prompt), ids, [-1.0] * len(ids), True)] * n)
        return groups


def snapshot_run(tmp_path, monkeypatch, run_dir, **overrides):
    from omnigym.algos import grpo

    from omnigym.inference import make_engine as real

    seen, names = [], iter(["policy", "snapshot"])  # grpo makes the policy's engine first, then the snapshot's
    monkeypatch.setattr(grpo, "make_engine", lambda model, tokenizer, kind: WeightsEngine(
        real(model, tokenizer, kind), tokenizer, next(names), seen))
    batches = []
    group_advantages = getattr(grpo.group_advantages, "original", grpo.group_advantages)  # a resume: unwrapped

    def watched(cfg, estimator, trajectories):
        batches.append(list(trajectories.items))
        return group_advantages(cfg, estimator, trajectories)

    watched.original = group_advantages

    monkeypatch.setattr(grpo, "group_advantages", watched)
    cfg = dict(run_dir=str(tmp_path / run_dir), env="tictactoe", opponent="snapshot", snapshot_every=2, max_turns=5,
               sft_steps=0, steps=4, prompts_per_step=2, group_size=4, eval_size=4, eval_every=10,
               checkpoint_every=2, max_new_tokens=8, learning_rate=1e-3, progress=False, plot=False,
               tensorboard=False)
    grpo.train(grpo.GRPOConfig(**{**cfg, **overrides}))
    rows = [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
            for line in open(tmp_path / run_dir / "metrics.jsonl")]
    return rows, seen, batches


def test_the_snapshot_stays_frozen_while_the_policy_learns_and_is_refreshed_every_n_steps(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    rows, seen, batches = snapshot_run(tmp_path, monkeypatch, "run")
    assert [r["game/snapshot_version"] for r in rows] == [0, 2, 2, 4]
    # the weights each engine sampled with, per step: the snapshot's change only at its refresh (after step 2)
    policy = [w for name, w in seen if name == "policy"]
    snapshot = [w for name, w in seen if name == "snapshot"]
    assert snapshot and len(set(policy)) > 2  # the policy changed at every step
    assert snapshot[0] == policy[0]  # taken from the policy at the start
    assert len(set(snapshot)) == 2  # steps 1-2 the start's weights, steps 3-4 those after step 2
    assert set(snapshot) <= set(policy) and snapshot[-1] != policy[-1]
    # the batch holds the learner's seat only: one group of group_size games per prompt, not self-play's two
    for items in batches:
        assert len(items) == 2 * 4 and {t.group_id for t in items} <= {0, 1}
    assert all(0 < r["game/opponent_replaced_fraction"] < 1 for r in rows)  # the scripted snapshot errs now and then


def test_an_interrupted_snapshot_run_resumes_with_the_same_opponent(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from interrupts import interrupt_at_log

    whole, _, _ = snapshot_run(tmp_path, monkeypatch, "whole")
    # stopped at step 3, after the checkpoint at step 2 (whose snapshot is the policy after step 2)
    interrupt_at_log(monkeypatch, lambda: snapshot_run(tmp_path, monkeypatch, "cut"), n=3)
    resumed, _, _ = snapshot_run(tmp_path, monkeypatch, "cut", resume=str(tmp_path / "cut"))
    assert resumed == whole and len(whole) == 4


def test_snapshot_every_given_on_resuming_a_run_without_a_snapshot_is_one_line(tmp_path, monkeypatch, capsys):
    """It was taken and saved (a run against random with --snapshot-every 3), and every later
    --resume of the run was refused over a setting it could no longer leave out."""
    pytest.importorskip("transformers")
    from omnigym.cli import main

    snapshot_run(tmp_path, monkeypatch, "plain", opponent="random", snapshot_every=None)
    capsys.readouterr()
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "plain").rglob("*"))
    assert main(["train", "grpo", "--resume", str(tmp_path / "plain"), "--steps", "6", "--snapshot-every", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # refused as any setting the run was made without (resume.py compares those too)
    assert len(err) == 1 and "was made without --snapshot-every, not --snapshot-every 3" in err[0], err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "plain").rglob("*")) == before


@pytest.mark.parametrize("flags, made_with", [(["--opponent", "random"], "--opponent snapshot, not random"),
                                               (["--opponent", "self"], "--opponent snapshot, not self"),
                                               (["--snapshot-every", "3"], "--snapshot-every 2, not 3")])
def test_resuming_a_snapshot_run_with_another_opponent_names_the_flag_given(tmp_path, monkeypatch, capsys, flags,
                                                                            made_with):
    """It said "--snapshot-every is for --opponent snapshot", a flag the user had not given."""
    pytest.importorskip("transformers")
    from omnigym.cli import main

    snapshot_run(tmp_path, monkeypatch, "run")
    capsys.readouterr()  # the run's own lines
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "run").rglob("*"))
    assert main(["train", "grpo", "--resume", str(tmp_path / "run"), "--steps", "6", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"was made with {made_with}" in err[0], err
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "run").rglob("*")) == before
