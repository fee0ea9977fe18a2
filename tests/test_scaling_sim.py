"""bench/scaling_sim.py agrees with the closed forms of the RL step-time model, and rejects bad input."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "bench" / "scaling_sim.py"
_spec = importlib.util.spec_from_file_location("scaling_sim", SCRIPT)
sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim)

BASE = dict(generators=4, trainers=2, samples_per_step=64, gen_s_per_sample=0.5, train_s_per_sample=0.25)


@pytest.mark.parametrize("extra", [
    {},
    {"sync_s": 1.5},
    {"gen_concurrency": 4, "param_bytes": 2e9, "allreduce_gbps": 10, "updates_per_step": 3,
     "sync_gbps": 20, "sync_latency_s": 0.3},
    {"generators": 8, "trainers": 1, "gen_concurrency": 2, "sync_s": 0.0},
])
def test_sync_without_jitter_is_gen_plus_train_plus_sync(extra):
    kw = {**BASE, **extra}
    N, M, S = kw["generators"], kw["trainers"], kw["samples_per_step"]
    gen = S * kw["gen_s_per_sample"] / N  # S divides by N * C here, so no partial round
    allreduce = kw.get("updates_per_step", 1) * 2 * (M - 1) / M * kw.get("param_bytes", 0) / (
        kw.get("allreduce_gbps", 50) * 1e9)
    train = S * kw["train_s_per_sample"] / M + allreduce
    sync = kw.get("sync_s", kw.get("param_bytes", 0) / (kw.get("sync_gbps", 50) * 1e9) + kw.get("sync_latency_s", 0))
    r = sim.simulate(**kw, mode="sync", steps=12)
    assert r["step_s"] == pytest.approx(gen + train + sync, rel=1e-12)
    assert r["samples_per_s"] == pytest.approx(S / (gen + train + sync), rel=1e-12)
    assert r["staleness_hist"] == {0: 64 * (12 - 3)}
    assert r["gen_idle_pct"] == pytest.approx(100 * (train + sync) / (gen + train + sync))
    assert r["trainer_idle_pct"] == pytest.approx(100 * gen / (gen + train + sync))


@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("gen_s, train_s, sync_s", [(0.5, 0.05, 1.0), (0.1, 0.12, 1.0), (0.2, 0.1, 2.4)])
def test_async_without_jitter_approaches_max_of_gen_and_train_plus_sync(K, gen_s, train_s, sync_s):
    r = sim.simulate(**{**BASE, "gen_s_per_sample": gen_s, "train_s_per_sample": train_s}, sync_s=sync_s,
                     mode="async", max_staleness=K, steps=60, warmup=20)
    gen, train = 64 * gen_s / 4, 64 * train_s / 2
    assert r["step_s"] == pytest.approx(max(gen, train + sync_s), rel=1e-6)
    assert r["dropped_pct"] == 0
    assert r["step_s"] < gen + train + sync_s


@pytest.mark.parametrize("K", [0, 1, 2, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_staleness_never_exceeds_K(K, seed):
    r = sim.simulate(**BASE, gen_concurrency=4, sync_s=0.7, jitter=1.0, seed=seed, mode="async",
                     max_staleness=K, steps=40, warmup=0)
    assert r["staleness_hist"] and max(r["staleness_hist"]) <= K and min(r["staleness_hist"]) >= 0
    assert sum(r["staleness_hist"].values()) == 40 * 64
    if K == 0:
        assert r["staleness_hist"] == {0: 40 * 64} and r["dropped_pct"] == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("jitter", [0.0, 0.5])
def test_more_generators_never_lower_throughput(mode, jitter):
    rates = [sim.simulate(**{**BASE, "generators": n}, gen_concurrency=2, sync_s=0.5, jitter=jitter,
                          jitter_cap=4.0, mode=mode, max_staleness=2, steps=30)["samples_per_s"]
             for n in range(1, 9)]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(rates, rates[1:])), rates
    assert rates[-1] > rates[0]


def test_tokens_and_bandwidths_give_the_same_times_as_seconds():
    by_tokens = sim.simulate(generators=2, trainers=2, samples_per_step=32, tokens_per_sample=1000,
                             gen_tokens_per_s=2000, prompt_tokens=500, train_tokens_per_s=3000,
                             param_bytes=1e9, sync_gbps=10, sync_latency_s=0.2, allreduce_gbps=1e3, steps=8)
    by_seconds = sim.simulate(generators=2, trainers=2, samples_per_step=32, gen_s_per_sample=0.5,
                              train_s_per_sample=0.5, sync_s=0.3 + 1e-3, steps=8)
    assert by_tokens["step_s"] == pytest.approx(by_seconds["step_s"], rel=1e-12)


def test_validate_prints_predicted_against_measured(tmp_path, capsys):
    runs = [{"name": "sync", "mode": "sync", "generators": 4, "trainers": 2, "samples_per_step": 64,
             "gen_seconds_per_step": 8.0, "train_seconds_per_step": 8.0, "sync_seconds": 1.0,
             "samples_per_s": 64 / 17, "mean_staleness": 0.0},
            {"name": "async K=1", "mode": "async", "max_staleness": 1, "generators": 4, "trainers": 2,
             "samples_per_step": 64, "gen_seconds_per_step": 8.0, "train_seconds_per_step": 8.0,
             "sync_seconds": 1.0, "samples_per_s": 2 * 64 / 9}]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    sim.main(["--validate", str(tmp_path / "runs.json")])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[1].split()[-4:] == ["3.765", "1.00", "0.00", "0.00"]
    assert lines[2].split()[-5:] == ["7.111", "14.222", "0.50", "1.00", "-"]


def run_script(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60,
                          env={"OMP_NUM_THREADS": "1", "PATH": ""})


@pytest.mark.parametrize("argv", [
    ["--generators", "0", "--gen-seconds-per-sample", "1", "--train-seconds-per-sample", "1"],
    ["--trainers", "-2", "--gen-seconds-per-sample", "1", "--train-seconds-per-sample", "1"],
    ["--samples-per-step", "0", "--gen-seconds-per-sample", "1", "--train-seconds-per-sample", "1"],
    ["--mode", "async", "--max-staleness", "-1", "--gen-seconds-per-sample", "1", "--train-seconds-per-sample", "1"],
    ["--gen-seconds-per-sample", "-1", "--train-seconds-per-sample", "1"],
    ["--gen-seconds-per-sample", "nan", "--train-seconds-per-sample", "1"],
    ["--generators", "two"],
    ["--validate", "no/such/file.json"],
    ["--validate", "MALFORMED"],
    ["--validate", "BADRUN"],
])
def test_bad_input_exits_2_with_one_line(argv, tmp_path):
    (tmp_path / "bad.json").write_text('[{"mode": "sync", "samples_per_step": 8,')
    (tmp_path / "run.json").write_text(json.dumps([{"mode": "sync", "samples_per_step": 8, "generators": 0,
                                                     "gen_seconds_per_step": 1, "train_seconds_per_step": 1,
                                                     "sync_seconds": 0, "samples_per_s": 1}]))
    argv = [{"MALFORMED": str(tmp_path / "bad.json"), "BADRUN": str(tmp_path / "run.json")}.get(a, a) for a in argv]
    done = run_script(*argv)
    assert done.returncode == 2, done
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("scaling_sim.py: error: "), done.stderr


def test_simulate_rejects_bad_input():
    for bad in ({"generators": 0}, {"samples_per_step": -3}, {"gen_s_per_sample": 0}, {"jitter": -1},
                {"mode": "fast"}, {"steps": 4, "warmup": 4}):
        with pytest.raises(ValueError):
            sim.simulate(**{**BASE, "mode": "async", **bad})
    with pytest.raises(ValueError):
        sim.simulate(**BASE, mode="async", max_staleness=-1)
