"""The official ``tinker`` SDK and tinker-cookbook recipes, unchanged, against ``omnigym serve``.

Each test starts the real server (``python -m omnigym serve``) on 127.0.0.1 in a subprocess on
the tiny model, and either drives the SDK in this process (the Tinker docs' pig-Latin
"training and sampling" walk-through, which is a user's script, see docs/serve.md) or runs a
cookbook recipe's own entry point in a subprocess with only ``base_url``, the model, the
renderer and sizes changed on its chz command line. The commands are the ones docs/serve.md
gives.

The model folder is ``<tmp>/meta-llama/Llama-3.2-1B``: ``sl_loop`` has no renderer option and
picks one from the model *name* through the cookbook's table of hosted models (a plain local path
is "Unknown model" there), while the cookbook's tokenizer loader and the server both read that
name as a local folder when one exists relative to the working directory. The tiny model stands
in for the Llama in that folder; nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the [serve] extra (tinker SDK) is not installed")
pytest.importorskip("chz", reason="the [serve] extra (chz, for tinker-cookbook) is not installed")
if importlib.util.find_spec("tinker_cookbook") is None:
    pytest.skip("tinker-cookbook is not installed (make setup installs it with --no-deps)",
                allow_module_level=True)
if importlib.util.find_spec("omnigym.serve.app") is None or importlib.util.find_spec("omnigym.serve.hub") is None:
    pytest.skip("omnigym serve's HTTP layer (serve/app.py) or compute (serve/hub.py) is missing",
                allow_module_level=True)

MODEL_NAME = "meta-llama/Llama-3.2-1B"  # a folder under the working directory, see the docstring
SERVER_START_S = 120
RECIPE_TIMEOUT_S = 600
SRC = Path(__file__).resolve().parents[1] / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, base_url: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        # the SDK insists on a key shaped like Tinker's even where the server asks for none
        TINKER_API_KEY="tml-local-test",
        # HF and the cookbook write caches and runs under HOME; keep them in the test's folder
        HOME=str(home),
        HF_HOME=str(home / "hf"),
        TINKER_COOKBOOK_RUNS_DIR=str(home / "runs"),
    )
    if base_url:
        env["TINKER_BASE_URL"] = base_url
    return env


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny model served by ``omnigym serve`` from a working folder that holds it under
    MODEL_NAME; yields (working folder, base_url). The server is stopped at the end."""
    from omnigym.models.lm import build_tiny_model

    work = tmp_path_factory.mktemp("serve_recipes")
    # guess_number's system prompt alone is ~240 characters (tokens, to this character-level
    # tokenizer) and an episode runs up to 10 turns: 2048 positions hold one. The rubric
    # recipe's grader asks for max_tokens=2048 (fixed in its code) after a ~500-token prompt,
    # which the server refuses (413) past the context: 4096 positions hold both.
    build_tiny_model(work / MODEL_NAME, max_positions=4096, seed=0)
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    log = open(work / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "omnigym", "serve", "--base-model", MODEL_NAME,
         "--host", "127.0.0.1", "--port", str(port), "--store", str(work / "store")],
        cwd=work, env=_env(work), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"omnigym serve exited ({proc.returncode}):\n{(work / 'server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/api/v1/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"omnigym serve did not answer healthz in {SERVER_START_S}s")
            time.sleep(0.5)
        with tinker_clients_closed():  # before the server goes: an open client heartbeats on
            yield work, base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


STABLE_REINFORCE_REFUSED = "'stable_reinforce' is not supported by this server"


def _run_recipe(work: Path, base_url: str, module: str, *args: str, url_flag: bool = True) -> subprocess.CompletedProcess:
    """A cookbook recipe's own entry point, as a user runs it: ``python -m MODULE key=value ...``.
    The server's URL goes in its ``base_url`` field, or (``url_flag=False``, a recipe without
    one) in ``TINKER_BASE_URL``, which the SDK reads when ``base_url`` is None."""
    cmd = [sys.executable, "-m", module, *([f"base_url={base_url}"] if url_flag else []), *args]
    done = subprocess.run(cmd, cwd=work, env=_env(work, None if url_flag else base_url), capture_output=True,
                          text=True, timeout=RECIPE_TIMEOUT_S)
    if done.returncode != 0 and STABLE_REINFORCE_REFUSED in done.stderr:
        # the cookbook's RL default; a recipe without a loss_fn option cannot avoid it
        pytest.skip(f"{module} trains with stable_reinforce, which this server answers not supported")
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def _metrics(log_path: Path) -> list[dict]:
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert rows, f"no metrics in {log_path}"
    return rows


# --- the Tinker docs' pig-Latin walk-through, with the SDK in this process -------------------

# the walk-through's examples and their tokens, as bench/serve_overhead.py times them
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from serve_helpers import tinker_clients_closed  # noqa: E402
from serve_overhead import examples  # noqa: E402


def test_sdk_pig_latin_loss_falls_then_samples_from_saved_weights(served, monkeypatch):
    import numpy as np
    import tinker
    from tinker import types

    work, base_url = served
    # as a user runs it: beside the model folder, with a key of Tinker's shape
    monkeypatch.chdir(work)
    monkeypatch.setenv("TINKER_API_KEY", "tml-local-test")
    service = tinker.ServiceClient(base_url=base_url)
    training = service.create_lora_training_client(base_model=MODEL_NAME, rank=8).result()
    tokenizer = training.get_tokenizer()
    # prompt tokens weigh 0 and the answer's 1; inputs and targets are the sequence shifted by one
    data = [types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs={"target_tokens": targets,
                                                                                         "weights": weights})
            for tokens, targets, weights in examples(tokenizer)]

    losses = []
    for _ in range(6):
        fb = training.forward_backward(data, "cross_entropy")
        opt = training.optim_step(types.AdamParams(learning_rate=1e-3))
        out = fb.result()
        opt.result()
        logprobs = np.concatenate([o["logprobs"].tolist() for o in out.loss_fn_outputs])
        weights = np.concatenate([d.loss_fn_inputs["weights"].tolist() for d in data])
        losses.append(float(-np.dot(logprobs, weights) / weights.sum()))
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] - 0.1, f"loss per answer token did not fall: {losses}"

    # saved under a name (SDK 0.38 deprecates the name of save_weights_and_get_sampling_client),
    # then sampled from by its tinker:// path
    saved = training.save_weights_for_sampler(name="pig-latin-model").result()
    assert saved.path.endswith("/sampler_weights/pig-latin-model"), saved.path
    sampler = service.create_sampling_client(model_path=saved.path).result()
    prompt = types.ModelInput.from_ints(tokenizer.encode("English: coffee break\nPig Latin:"))
    result = sampler.sample(prompt=prompt, num_samples=3,
                            sampling_params=types.SamplingParams(max_tokens=12, temperature=0.0, stop=["\n"])).result()
    assert len(result.sequences) == 3
    for seq in result.sequences:
        assert 1 <= len(seq.tokens) <= 12
        assert len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0.0 for lp in seq.logprobs)
    # greedy from the same weights: every sample is the same text
    assert len({tuple(s.tokens) for s in result.sequences}) == 1


# --- cookbook recipes, run by their own entry points ------------------------------------------

def _write_no_robots(work: Path, n: int = 24) -> None:
    """``sl_loop`` loads the hub dataset ``HuggingFaceH4/no_robots`` by name and offers no
    local-file option; ``datasets.load_dataset`` reads a local folder of that name first, so
    the test writes a small one (the same ``messages`` column) instead of downloading."""
    folder = work / "HuggingFaceH4" / "no_robots"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as f:
        for i in range(n):
            a, b = i % 7, i % 5
            f.write(json.dumps({"prompt_id": str(i), "category": "Chat", "messages": [
                {"role": "user", "content": f"add {a} and {b}"},
                {"role": "assistant", "content": f"{a} + {b} = {a + b}"}]}) + "\n")


def test_cookbook_sl_loop_unchanged_loss_falls(served):
    work, base_url = served
    _write_no_robots(work)
    log_path = work / "runs" / "sl_loop"
    _run_recipe(work, base_url, "tinker_cookbook.recipes.sl_loop",
                f"model_name={MODEL_NAME}", f"log_path={log_path}", "batch_size=4",
                "max_steps=6", "learning_rate=1e-3", "lora_rank=8", "save_every=0")
    nll = [row["train_mean_nll"] for row in _metrics(log_path) if "train_mean_nll" in row]
    assert len(nll) == 6, nll
    assert nll[-1] < nll[0], f"sl_loop's train_mean_nll did not fall: {nll}"
    # its final checkpoint (state and sampler weights) is listed where the recipe resumes from
    checkpoints = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert checkpoints[-1]["name"] == "final" and checkpoints[-1]["state_path"].startswith("tinker://")


def _reward_rows(log_path: Path) -> list[float]:
    rows = _metrics(log_path)
    key = "env/all/reward/total"
    return [row[key] for row in rows if key in row]


def test_cookbook_math_rl_arithmetic_runs_unchanged(served):
    if importlib.util.find_spec("pylatexenc") is None:
        pytest.skip("math_rl's grader needs pylatexenc (the [serve] extra)")
    work, base_url = served
    log_path = work / "runs" / "math_rl"
    _run_recipe(work, base_url, "tinker_cookbook.recipes.math_rl.train",
                f"model_name={MODEL_NAME}", "renderer_name=role_colon", "env=arithmetic",
                "group_size=4", "groups_per_batch=4", "max_tokens=5", "lora_rank=8",
                "learning_rate=1e-4", "max_steps=3", "eval_every=0", "save_every=0",
                # its default loss, stable_reinforce, is answered "not supported" (docs/serve.md)
                "loss_fn=importance_sampling",
                f"log_path={log_path}", "behavior_if_log_dir_exists=delete")
    rewards = _reward_rows(log_path)
    # a random 1M-parameter model earns ~0 on sums; here the recipe has to run its 3 steps
    # (sample groups, score, importance-weighted forward_backward, optim_step) end to end
    assert len(rewards) == 3, rewards
    # reward = correct (1) + 0.1 * (format - 1): between -0.1 and 1
    assert all(-0.1 - 1e-6 <= r <= 1.0 + 1e-6 for r in rewards), rewards


def test_cookbook_guess_number_multi_turn_runs_unchanged(served):
    work, base_url = served
    log_path = work / "runs" / "guess_number"
    # its command line has no base_url: the SDK takes TINKER_BASE_URL
    _run_recipe(work, base_url, "tinker_cookbook.recipes.multiplayer_rl.guess_number.train",
                f"model_name={MODEL_NAME}", "renderer_name=role_colon", "group_size=2",
                "batch_size=2", "max_tokens=4", "learning_rate=1e-4", "max_steps=2",
                "eval_every=0", "save_every=0", f"log_path={log_path}",
                "behavior_if_log_dir_exists=delete", url_flag=False)
    rows = _metrics(log_path)
    assert len(_reward_rows(log_path)) == 2, rows
    # several turns per episode: the environment answered each guess and the model went on
    turns = [row["env/all/turns_per_episode"] for row in rows if "env/all/turns_per_episode" in row]
    assert turns and all(t >= 2 for t in turns), turns


def test_cookbook_text_arena_self_play_runs_unchanged(served):
    """The cookbook's two-player recipe (multiplayer_rl/text_arena): the policy plays TextArena's
    tic-tac-toe against itself, both seats' trajectories trained, then tested against a random
    player. Its command line has no base_url: the SDK takes TINKER_BASE_URL."""
    pytest.importorskip("textarena", reason="the text_arena recipe needs textarena (the [serve] extra)")
    work, base_url = served
    log_path = work / "runs" / "text_arena"
    _run_recipe(work, base_url, "tinker_cookbook.recipes.multiplayer_rl.text_arena.train",
                f"model_name={MODEL_NAME}", "renderer_name=role_colon", "batch_size=4",
                "num_train_datapoints=8", "num_test_datapoints=4", "test_opponent=random", "max_tokens=4",
                "learning_rate=1e-4", "max_steps=2", "eval_every=2", "save_every=0", f"log_path={log_path}",
                "behavior_if_log_dir_exists=delete", url_flag=False)
    rows = _metrics(log_path)
    train_rewards = _reward_rows(log_path)
    assert len(train_rewards) == 2, rows
    # each seat scores in [-1, 1] (an untrained model's unparsable move ends the game at -1)
    assert all(-1.0 - 1e-6 <= r <= 1.0 + 1e-6 for r in train_rewards), train_rewards
    # the test games against the random player ran at step 0 and step 2 and were scored (at most +1:
    # a win; the recipe adds its own penalties below -1)
    tested = [row["test/env/all/reward/total"] for row in rows if "test/env/all/reward/total" in row]
    assert len(tested) == 2 and all(math.isfinite(r) and r <= 1.0 + 1e-6 for r in tested), rows


# --- distillation, prompt distillation and rubric grading (issue 43) ---------------------------

def _weights_moved(work: Path, base_url: str, sampler_path: str, monkeypatch) -> float:
    """Largest change in log-prob, over a fixed token sequence, between the base model and the
    weights a recipe saved for sampling: > 0 only if its training steps changed the weights."""
    import tinker
    from tinker import types

    monkeypatch.chdir(work)
    monkeypatch.setenv("TINKER_API_KEY", "tml-local-test")
    service = tinker.ServiceClient(base_url=base_url)
    tokens = types.ModelInput.from_ints([ord(c) % 64 + 32 for c in "The weather is nice today.\nen"])
    base = service.create_sampling_client(base_model=MODEL_NAME).result().compute_logprobs(tokens).result()
    trained = service.create_sampling_client(model_path=sampler_path).result().compute_logprobs(tokens).result()
    return max(abs(a - b) for a, b in zip(base[1:], trained[1:]))


# prompt_distillation's create_data writes what its teacher (Qwen/Qwen3.6-35B-A3B, fixed in code)
# answers to "which language is this?" as {"messages": [user sentence, assistant label]}; the
# stand-in is a file of that format with the labels written by hand
LANGUAGE_ROWS = [("The weather is nice today.", "en"), ("Il fait beau aujourd hui.", "fr"),
                 ("Hace buen tiempo hoy.", "es"), ("Where is the station?", "en"), ("Ou est la gare?", "fr"),
                 ("Donde esta la estacion?", "es"), ("I like green tea.", "en"), ("J aime le the vert.", "fr"),
                 ("Me gusta el te verde.", "es"), ("Good morning, friend.", "en"), ("Bonjour, mon ami.", "fr"),
                 ("Buenos dias, amigo.", "es")]


@pytest.fixture(scope="module")
def language_teacher(served):
    """prompt_distillation's ``train`` on the stand-in file: its metrics and final sampler path
    (the distillation test's teacher)."""
    work, base_url = served
    with open(work / "prompt_distillation.jsonl", "w") as f:
        for sentence, label in LANGUAGE_ROWS:
            f.write(json.dumps({"messages": [{"role": "user", "content": sentence},
                                             {"role": "assistant", "content": label}]}) + "\n")
    log_path = work / "runs" / "prompt_distillation"
    _run_recipe(work, base_url, "tinker_cookbook.recipes.prompt_distillation.train",
                "file_path=prompt_distillation.jsonl", f"model_name={MODEL_NAME}", "renderer_name=role_colon",
                "batch_size=4", "num_epochs=3", "learning_rate=1e-2", "lora_rank=8", "max_length=512",
                "save_every=0", "eval_every=0", f"log_path={log_path}", "behavior_if_log_dir_exists=delete")
    final = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()][-1]
    return _metrics(log_path), final["sampler_path"]


def test_cookbook_prompt_distillation_train_runs_unchanged(language_teacher):
    rows, sampler_path = language_teacher
    nll = [row["train_mean_nll"] for row in rows if "train_mean_nll" in row]
    # 12 conversations, batch 4, 3 epochs
    assert len(nll) == 9, nll
    # lr 1e-2 on a tiny model spikes now and then (6.42 at step 4 of one run, 4.65 at the last
    # step of another): the median of the last four steps, not the last step alone
    assert statistics.median(nll[-4:]) < nll[0] - 1.0, f"prompt_distillation's train_mean_nll did not fall: {nll}"
    assert sampler_path.startswith("tinker://") and sampler_path.endswith("/sampler_weights/final")


@pytest.mark.slow
def test_cookbook_on_policy_distillation_runs_unchanged(served, language_teacher, monkeypatch):
    """The student (the base model's LoRA) samples; the teacher (the base model with
    prompt_distillation's weights, through ``teacher_checkpoint``) scores every sampled token
    with ``compute_logprobs``; the reverse KL is the advantage. ``dataset=deepmath`` reads the
    hub set ``zwhe99/DeepMath-103K`` by name, and a local folder of that name stands in."""
    work, base_url = served
    _, teacher = language_teacher
    folder = work / "zwhe99" / "DeepMath-103K"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as f:
        for sentence, _ in LANGUAGE_ROWS * 2:
            f.write(json.dumps({"question": sentence}) + "\n")
    log_path = work / "runs" / "distillation"
    _run_recipe(work, base_url, "tinker_cookbook.recipes.distillation.on_policy_distillation",
                f"model_name={MODEL_NAME}", f"teacher_model={MODEL_NAME}", f"teacher_checkpoint={teacher}",
                "renderer_name=role_colon", "dataset=deepmath", "group_size=4", "groups_per_batch=4",
                "max_tokens=8", "lora_rank=8", "learning_rate=1e-2", "max_steps=6", "eval_every=0",
                "save_every=0", f"log_path={log_path}", "behavior_if_log_dir_exists=delete")
    kl = [row["teacher_kl"] for row in _metrics(log_path) if "teacher_kl" in row]
    assert len(kl) == 6, kl
    # the teacher differs from the untrained student (and the weights move, below). Whether
    # teacher_kl falls in 6 steps is not asserted: the recipes' sampling requests carry no seed
    # (the server draws one each), and at lr 1e-2 one fresh-clone CI run went 2.70 -> 3.61 while
    # two others fell (3.76 -> 0.87, 2.25 -> 0.75; docs/serve.md)
    assert all(math.isfinite(k) for k in kl) and kl[0] > 0.5, kl
    final = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()][-1]
    moved = _weights_moved(work, base_url, final["sampler_path"], monkeypatch)
    assert moved > 1e-3, f"the saved weights give the base model's log-probs (largest change {moved})"


@pytest.mark.slow
def test_cookbook_rubric_runs_unchanged(served, monkeypatch):
    """The policy answers, a grader LLM grades each answer against a rubric, the score is the
    reward. The grader is the served base model (``grader_llm_name``; the recipe's default is a
    second base model); the data are the recipe's own ``generate_data`` rows, each rubric's
    ``extraction_regex`` (a per-row field) reading the grader's first digit, since an untrained
    grader never writes ``<score>``: the reward is noise, so this checks the loop, not learning.
    The recipe builds its grader's client without its ``base_url``: the URL goes in
    ``TINKER_BASE_URL``."""
    import random

    from tinker_cookbook.recipes.rubric.generate_data import generate_one

    work, base_url = served
    rng = random.Random(0)
    for name, n in (("rubric_train.jsonl", 8), ("rubric_test.jsonl", 2)):
        with open(work / name, "w") as f:
            for _ in range(n):
                row = json.loads(generate_one(rng).to_json())
                row["rubric_items"][0]["extraction_regex"] = r"(\d)"
                f.write(json.dumps(row) + "\n")
    log_path = work / "runs" / "rubric"
    _run_recipe(work, base_url, "tinker_cookbook.recipes.rubric.train", f"model_name={MODEL_NAME}",
                "renderer_name=role_colon", f"grader_llm_name={MODEL_NAME}", "grader_renderer_name=role_colon",
                "train_jsonl_path=rubric_train.jsonl", "test_jsonl_path=rubric_test.jsonl", "train_group_size=2",
                "groups_per_batch=2", "max_tokens=8", "lora_rank=8", "learning_rate=1e-3", "max_steps=2",
                "eval_every=0", "save_every=0", "loss_fn=importance_sampling", f"log_path={log_path}",
                "behavior_if_log_dir_exists=delete", url_flag=False)
    rewards = _reward_rows(log_path)
    assert len(rewards) == 2 and all(0.0 <= r <= 9.0 for r in rewards), rewards
    final = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()][-1]
    moved = _weights_moved(work, base_url, final["sampler_path"], monkeypatch)
    assert moved > 1e-3, f"the saved weights give the base model's log-probs (largest change {moved})"
