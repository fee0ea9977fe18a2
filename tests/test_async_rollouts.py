"""--rollouts async (runtime/episodes.py, generators/text_episodes.py): episodes that do not wait
for each other, partial rollouts within --max-staleness, DAPO's refill and overlong penalty,
token budgets, and their metrics."""

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("transformers")

from omnigym.envs.text import TextEnv, ToolEnv  # noqa: E402
from omnigym.generators.base import Trajectory  # noqa: E402
from omnigym.generators.text_env import TextEnvGenerator  # noqa: E402
from omnigym.generators.text_episodes import TextEnvEpisodes  # noqa: E402
from omnigym.inference.engine import Sample, SamplingParams  # noqa: E402
from omnigym.inference.service import EngineService  # noqa: E402
from omnigym.models.lm import build_tiny_model, load_tokenizer  # noqa: E402
from omnigym.rewards import WeightedSum  # noqa: E402
from omnigym.rl.overlong import overlong_penalty  # noqa: E402
from omnigym.runtime.episodes import AsyncRollouts  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)))


class TextEngine:
    """Every row answers ``reply(prompt)`` (text), with log-prob -0.5 a token."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.version = tokenizer, reply, 0

    def generate(self, prompts, n, params):
        out = []
        for p in prompts:
            text = self.reply(self.tokenizer.decode(p))
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:params.max_new_tokens]
            finished = len(ids) < params.max_new_tokens
            ids += [self.tokenizer.eos_token_id] if finished else []
            out.append([Sample(p, ids, [-0.5] * len(ids), finished) for _ in range(n)])
        return out

    def update_weights(self, named_tensors, version):
        self.version = version


class SlowEnv(TextEnv):
    """Single-turn; the reply to the question "slow" takes ``delay`` seconds."""

    delay = 2.0

    def respond(self, text):
        if self.example["question"] == "slow":
            time.sleep(self.delay)
        return super().respond(text)


def correct(completions, examples):
    import torch

    return torch.tensor([float(e["answer"] in c) for c, e in zip(completions, examples)])


def test_a_slow_episode_does_not_stall_the_step(tokenizer):
    """One example's env takes 2 s to answer. The batch-synchronous generator waits for it;
    the asynchronous scheduler trains its first step on the other prompts' groups, long before."""
    examples = [{"question": "slow", "answer": "1"}] + [{"question": f"q{i}", "answer": "1"} for i in range(7)]
    env = SlowEnv(examples, correct)
    engine = TextEngine(tokenizer, lambda prompt: "1")
    begin = time.perf_counter()
    TextEnvGenerator(env, engine, tokenizer, SamplingParams(max_new_tokens=8)).generate(examples[:2], 2)
    assert time.perf_counter() - begin >= SlowEnv.delay  # the baseline waits for the slowest

    service = EngineService(engine)
    rollouts = AsyncRollouts(TextEnvEpisodes(env, service, tokenizer, SamplingParams(max_new_tokens=8)),
                             lambda k: examples[2 * k % 8:2 * k % 8 + 2], group_size=2, prompts_per_step=2,
                             concurrency=8, max_staleness=1, close_source=service.close)
    try:
        rollouts.update_weights([], 0)
        begin = time.perf_counter()
        batch = rollouts.trajectories(0)
        took = time.perf_counter() - begin
    finally:
        rollouts.close()
    questions = [t.example["question"] for t in batch.items]
    assert took < SlowEnv.delay / 2, took
    assert "slow" not in questions and len(questions) == 4
    assert questions[0] == questions[1] and questions[2] == questions[3]  # whole groups, adjacent
    assert batch.group_ids().tolist() == [0, 0, 1, 1] and batch.rewards().tolist() == [1.0] * 4


class VersionedSource:
    """Episodes of example ``wait`` k wait until the policy is k versions newer than when they
    started; each returns one token per version it saw, stamped with it."""

    def __init__(self, short_seconds=0.5):
        self.version, self.short_seconds, self.count = 0, short_seconds, 0

    def update_weights(self, named_tensors, version):
        self.version = version

    async def play(self, example, group_id):
        start = self.version
        self.count += 1
        reward = float(self.count % 2)  # the two episodes of a group differ
        if example["wait"] == 0:
            await asyncio.sleep(self.short_seconds)
        while self.version < start + example["wait"]:
            await asyncio.sleep(0.005)
        versions = list(range(start, self.version + 1))
        return [Trajectory([1], [2] * len(versions), [1] * len(versions), [-0.5] * len(versions), reward, group_id,
                           start, example, {"versions": versions, "turns": len(versions)})]


def test_partial_rollouts_older_than_max_staleness_are_never_trained_on():
    """Group 0 runs across two weight updates (tokens of versions 0..2), group 1 across one (0..1),
    later groups within one version. With --max-staleness 1, group 0 is dropped whenever it is
    drawn; group 1 is trained on at step 1, its tokens' versions 0 and 1 within the bound."""
    stream = [{"name": "two", "wait": 2}, {"name": "one", "wait": 1}]
    rollouts = AsyncRollouts(VersionedSource(), lambda k: stream if k == 0 else [{"name": f"s{k}", "wait": 0}] * 2,
                             group_size=2, prompts_per_step=2, concurrency=16, max_staleness=1)
    trained, logged = {}, []
    try:
        rollouts.update_weights([], 0)
        for step in range(5):
            batch = rollouts.trajectories(step)
            logged.append(rollouts.metrics())
            for t in batch.items:
                trained.setdefault(t.example["name"], []).append((step, t.info["versions"]))
                assert step - min(t.info["versions"]) <= 1  # nothing older than K is handed to the trainer
            rollouts.update_weights([], step + 1)
    finally:
        rollouts.close()
    assert "two" not in trained
    assert sum(m["rollout/dropped_stale"] for m in logged) >= 1
    assert trained["one"] == [(1, [0, 1]), (1, [0, 1])]  # a partial rollout carried over one update
    assert logged[1]["rollout/staleness_max"] == 1.0 and 0 < logged[1]["rollout/staleness_mean"] <= 1
    assert all(m["rollout/staleness_max"] <= 1 for m in logged)
    assert rollouts.state_dict() == {"groups_taken": 10 + sum(int(m["rollout/dropped_stale"]) for m in logged)}


class RewardSource:
    """Example ``flat``: both episodes score 1 (no signal); ``mixed``: 0 and 1."""

    def __init__(self):
        self.played = 0

    def update_weights(self, named_tensors, version):
        pass

    async def play(self, example, group_id):
        self.played += 1
        reward = 1.0 if example["kind"] == "flat" else float(self.played % 2)
        return [Trajectory([1], [2], [1], [-0.5], reward, group_id, 0, example, {"versions": [0], "turns": 1})]


@pytest.mark.parametrize("kinds, dynamic, drawn, kept_kinds", [
    (["flat", "mixed", "flat", "mixed"], True, 4, ["mixed", "mixed"]),  # two dropped, two refilled
    (["flat"] * 8, True, 6, ["flat", "flat"]),                          # the cap (3 x 2): trains on what it has
    (["flat", "mixed"] * 2, False, 2, ["flat", "mixed"]),               # off: the first two, flat included
])
def test_dynamic_sampling_refills_the_batch_up_to_the_cap(kinds, dynamic, drawn, kept_kinds):
    stream = [{"kind": kind, "i": i} for i, kind in enumerate(kinds)] + [{"kind": "mixed", "i": 99}] * 8
    rollouts = AsyncRollouts(RewardSource(), lambda k: stream[2 * k:2 * k + 2], group_size=2, prompts_per_step=2,
                             concurrency=1, max_staleness=1, dynamic_sampling=dynamic, max_refill_factor=3.0)
    try:
        rollouts.update_weights([], 0)
        batch = rollouts.trajectories(0)
        metrics = rollouts.metrics()
    finally:
        rollouts.close()
    assert [t.example["kind"] for t in batch.items[::2]] == kept_kinds and len(batch) == 4
    assert metrics["rollout/refill_rate"] == pytest.approx((drawn - 2) / 2)
    assert metrics["rollout/dropped_zero_variance"] == (drawn - kept_kinds.count("mixed") if dynamic else 0)


def test_a_failing_episode_costs_its_group_not_the_run():
    class Failing(RewardSource):
        async def play(self, example, group_id):
            if example["kind"] == "boom":
                raise RuntimeError("tool crashed")
            return await super().play(example, group_id)

    stream = [{"kind": "boom"}, {"kind": "mixed"}, {"kind": "mixed"}, {"kind": "mixed"}]
    rollouts = AsyncRollouts(Failing(), lambda k: stream[2 * k:2 * k + 2], group_size=2, prompts_per_step=2,
                             concurrency=1, max_staleness=1)
    try:
        rollouts.update_weights([], 0)
        batch = rollouts.trajectories(0)
        metrics = rollouts.metrics()
    finally:
        rollouts.close()
    assert len(batch) == 4 and metrics["rollout/dropped_error"] == 1.0


def test_overlong_penalty_values():
    """DAPO eq. 13 with L_max 20, L_cache 4: nothing up to 16 tokens, then -1/4 a token, -1 past 20."""
    assert [overlong_penalty(n, 20, 4) for n in (0, 16, 17, 18, 19, 20, 21)] == [0, 0, -0.25, -0.5, -0.75, -1, -1]
    assert overlong_penalty(20, 20, 0) == 0.0


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_overlong_penalty_and_token_budgets_in_both_schedules(tokenizer, schedule):
    """A reply of 19 generated tokens under --max-new-tokens 20 and --overlong-buffer 4 scores
    1 - 0.75; a model that calls the calculator every turn is cut by --max-episode-tokens in
    its third reply (truncated, reward 0: the env never reads the fragment)."""
    answer = "<answer>1</answer>"
    assert len(tokenizer(answer, add_special_tokens=False)["input_ids"]) + 1 == 19  # and end-of-sequence
    call = '<tool name="calculator">1+1</tool>'
    call_tokens = len(tokenizer(call, add_special_tokens=False)["input_ids"]) + 1

    single = TextEnv([{"question": "q", "answer": "1"}], WeightedSum({"math": 1.0}))
    looping = ToolEnv([{"question": "q", "answer": "2"}], WeightedSum({"math": 1.0}), max_turns=8)
    budget = 2 * call_tokens + 5  # two whole calls, and 5 tokens of the third

    def play(env, reply, **kwargs):
        engine = TextEngine(tokenizer, lambda prompt: reply)
        params = SamplingParams(max_new_tokens=40 if "max_episode_tokens" in kwargs else 20)
        if schedule == "sync":
            return TextEnvGenerator(env, engine, tokenizer, params, **kwargs).generate(env.examples, 1).items[0]
        service = EngineService(engine)
        try:
            return asyncio.run(TextEnvEpisodes(env, service, tokenizer, params, **kwargs).play(env.examples[0], 0))[0]
        finally:
            service.close()

    scored = play(single, answer, overlong_buffer=4)
    assert scored.reward == pytest.approx(0.25) and scored.info["reward_parts"] == {"math": 1.0, "overlong": -0.75}
    cut = play(looping, call, max_episode_tokens=budget)
    assert sum(cut.loss_mask) == budget and cut.info["turns"] == 3
    assert (cut.info["truncated"], cut.info["budget_cut"], cut.reward) == (True, True, 0.0)
    assert cut.info["tool_calls"] == 2 and cut.info["cut_off"] and len(cut.info["versions"]) == len(cut.response_ids)


def small(run_dir, **extra):
    from omnigym.algos import grpo

    flags = dict(sft_steps=0, steps=4, prompts_per_step=2, group_size=4, eval_size=4, eval_every=10,
                 checkpoint_every=2, progress=False, plot=False, tensorboard=False, rewards="keyword:1.0",
                 rollouts="async")
    return grpo.GRPOConfig(run_dir=str(run_dir), **{**flags, **extra})


def letters_task(tmp_path):
    """A reward an untrained model already earns sometimes (letters in its reply)."""
    task = tmp_path / "letters.jsonl"
    task.write_text("\n".join(json.dumps({"question": f"Say {i}.", "answer": "-", "keywords": ["a", "e", "o"]})
                              for i in range(40)))
    return str(task)


def rows(run_dir):
    return [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]


def test_grpo_with_async_rollouts_trains_the_tiny_model(tmp_path, monkeypatch):
    import torch

    from omnigym.algos import grpo

    seen, original = {}, grpo.policy_steps

    def watched(cfg, trainer, *args, **kwargs):
        seen.setdefault("before", {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        out = original(cfg, trainer, *args, **kwargs)
        seen["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        seen["threads"] = {t.name for t in threading.enumerate()}
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    cfg = small(tmp_path / "run", task=letters_task(tmp_path))
    assert cfg.behaviour_cap_in_effect() == 2.0  # stale tokens are weighted by min(pi_old / mu, 2)
    grpo.train(cfg)
    logged = [r for r in rows(tmp_path / "run") if "reward/mean" in r]
    assert len(logged) == 4
    changed = [n for n in seen["before"] if not torch.equal(seen["before"][n], seen["after"][n])]
    assert len(changed) >= len(seen["before"]) // 2
    for row in logged:
        assert row["rollout/staleness_max"] <= 1 and row["perf/samples_per_second"] > 0
        assert row["episode/turns"] == 1 and 0 < row["episode/length_p50"] <= row["episode/length_max"] <= 24
        assert row["rollout/refill_rate"] >= 0
    assert any(r["rollout/staleness_mean"] > 0 for r in logged)  # later steps train on the previous policy's samples
    ours = {"omnigym-episodes", "omnigym-engine"}
    assert ours <= seen["threads"] and not ours & {t.name for t in threading.enumerate()}  # closed with the run


def test_an_async_run_resumes_mid_way(tmp_path, monkeypatch):
    """Interrupted after step 3 (a checkpoint at step 2), the resumed run logs steps 3 and 4
    and draws its prompts from where the checkpoint's steps stopped."""
    from omnigym.algos import grpo
    from omnigym.runtime import episodes
    from interrupts import interrupt_at_log

    task = letters_task(tmp_path)
    interrupt_at_log(monkeypatch, lambda: grpo.train(small(tmp_path / "cut", task=task)), n=3)
    starts, feed = [], episodes.AsyncRollouts._feed

    def recorded(self, first):
        starts.append(first)
        return feed(self, first)

    monkeypatch.setattr(episodes.AsyncRollouts, "_feed", recorded)
    grpo.train(small(tmp_path / "cut", task=task, resume=str(tmp_path / "cut")))
    assert [r["global_step"] for r in rows(tmp_path / "cut") if "reward/mean" in r] == [1, 2, 3, 4]
    assert len(starts) == 1 and starts[0] >= 4  # two steps of two groups at least were taken before the checkpoint


@pytest.mark.parametrize("flags, message", [
    (["--concurrency", "4"], "--concurrency: read by --rollouts async only"),
    (["--dynamic-sampling"], "--dynamic-sampling: read by --rollouts async only"),
    (["--rollouts", "later"], "unknown --rollouts 'later'; choose sync or async"),
    (["--rollouts", "async", "--max-staleness", "0"], "--rollouts async needs --max-staleness 1 or more"),
    (["--rollouts", "async", "--runtime", "ray"], "does not combine with --runtime ray"),
    (["--rollouts", "async", "--dynamic-sampling", "--max-refill-factor", "0.5"],
     "--max-refill-factor must be at least 1"),
    (["--overlong-buffer", "24"], "--overlong-buffer 24 must be less than the limit it comes before (24 tokens)"),
    (["--env", "tools", "--overlong-buffer", "4"], "--overlong-buffer in a multi-turn env needs --max-episode-tokens"),
    (["--max-episode-tokens", "-1"], "--max-episode-tokens must be 0 or more, got -1"),
    (["--rollouts", "async", "--engine", "vllm"], "it does not run --engine vllm yet"),
    (["--rollouts", "async", "--overlap-scoring", "2"], "--overlap-scoring is for --rollouts sync"),
    (["--overlap-scoring", "0"], "--overlap-scoring must be positive, got 0"),
    (["--prompts-per-step", "4", "--overlap-scoring", "5"], "--overlap-scoring 5 is more than the 4 prompts of a step"),
    (["--engine", "vllm", "--training-backend", "fsdp2"], "--training-backend fsdp2 (FSDP2) keeps a shard"),
    (["--engine", "vllm", "--training-backend", "deepspeed", "--deepspeed-config", "configs/deepspeed/zero3.json"],
     "--training-backend deepspeed (ZeRO-3) keeps a shard"),
])
def test_bad_flag_combinations_get_one_line_and_no_run_dir(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_bad_combination_through_the_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "grpo", "--run-dir", str(tmp_path / "run"),
                           "--rollouts", "async", "--max-staleness", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["omnigym: error: --rollouts async needs --max-staleness 1 or more (a "
                                                "step trains while the next episodes sample; 0 is --rollouts sync)"]
    assert not (tmp_path / "run").exists()


def test_the_math_reward_scores_in_a_worker_thread():
    """math-verify's timeout is SIGALRM, which a worker thread cannot set: it used to raise there
    and every answer scored 0 (the async episodes score in threads)."""
    from omnigym.rewards.text import math_reward

    scores = []
    worker = threading.Thread(target=lambda: scores.extend([math_reward("<answer>1/2</answer>", {"answer": "0.5"}),
                                                            math_reward("<answer>3</answer>", {"answer": "0.5"})]))
    worker.start()
    worker.join()
    assert scores == [1.0, 0.0]


def test_the_scheduling_section_command_runs_as_written(tmp_path):
    """docs/agents.md's scheduling section: its command, run as a user would."""
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "agents.md").read_text()
    section = page.split("## Scheduling: rollouts that don't wait")[1].split("\n## ")[0]
    commands = [line for block in re.findall(r"```bash\n(.*?)```", section, re.DOTALL) for line in block.splitlines()
                if line.strip()]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "omnigym"
        done = subprocess.run([sys.executable, "-m", "omnigym", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    logged = rows(tmp_path / "runs" / "async-demo")
    assert len([r for r in logged if "reward/mean" in r]) == 2 and all("rollout/staleness_mean" in r for r in logged)


@pytest.mark.slow
def test_grpo_with_async_rollouts_learns(tmp_path):
    """The bench's task without its latencies: a reply succeeds when it contains an "e". Greedy,
    the untrained tiny model never writes one (held-out success 0); 20 async steps (seed 0,
    staleness up to 1) bring it to every held-out prompt (measured 3 times: 0.0 -> 1.0; sampled reward,
    mean of the first and last 5 steps, 0.44 -> 0.99 and 0.36 -> 0.99)."""
    from omnigym.algos import grpo

    task = tmp_path / "e.jsonl"
    task.write_text("\n".join(json.dumps({"question": f"Say {i}.", "answer": "-", "keywords": ["e"]})
                              for i in range(200)))
    out = grpo.train(small(tmp_path / "run", task=str(task), steps=20, prompts_per_step=8, group_size=4,
                           learning_rate=1e-3, max_new_tokens=16, eval_size=32, eval_every=20, checkpoint_every=20,
                           seed=0))
    assert out["accuracy_before"] == 0.0 and out["accuracy_after"] >= 0.9
    logged = [r for r in rows(tmp_path / "run") if "reward/mean" in r]
    assert sum(r["reward/mean"] for r in logged[-5:]) / 5 > sum(r["reward/mean"] for r in logged[:5]) / 5 + 0.3


def test_the_bench_env_is_seeded_and_heavy_tailed(tmp_path):
    """bench/async_rollouts.py's env: the n-th episode gets the n-th draw of a seeded stream (the
    two schedules see the same episodes), with the turn and latency tails its docstring states;
    a bad flag is one line from argparse."""
    import random
    from pathlib import Path

    path = Path(__file__).parent.parent / "bench" / "async_rollouts.py"
    sys.path.insert(0, str(path.parent))
    try:
        import async_rollouts as bench
    finally:
        sys.path.remove(str(path.parent))

    def draws(seed, n=4000):
        env = bench.heavy_tail_env(seed=seed)
        out = []
        for _ in range(n):
            env.reset(options={"example": random.choice(env.examples)})
            out.append((env.length, tuple(env.latencies)))
        return out

    first, again, other = draws(0), draws(0), draws(1)
    assert first == again and first != other
    turns = [t for t, _ in first]
    latencies = sorted(x for _, lat in first for x in lat)
    assert 0.62 < turns.count(1) / len(turns) < 0.70 and 0.10 < turns.count(4) / len(turns) < 0.14
    assert 0.075 < latencies[len(latencies) // 2] < 0.095 and latencies[int(0.99 * len(latencies))] > 1.2
    assert max(latencies) <= 3.0
    done = subprocess.run([sys.executable, str(path), "--steps", "3", "--png", str(tmp_path / "c.png")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].endswith(
        "--steps must be at least 5 (the first two and the last steps are not timed), got 3")
