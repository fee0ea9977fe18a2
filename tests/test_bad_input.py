"""Every bad input gets one line on stderr, exit code 2, and leaves the disk as it was.

``CASES`` is also the table of the troubleshooting page: the flags, and the start of the
message a user sees. Each case runs in an empty working directory, and the test checks
that nothing at all was written there (no ``runs/``, no half-made run directory).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnigym.cli import main
from omnigym.errors import OmnigymError

CASES = [
    (["train", "grpo", "--precision", "fp16"], "unknown --precision 'fp16'; choose fp32 or bf16"),
    (["train", "iql", "--dataset", "d/x-v0", "--precision", "fp16"], "unknown --precision 'fp16'; choose fp32 or bf16"),
    (["train", "sft", "--precision", "bf16", "--training-backend", "deepspeed"],
     "--precision bf16 with --training-backend deepspeed: DeepSpeed's precision is its config's"),
    (["train", "ppo", "--num-minibatches", "0"], "--num-minibatches must be positive, got 0"),
    (["train", "ppo", "--num-steps", "0"], "--num-steps must be positive, got 0"),
    (["train", "ppo", "--num-minibatches", "300"], "--num-minibatches 300 is more than the 256 transitions"),
    (["train", "ppo", "--num-envs", "0"], "--num-envs must be positive, got 0"),
    (["train", "ppo", "--total-timesteps", "-5"], "--total-timesteps must be positive, got -5"),
    (["train", "dqn", "--buffer-size", "0"], "--buffer-size must be positive, got 0"),
    # taken: every minibatch drew the one transition 64 times
    (["train", "dqn", "--buffer-size", "1"], "--buffer-size 1 holds fewer transitions than one --batch-size 64 "
                                             "minibatch; give --buffer-size 64 or more"),
    (["train", "sac", "--buffer-size", "100"], "--buffer-size 100 holds fewer transitions than one --batch-size 256"),
    # no widths trained a linear policy in silence
    (["train", "ppo", "--hidden"], "--hidden needs one or more values, got none (e.g. --hidden 64 64)"),
    (["train", "td3", "--hidden"], "--hidden needs one or more values, got none"),
    # "" read as not given: a new run under runs/
    (["train", "ppo", "--run-dir", ""], "--run-dir is empty; name a directory"),
    # gymnasium refuses 0 but took -1: one-step episodes
    (["train", "ppo", "--env-kwargs", "max_episode_steps=-1"], "--env-kwargs max_episode_steps must be a whole number "
                                                               "of steps, 1 or more, got -1"),
    (["train", "ppo", "--env-kwargs", "max_episode_steps=2.5"], "max_episode_steps must be a whole number"),
    (["train", "ppo", "--env-kwargs", "g=9.8", "g=1.6"], "--env-kwargs gives g twice; give it once"),
    # the step after an episode ends is an autoreset: a 1-step rollout could hold no transition (a traceback, a nan loss)
    (["train", "ppo", "--num-steps", "1"], "--num-steps must be 2 or more, got 1"),
    (["train", "ppo_lstm", "--num-steps", "1"], "--num-steps must be 2 or more, got 1"),
    (["train", "reinforce", "--num-steps", "1"], "--num-steps must be 2 or more, got 1"),
    (["train", "dqn", "--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["train", "ppo", "--device", "cuda"], "--device cuda: torch sees no CUDA GPU here"),
    (["train", "ppo", "--device", "gpu0"], "unknown --device 'gpu0'; use cpu, cuda, cuda:N or mps"),
    (["train", "ppo", "--learning-rate", "-0.001"], "--learning-rate must be positive, got -0.001"),
    (["train", "ppo", "--learning-rate", "nan"], "--learning-rate must be a finite number, got nan"),
    (["train", "ppo", "--gamma", "1.5"], "--gamma must be between 0 and 1, got 1.5"),
    (["train", "ppo", "--gae-lambda", "2"], "--gae-lambda must be between 0 and 1, got 2.0"),
    (["train", "ppo", "--hidden", "64", "0"], "--hidden must be positive, got (64, 0)"),
    (["train", "reinforce", "--gamma", "-0.1"], "--gamma must be between 0 and 1, got -0.1"),
    (["train", "dqn", "--tau", "0"], "--tau must be in (0, 1], got 0.0"),
    (["train", "ppo", "--resume", "x"], "x is not a run directory (no config.json)"),
    (["train", "ppo", "--resume"], "--resume needs the run directory to continue: omnigym train ppo --resume RUN_DIR"),
    (["train", "ppo", "--env-id", "CartPol-v1"], "unknown env id 'CartPol-v1'; closest known ids: CartPole-v1"),
    (["train", "ppo", "--env-id", "no_such_module:Env"], "--env-id no_such_module:Env: no module named 'no_such_module'"),
    (["train", "ppo", "--env-id", "toy_envs:Missing"], "--env-id toy_envs:Missing: module toy_envs has no 'Missing'"),
    (["train", "ppo", "--env-id", "toy_envs:NaNEnv"], "the env returned a non-finite observation (nan) at env step"),
    (["train", "dqn", "--env-id", "toy_envs:NaNEnv"], "the env returned a non-finite observation (nan) at env step"),
    (["train", "grpo", "--max-new-tokens", "0"], "--max-new-tokens must be positive, got 0"),
    (["train", "grpo", "--group-size", "1"], "--group-size must be at least 2"),
    (["train", "grpo", "--max-new-tokens", "100000"], "--max-new-tokens 100000 does not fit the model's context of 256"),
    (["train", "text_reinforce", "--max-new-tokens", "256"], "--max-new-tokens 256 does not fit the model's context"),
    (["train", "grpo", "--model", "/nonexistent/path"], "--model /nonexistent/path: no such folder"),
    (["train", "grpo", "--model", "runs/misspelt/model"], "--model runs/misspelt/model: no such folder"),
    # one slash, as a hub id has, but its first part is a folder here: a misspelt run, not an id
    (["train", "grpo", "--model", "not-a-run/misspelt"], "--model not-a-run/misspelt: no such folder"),
    (["train", "grpo", "--task", "EMPTY"], "has no examples"),
    (["train", "grpo", "--task", "ifeval"], "--task ifeval has examples without a reference answer, which the warm-up"),
    (["train", "grpo", "--task", "SMALL"], "has 3 examples and --eval-size 500 holds out that many or more"),
    (["train", "grpo", "--task", "arithmetic-tool-v0"], "unknown --task 'arithmetic-tool-v0'; closest known: "
                                                        "arithmetic-tools-v0"),
    (["train", "grpo", "--task", "my_org/no-such-dataset"], "--task my_org/no-such-dataset is not a built-in task"),
    (["train", "grpo", "--rewards", "math"], "--rewards must look like 'math:1.0,format:0.1'"),
    (["train", "grpo", "--rewards", "maths:1.0"], "unknown reward 'maths'"),
    (["train", "grpo", "--accuracy-reward", "nope"], "unknown reward 'nope'"),
    (["train", "grpo", "--eval-size", "0"], "--eval-size must be positive, got 0"),
    (["train", "sft", "--data", "missing.jsonl"], "no such file: missing.jsonl"),
    (["train", "sft", "--data", "SMALL", "--eval-size", "1"], "small.jsonl:1: an SFT row needs prompt and completion, "
                                                                "messages, or text; it has question, answer"),
    (["train", "sft", "--eval-size", "5000"], "--data arithmetic has 5000 examples and --eval-size 5000 holds out"),
    (["train", "sft", "--max-length", "1"], "--max-length must be at least 2 tokens, got 1"),
    (["train", "sft", "--max-length", "5"], "no held-out example has a token left to learn from within --max-length 5"),
    (["train"], "name an algorithm: omnigym train {reinforce,ppo,dqn,sac,td3,"),  # then the rest of ALGORITHMS
    (["train", "a3c"], "unknown algorithm 'a3c'; choose one of"),
    (["eval", "NOT_A_RUN"], "is not a run directory (no config.json)"),
    (["eval", "BAD_CONFIG"], "config.json cannot be read (JSONDecodeError)"),
    (["train", "ppo", "--resume", "BAD_CONFIG"], "config.json cannot be read (JSONDecodeError)"),
    (["fit", "ppo"], "unknown command 'fit'; choose one of train, eval, sample, collect, export, plot, list, "
                     "import-gguf, serve, serve-rm"),
    ([], "name a command: train, eval, sample, collect, export, plot, list, import-gguf, serve, serve-rm"),
    (["list", "extra"], "omnigym list takes no arguments, got extra"),
    (["train", "ppo", "--seed", "-1"], "--seed must be between 0 and 2**32 - 1, got -1"),
    (["train", "ppo", "--wandb"], "wandb is not installed; install it with: pip install 'omnigym[wandb]'"),
    (["train", "ppo", "--env-id", "toy_envs.py:SignEnv"], "name the module without .py: toy_envs:SignEnv"),
    (["train", "ppo", "--env-id", "toy_envs:DictObsEnv"], "the networks take Box observations"),
    (["train", "ppo", "--env-id", "toy_envs:OldGymEnv"], "your env's reset() must return (observation, info dict), got ndarray"),
    # each was a traceback (exit 1), or a line blaming the env for omnigym's own check
    (["train", "ppo", "--env-id", "toy_envs:TupleObsEnv"], "the networks take Box observations"),
    # "got tuple" named the tuple, not the list in it that was wrong
    (["train", "ppo", "--env-id", "toy_envs:InfoListEnv"], "your env's step() must return (observation, reward, "
                                                           "terminated, truncated, info dict), got a tuple of 5 whose "
                                                           "last is list"),
    (["train", "ppo", "--env-id", "toy_envs:CloseRaisesEnv"], "your env raised RuntimeError: close boom (at "),
    # an array terminated and a complex reward were tracebacks in the vector env; None trained on
    # an episode that never ended (it reads False), as did a string
    (["train", "ppo", "--env-id", "toy_envs:ArrayTerminatedEnv"],
     "your env's step() returned terminated=array([False, False]); it must be a bool"),
    (["train", "dqn", "--env-id", "toy_envs:NoneTruncatedEnv"], "your env's step() returned truncated=None; it must be a bool"),
    (["train", "ppo", "--env-id", "toy_envs:StringTerminatedEnv"],
     "your env's step() returned terminated='yes'; it must be a bool"),
    (["train", "ppo", "--env-id", "toy_envs:ComplexRewardEnv"],
     "your env's step() returned a reward of (1+1j); a reward is a real number"),
    (["train", "ppo", "--env-id", "Pendulum-v1", "--env-kwargs", "g=abc"],
     "Pendulum-v1 with --env-kwargs g='abc' raised TypeError: unsupported operand type(s) for /: 'str' and 'float'"),
    (["train", "dqn", "--env-id", "toy_envs:ImageLastEnv"], "image observations must be channels-first C x 84 x 84"),
    (["train", "grpo", "--task", "toy_text:failing_task"], "--task toy_text:failing_task raised RuntimeError: task boom "
                                                           "(at "),
    (["train", "grpo", "--task", "toy_text:short_questions", "--eval-size", "8", "--sft-steps", "0", "--rewards",
      "toy_text:failing_reward:1.0"], "reward toy_text:failing_reward raised KeyError: 'missing' (at "),
    (["train", "grpo", "--task", "LATIN1"], "latin1.jsonl is not UTF-8 JSON lines text (UnicodeDecodeError)"),
    # "\ud800" parses as JSON and reached the tokenizer: a TypeError traceback (sft, rm, dpo, grpo, eval)
    (["train", "sft", "--data", "EMPTY"], "--data empty.jsonl has no examples"),  # "use --eval-size below 0"
    (["train", "grpo", "--prompts-per-step", "0"], "--prompts-per-step must be positive, got 0"),  # --num-generators
    (["train", "sft", "--data", "SURROGATE"], "surrogate.jsonl:1: a string holds an unpaired surrogate escape"),
    # trained on and scored as the prompt "None"
    (["train", "grpo", "--task", "NULLQ", "--sft-steps", "0"], "nullq.jsonl: row 1: question must be a non-empty "
                                                               "string, got None"),
    # a template's own raise_exception (Mistral's "System role not supported"): a jinja2 traceback
    (["train", "sft", "--data", "CHATS", "--chat-template", "NOSYS", "--eval-size", "2"],
     "the chat template refused these messages (TemplateError: System role not supported)"),
    (["train", "grpo", "--chat-template", "missing.jinja"], "--chat-template missing.jinja: no such file, and not a "
                                                            "Jinja template"),
    (["train", "grpo", "--chat-template", "BROKEN{{"], "--chat-template does not compile: "),
    # every prompt became "hello": GRPO trained on it in silence, SFT blamed --max-length
    (["train", "grpo", "--chat-template", "{{ 'hello' }}"], "--chat-template renders the same text whatever the "),
    (["train", "sft", "--chat-template", "{{ 'hello' }}"], "--chat-template renders the same text whatever the "),
    (["train", "grpo", "--kl-estimator", "k9"], "unknown --kl-estimator 'k9'; choose k1, k2 or k3"),
    (["train", "grpo", "--loss-aggregation", "foo"], "unknown --loss-aggregation 'foo'"),
    (["train", "ppo", "--num-steps", "abc"], "Error parsing --num-steps: invalid literal for int() with base 10: 'abc'; "
                                             "see omnigym train ppo --help"),
    (["train", "ppo", "--total-timesteps", "1e5"], "Error parsing --total-timesteps: invalid literal for int() with "
                                                   "base 10: '1e5'"),
    (["train", "grpo", "--rewards", "math:1.0,math:0.5"], "--rewards names math twice"),
    (["train", "grpo", "--rewards", "rm:http://127.0.0.1:8000"], "--rewards rm:http://127.0.0.1:8000: give the weight "
                                                                 "after the port (rm:http://127.0.0.1:8000:1.0)"),
    (["train", "grpo", "--rewards", "rm:http://127.0.0.1:1:1.0"], "rm:http://127.0.0.1:1: no reward server answers "
                                                                  "there"),
    (["serve-rm", "NOT_A_RUN"], "rm:not-a-run is not a reward model"),
    (["plot", "RUN_LOG", "--out", "RUN_LOG"], "--out 'log' must name an image file"),
    (["train", "ppo", "--no-such-flag"], "Unrecognized options: --no-such-flag; see omnigym train ppo --help"),
    (["train", "ppo", "--frame-stack", "2"], "--frame-stack is Atari preprocessing; CartPole-v1 is not an Atari game"),
    (["train", "dqn", "--sticky-actions", "1.5"], "--sticky-actions must be between 0 and 1, got 1.5"),
    (["train", "ppo", "--preset", "atarii"], "unknown --preset 'atarii'; choose auto, none, atari, mujoco"),
    # a preset named for another family's envs trained with its settings, in silence
    (["train", "ppo", "--env-id", "CartPole-v1", "--preset", "connect_four"],
     "--preset connect_four is for two-seat games (pettingzoo/connect_four_v3, openspiel/connect_four, or another "
     "board with no preset of its own); CartPole-v1 is not one"),
    (["train", "ppo", "--env-id", "HalfCheetah-v5", "--preset", "atari"],
     "--preset atari is for atari envs; HalfCheetah-v5 is in the mujoco family (--preset auto picks its preset)"),
    (["train", "ppo", "--env-id", "toy_envs:AllInvalidMaskEnv"], "the env's action mask allows no action at env step"),
    (["train", "ppo", "--env-id", "toy_envs:FractionMaskEnv"], "the env's action mask holds 0.5; it must be booleans"),
    (["train", "ppo", "--backend", "ale"], "--backend ale runs Atari games (ale-py's vector env); CartPole-v1 is not one"),
    (["train", "grpo", "--sync-timeout", "30"], "--sync-timeout: read by --runtime ray only"),
    (["train", "ppo", "--sync-timeout", "30"], "--sync-timeout: read by --runtime ray only"),
    (["train", "sft", "--training-backend", "fsdp3"], "unknown --training-backend 'fsdp3'; choose local, ddp, fsdp2"),
    (["eval"], "the following arguments are required: run_dir; see omnigym eval --help"),
    (["eval", "NOT_A_RUN", "--episodes", "0"], "--episodes must be positive, got 0"),
    (["plot", "NOT_A_RUN"], "not-a-run is not a run directory (no config.json)"),
    (["plot", "RUN_LOG", "--out", "RUN_LOG/metrics.jsonl/x.png"], "log's own metrics.jsonl; plot never replaces"),
    (["plot", "RUN_LOG", "--metric", "nope"], "no run among"),
    # it replaced the other run's own files (its curve.png)
    (["plot", "RUN_LOG", "--out", "bad-config/curve.png"], "--out bad-config/curve.png is inside the run "),
    # a name longer than a file system allows (255 bytes): a traceback before, and --run-dir sub/LONG left sub/
    (["train", "ppo", "--run-dir", "sub/LONG"], "a name in this path is longer than the 255 bytes"),
    (["train", "ppo", "--resume", "LONG"], "a name in this path is longer than the"),
    (["train", "grpo", "--run-dir", "LONG"], "a name in this path is longer than the"),
    (["train", "grpo", "--model", "LONG"], "no such folder"),
    (["eval", "LONG"], "a name in this path is longer than the"),
    (["plot", "LONG"], "a name in this path is longer than the"),
    # a helper's pass on the data a user feeds the language trainers: each was a traceback, or trained
    (["train", "sft", "--eval-size", "1", "--data", "PARTS"], "messages[1]'s content must be text, got list (a list of "
                                          "content parts is not read"),
    (["train", "sft", "--eval-size", "1", "--data", "NONDICT"], "prompt[0] is not a {'role', 'content'} message"),
    (["train", "sft", "--eval-size", "1", "--data", "EMPTYTURN"], "messages[1], an assistant turn, is empty"),
    (["train", "rm", "--eval-size", "1", "--data", "NONEREPLY"], "chosen[0]'s content must be text, got NoneType"),
    (["train", "dpo", "--data", "EMPTY"], "--data empty.jsonl has no pairs"),  # "use --eval-size below 0"
    (["train", "rm", "--data", "ONEPAIR"], "give at least 2 pairs (one held out, one to train on)"),
    (["train", "sft", "--data", "BADUTF8"], "--data badutf8.json is not UTF-8 JSON text (UnicodeDecodeError)"),
    (["train", "sft", "--data", "OBJECT"], "--data object.json holds one JSON object; a .json file holds an array"),
    (["train", "sft", "--data", "BROKENARRAY"], "brokenarray.json:4: not valid JSON (Expecting ',' delimiter)"),
    (["train", "sft", "--data", "TEXTFILE"], "--data notes.txt: give a .jsonl, .json (or either .gz), .csv or .parquet file"),
    (["train", "sft", "--data", "LOOP"], "--data loop: a link to nothing (or a loop of links)"),
    (["train", "grpo", "--task", "toy_text:list_question_task"],
     "--task toy_text:list_question_task: example 0: question must be a non-empty string, got ['Say', '0']"),
    (["train", "grpo", "--task", "toy_text:none_answer_task"],
     "--task toy_text:none_answer_task: example 0: answer must be a non-empty string or number, got None"),
    (["train", "grpo", "--task", "toy_text:short_questions", "--eval-size", "8", "--sft-steps", "0", "--rewards",
      "toy_text:huge_reward:1.0"], "reward toy_text:huge_reward returned 1e+300; a reward is at most 1e+15 in size"),
    (["train", "grpo", "--task", "toy_text:short_questions", "--eval-size", "8", "--sft-steps", "0", "--rewards",
      "toy_text:anything:1e300,format:1e300"], "came to 1e+300, past 1e+15; give the rewards smaller weights"),
    (["train", "prm", "--wrong-per-problem", "0"], "--wrong-per-problem must be at least 1"),
    # it played its games, trained nothing and exited 0
    (["train", "alphazero", "--env-id", "openspiel/tic_tac_toe", "--train-steps", "0"], "--train-steps must be positive"),
    (["train", "grpo", "--task", "toy_text:short_questions", "--eval-size", "8", "--sft-steps", "0", "--rewards",
      "toy_text:string_reward:1.0"], "reward _string_score returned '1.0' for a completion; a reward is a number"),
]


def snapshot(root):
    """Every file under ``root`` with a hash of its bytes, and every folder."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in root.rglob("*")}


def prepare(tmp_path, argv):
    """Replace placeholders by files in the working directory."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "small.jsonl").write_text("".join(json.dumps({"question": "1+1", "answer": "2"}) + "\n"
                                                   for _ in range(3)))
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "bad-config").mkdir()
    (tmp_path / "bad-config" / "config.json").write_text("{not json")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "metrics.jsonl").write_text(json.dumps({"global_step": 1, "charts/episodic_return": 1.0}))
    (tmp_path / "log" / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1"}))
    chat = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"}]}
    (tmp_path / "chats.jsonl").write_text((json.dumps(chat) + "\n") * 8)
    (tmp_path / "nosys.jinja").write_text("{% for m in messages %}{% if m['role'] == 'system' %}"
                                          "{{ raise_exception('System role not supported') }}{% endif %}"
                                          "<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}")
    (tmp_path / "nullq.jsonl").write_text('{"question": null, "answer": "1"}\n' * 30)
    (tmp_path / "surrogate.jsonl").write_text('{"prompt": "\\ud800", "completion": "b"}\n' * 5)
    (tmp_path / "latin1.jsonl").write_bytes('{"question": "caf\xe9", "answer": "1"}\n'.encode("latin-1"))
    user, reply = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}
    rows = {"parts.jsonl": {"messages": [user, {"role": "assistant", "content": [{"type": "text", "text": "yo"}]}]},
            "nondict.jsonl": {"prompt": ["hi"], "completion": ["yo"]},
            "emptyturn.jsonl": {"messages": [user, {"role": "assistant", "content": " "}]},
            "nonereply.jsonl": {"prompt": [user], "chosen": [{"role": "assistant", "content": None}],
                                "rejected": [reply]}}
    for name, row in rows.items():
        (tmp_path / name).write_text((json.dumps(row) + "\n") * 4)
    (tmp_path / "onepair.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
    (tmp_path / "badutf8.json").write_bytes(b'[{"text": "\xff\xfe"}]')
    (tmp_path / "object.json").write_text('{"text": "a"}')
    (tmp_path / "brokenarray.json").write_text('[\n{"text": "a"},\n{"text": "b"\n]')
    (tmp_path / "notes.txt").write_text("hello")
    if not (tmp_path / "loop").is_symlink():
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
    names = {"PARTS": "parts.jsonl", "NONDICT": "nondict.jsonl", "EMPTYTURN": "emptyturn.jsonl",
             "NONEREPLY": "nonereply.jsonl", "ONEPAIR": "onepair.jsonl", "BADUTF8": "badutf8.json",
             "OBJECT": "object.json", "BROKENARRAY": "brokenarray.json", "TEXTFILE": "notes.txt", "LOOP": "loop",
             "NULLQ": "nullq.jsonl", "CHATS": "chats.jsonl", "NOSYS": "nosys.jinja", "SURROGATE": "surrogate.jsonl", "LATIN1": "latin1.jsonl", "EMPTY": "empty.jsonl", "SMALL": "small.jsonl", "NOT_A_RUN": "not-a-run", "BAD_CONFIG": "bad-config",
             "RUN_LOG": "log", "RUN_LOG/metrics.jsonl/x.png": "log/metrics.jsonl/x.png", "LONG": "x" * 300,
             "sub/LONG": "sub/" + "x" * 300}
    return [names.get(a, a) for a in argv]


@pytest.mark.parametrize("argv, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    argv = prepare(tmp_path, argv)
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("omnigym: error: ") and message in err[0], err[0]
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A short finished PPO run, copied fresh for each test that may touch it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert main(["train", "ppo", "--total-timesteps", "512", "--run-dir", str(run_dir), "--no-progress"]) == 0
    return run_dir


@pytest.fixture
def run_copy(finished_run, tmp_path):
    import shutil

    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize("argv, message", [
    (["train", "ppo", "--run-dir", "RUN"], "RUN already holds a run; continue it with --resume RUN, or replace it "
                                            "with --overwrite"),
    (["train", "dqn", "--resume", "RUN"], "RUN is a ppo run; continue it with: omnigym train ppo --resume RUN"),
    (["train", "ppo", "--resume", "RUN", "--hidden", "32", "32"], "RUN was made with --hidden 64 64, not 32 32"),
    (["train", "ppo", "--resume", "RUN", "--env-id", "Acrobot-v1"], "RUN was made with --env-id CartPole-v1, not "
                                                                     "Acrobot-v1"),
    (["train", "ppo", "--resume", "RUN", "--normalize-obs"], "RUN was made with --no-normalize-obs, not --normalize-obs"),
    (["train", "ppo", "--resume", "RUN", "--run-dir", "OTHER"], "give either --resume"),
    (["train", "reinforce", "--run-dir", "RUN"], "RUN already holds a run"),
    # text_reinforce keeps no checkpoint and refuses --resume: the line must not offer it
    (["train", "text_reinforce", "--run-dir", "RUN"], "RUN already holds a run; choose a new --run-dir, or replace "
                                                       "it with --overwrite"),
    (["train", "ppo", "--resume", "RUN", "--overwrite"], "--resume continues a run and --overwrite replaces it"),
    # its files sat among the other run's as if they were its own
    (["train", "ppo", "--run-dir", "RUN/inner"], "--run-dir RUN/inner is inside the run "),
    (["train", "ppo", "--resume", "RUN", "--seed", "5"], "RUN was made with --seed 1, not 5"),
    # it read "RUN was made with --env-kwargs , not foo=1"
    (["train", "ppo", "--resume", "RUN", "--env-kwargs", "foo=1"], "RUN was made without --env-kwargs, not "
                                                                   "--env-kwargs foo=1; its checkpoint only fits"),
    (["train", "ppo", "--resume", "RUN", "--total-timesteps", "256"], "RUN is already at update 2 (512 env steps of "
                                                                      "256 a rollout), and --total-timesteps 256 makes 1 rollouts"),
    # a finished on-policy run stands below its --total-timesteps (autoreset steps are not counted): its resume
    # re-closed it and rewrote its config.json and curve
    (["train", "ppo", "--resume", "RUN"], "RUN is already at update 2 (512 env steps of 256 a rollout), and "
                                          "--total-timesteps 512 makes 2 rollouts; give --total-timesteps 768 or more to "
                                          "continue it"),
    (["train", "ppo", "--run-dir", "RUN", "--overwrite", "--env-id", "toy_envs:NaNEnv"],
     "the env returned a non-finite observation"),
    (["train", "ppo", "--resume", "RUN", "--learning-rate", "1e30", "--total-timesteps", "4096"],
     "loss became "),
    # a file there was read as the env failing: "env CartPole-v1 could not be made: FileExistsError"
    (["eval", "RUN", "--video", "--video-dir", "RUN/config.json"], "--video-dir RUN/config.json: RUN/config.json is "
                                                                    "a file; name a folder for the videos"),
    (["eval", "RUN", "--video", "--video-dir", "RUN/config.json/sub"], "--video-dir RUN/config.json/sub: "
                                                                        "RUN/config.json is a file"),
    # a folder the file system will not make read as "env CartPole-v1 could not be made: FileNotFoundError"
    (["eval", "RUN", "--video", "--video-dir", "/proc/omnigym-videos/eval"], "--video-dir /proc/omnigym-videos/eval "
                                                                             "cannot be made"),
    # a run's own files are never an output: plot wrote an image over config.json; export onto its lock raised
    (["plot", "RUN", "--out", "RUN/config.json"], "config.json is the run "),
    (["export", "RUN", "--format", "torchscript", "--out", "RUN/.omnigym.lock", "--force"],
     "own .omnigym.lock; export never replaces a run's files"),
])
def test_a_run_directory_is_never_changed_by_a_refused_start(run_copy, capsys, argv, message):
    argv = [str(run_copy) if a == "RUN" else str(run_copy.parent / "other") if a == "OTHER" else
            a.replace("RUN/", f"{run_copy}/") for a in argv]
    before = snapshot(run_copy.parent)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.replace("RUN", str(run_copy)) in err[0], err
    assert snapshot(run_copy.parent) == before


def test_a_path_with_dot_dot_parts_makes_no_stray_folder_and_names_its_owner_plainly(tmp_path, monkeypatch, capsys):
    """``new/../run``: making the run's folders made a stray ``new``, as did ``plot --out``; and a run inside
    another named its owner ``run/../run``."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "--total-timesteps", "256", "--run-dir", "new/../run", "--no-plot", "--no-progress"]) == 0
    assert main(["plot", "run", "--out", "other/../plots/curve.png"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "run"]
    capsys.readouterr()
    assert main(["train", "ppo", "--run-dir", "run/../run/inner"]) == 2
    err = capsys.readouterr().err.strip()
    where = tmp_path.resolve()  # the path is resolved, as the kernel reads it
    assert err.endswith(f"--run-dir {where / 'run' / 'inner'} is inside the run {where / 'run'}; choose a --run-dir "
                        "outside it"), err


def test_an_env_that_needs_its_env_kwargs_is_checked_with_them(tmp_path, monkeypatch, capsys):
    """The check made your env without --env-kwargs: an env that needs an argument could not be trained at all."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "--env-id", "toy_envs:SizedEnv", "--env-kwargs", "size=3", "--total-timesteps", "256",
                 "--run-dir", "run", "--no-plot", "--no-progress"]) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["env_kwargs"] == ["size=3"]
    assert main(["train", "ppo", "--env-id", "toy_envs:SizedEnv", "--run-dir", "other"]) == 2
    err = capsys.readouterr().err
    # the call itself failed: the line named omnigym's own call site "(at .../envs/vector.py:198)"
    assert "your env could not be made: TypeError" in err and "(in the call itself, with the arguments given)" in err
    assert "vector.py" not in err and not (tmp_path / "other").exists()


@pytest.mark.parametrize("argv", [["--total-timesteps", "256"], ["--seed", "5"], ["--hidden", "32", "32"]])
def test_a_refused_resume_leaves_even_the_modification_times(run_copy, capsys, argv):
    """The budget check reads the checkpoint, so it comes after the lock: making and removing the lock file moved
    the run directory's modification time, the one trace of a start that was refused."""
    import os

    def times():
        return {str(p): os.stat(p).st_mtime_ns for p in [run_copy, *run_copy.rglob("*")]}

    before = times()
    assert main(["train", "ppo", "--resume", str(run_copy), *argv]) == 2
    capsys.readouterr()
    assert times() == before


def test_a_lock_keeps_the_modification_time_it_moved_only_when_nothing_else_changed(tmp_path):
    """The time is put back only where the directory holds what it held: a run that wrote a file keeps the new time."""
    from omnigym.track.lock import RunLock

    (tmp_path / "a").write_text("x")
    os.utime(tmp_path, ns=(1, 10**18))
    lock = RunLock(tmp_path)
    assert lock.acquire()
    lock.release()
    assert os.stat(tmp_path).st_mtime_ns == 10**18
    assert lock.acquire()
    (tmp_path / "b").write_text("y")
    lock.release()
    assert os.stat(tmp_path).st_mtime_ns != 10**18 and not (tmp_path / ".omnigym.lock").exists()


def test_resume_refuses_a_log_that_no_longer_reaches_the_checkpoint(run_copy, capsys):
    (run_copy / "metrics.jsonl").write_text("")
    before = snapshot(run_copy)
    assert main(["train", "ppo", "--resume", str(run_copy), "--total-timesteps", "1024"]) == 2
    assert "metrics.jsonl is missing or shorter than when the checkpoint was written" in capsys.readouterr().err
    assert snapshot(run_copy) == before


def test_a_checkpoint_made_with_other_settings_is_refused_before_anything_is_written(run_copy, capsys):
    """A config.json edited by hand no longer matches its checkpoint: the restore fails in one
    line, and config.json, metrics and checkpoint are as they were."""
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**config, "hidden": [32, 32]}))
    before = snapshot(run_copy)
    assert main(["train", "ppo", "--resume", str(run_copy), "--total-timesteps", "1024"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit this run's settings" in err[0], err
    assert snapshot(run_copy) == before


@pytest.mark.parametrize("spelling", ["trailing-slash", "dot-relative", "absolute", "moved"])
def test_resume_takes_any_spelling_of_the_path_and_a_moved_run(run_copy, tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    target = run_copy
    if spelling == "moved":
        target = tmp_path / "elsewhere" / "renamed"
        target.parent.mkdir()
        run_copy.rename(target)
    arg = {"trailing-slash": "run/", "dot-relative": "./run", "absolute": str(run_copy), "moved": str(target)}[spelling]
    assert main(["train", "ppo", "--resume", arg, "--total-timesteps", "1024", "--no-progress", "--no-plot"]) == 0
    assert json.loads((target / "config.json").read_text())["run_dir"] == os.path.normpath(arg)
    steps = [json.loads(line)["global_step"] for line in (target / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] > 900 and steps == sorted(steps)  # the 512-step run went on to 1024 (autoreset steps not counted)


def test_overwrite_replaces_a_finished_run(run_copy, capsys):
    old_events = sorted(p.name for p in run_copy.glob("events.out.tfevents.*"))
    (run_copy / "evals").mkdir()  # a language run's eval reports of the model the overwrite replaces were kept
    (run_copy / "evals" / "arithmetic_held-out-001.json").write_text("{}")
    assert main(["train", "ppo", "--run-dir", str(run_copy), "--overwrite", "--total-timesteps", "256",
                 "--no-progress"]) == 0
    rows = [json.loads(line) for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] <= 256  # the new run's log only, not the 512-step run's
    assert not set(old_events) & {p.name for p in run_copy.glob("events.out.tfevents.*")}
    assert not (run_copy / "evals").exists()


def test_a_run_dir_holding_other_files_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["train", "ppo", "--run-dir", str(tmp_path)]) == 2
    assert "is not empty and holds no omnigym run" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_train_help_lists_the_algorithms(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("ppo", "dqn", "reinforce", "grpo", "text_reinforce"))
    assert "Proximal Policy Optimization" in out


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(tmp_path, capsys):
    err = interrupted_run(tmp_path, checkpoint_every=0, capsys=capsys)
    assert err == ["omnigym: interrupted; no checkpoint was written yet (one comes every --checkpoint-every steps or "
                   f"--checkpoint-minutes), so there is nothing to resume; {tmp_path / 'run'} was put back as it was "
                   "before the start"]
    assert not (tmp_path / "run").exists()


def test_ctrl_c_after_a_checkpoint_says_how_to_resume_and_resuming_works(tmp_path, capsys):
    import re

    err = interrupted_run(tmp_path, checkpoint_every=16, capsys=capsys)
    assert len(err) == 1 and re.fullmatch(rf"omnigym: interrupted; continue with: omnigym train ppo --resume "
                                          rf"{tmp_path / 'run'}  \(last checkpoint: global_step \d+\)", err[0]), err
    assert main(["train", "ppo", "--resume", str(tmp_path / "run"), "--total-timesteps", "128", "--no-progress",
                 "--no-plot"]) == 0


def interrupted_run(tmp_path, checkpoint_every, capsys):
    """PPO on ``toy_envs:InterruptEnv``, which raises KeyboardInterrupt (what Ctrl-C raises)
    on its 90th step; returns the stderr lines."""
    import toy_envs

    toy_envs.InterruptEnv.steps = 0
    code = main(["train", "ppo", "--env-id", "toy_envs:InterruptEnv", "--num-envs", "1", "--num-steps", "16",
                 "--checkpoint-every", str(checkpoint_every), "--run-dir", str(tmp_path / "run"), "--no-progress"])
    assert code == 130
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv", [["train", "ppo", "--compile", "--total-timesteps", "512"],
                                  ["train", "td3_bc", "--dataset", "d/x-v0", "--compile"]])
def test_compile_without_a_cpp_compiler_is_one_line(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["omnigym: error: --compile needs a C++ compiler on CPU and no-such-compiler-here is not on PATH; "
                   "install g++ (apt-get install g++) or leave --compile off (--no-compile on a resume)"]
    assert list(tmp_path.iterdir()) == []


def test_compile_with_an_empty_cache_folder_variable_is_one_line(tmp_path, monkeypatch, capsys):
    """torch reads TORCHINDUCTOR_CACHE_DIR="" as the working directory and wrote its kernels there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")
    assert main(["train", "ppo", "--compile", "--total-timesteps", "512"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "omnigym: error: TORCHINDUCTOR_CACHE_DIR is set but empty, and torch would then write its kernels into the "
        "working directory; unset it or name a folder"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cache", ["/proc/no-such-folder", "/etc/hostname"])
def test_compile_with_a_cache_folder_it_cannot_make_is_one_line(tmp_path, monkeypatch, capsys, cache):
    """torch._inductor makes its cache folder when imported: one it cannot make (under /proc, or a
    file's name) was an OSError's traceback at the first step."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", cache)
    assert main(["train", "ppo", "--compile", "--total-timesteps", "512"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"omnigym: error: --compile keeps its kernels in {cache}, which cannot be made or written to; set "
        "TORCHINDUCTOR_CACHE_DIR to a folder you can write or leave --compile off (--no-compile on a resume)"]
    assert list(tmp_path.iterdir()) == []


def test_ppo_with_a_compiler_that_does_not_build_is_one_line_and_leaves_no_run(tmp_path):
    """As offline RL's (tests/test_offline_speed.py): CXX is on PATH but cannot build; the first
    minibatch says so in one line and the run directory goes."""
    env = {**os.environ, "CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "ppo", "--total-timesteps", "256",
                           "--num-steps", "32", "--compile", "--run-dir", str(tmp_path / "run"), "--no-progress"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith(("omnigym:", "Traceback"))]
    assert len(errors) == 1 and errors[0].startswith("omnigym: error: --compile could not build the minibatch loss (")
    assert not (tmp_path / "run").exists()


def test_a_compiled_run_is_evaluated_and_resumed_without_a_compiler(run_copy, monkeypatch, capsys):
    """Whether this process compiles is this command's to say: eval never compiles, and a resume
    without a compiler is told to give --no-compile, which then works."""
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**config, "compile": True}))  # as a --compile run saved it
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 0
    before = snapshot(run_copy)
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run_copy), "--total-timesteps", "1024", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("leave --compile off (--no-compile on a resume)")
    assert snapshot(run_copy) == before
    assert main(["train", "ppo", "--resume", str(run_copy), "--total-timesteps", "1024", "--no-compile",
                 "--no-progress"]) == 0
    assert json.loads((run_copy / "config.json").read_text())["compile"] is False


@pytest.mark.parametrize("algo, said", [("alphazero", "an alphazero run"), ("iql", "an iql run"),
                                        ("sft", "an sft run"), ("dqn", "a dqn run")])
def test_resuming_another_algorithms_run_names_it_with_its_article(tmp_path, capsys, algo, said):
    """It said "is a alphazero run"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": algo}))
    assert main(["train", "ppo", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run} is {said}; continue it with: omnigym train {algo} --resume {run}" in err[0], err


@pytest.mark.parametrize("argv, flag", [
    (["train", "grpo", "--model", ""], "--model"),
    (["train", "sft", "--model", "  "], "--model"),
    (["train", "sft", "--chat-template", ""], "--chat-template"),
    (["train", "distill", "--teacher", ""], "--teacher"),
    (["train", "rlhf", "--reward-model", ""], "--reward-model"),
    (["train", "online_dpo", "--pairwise-judge", ""], "--pairwise-judge"),
    (["train", "grpo", "--rewards", "judge:x:1.0", "--judge-rubric", ""], "--judge-rubric"),
    (["train", "grpo", "--rewards", "rm::1.0"], "--rewards rm:"),
    (["train", "grpo", "--rewards", "format:0.1, prm: :1.0"], "--rewards prm:"),
    (["train", "grpo", "--accuracy-reward", "rm:"], "--accuracy-reward rm:"),
    (["train", "rlhf", "--gold-reward", "rm::1.0"], "--gold-reward rm:"),
    (["train", "grpo", "--step-rewards", "prm::1.0"], "--step-rewards prm:"),
], ids=" ".join)
def test_an_empty_folder_name_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, capsys, argv, flag):
    """``--model ""`` is ``Path("")``, the current directory: it was read as the model folder
    ("has no config.json"), and a folder with one would have been trained on; ``rm::1.0`` scored
    with the reward model run the command stood in, and ``--chat-template ""`` was ignored."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    if flag.endswith(":"):
        expected = f"omnigym: error: {flag} names no folder; give "
    else:
        expected = f"omnigym: error: {flag} is empty; give a folder or file, or leave it out"
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(expected), err
    assert snapshot(tmp_path) == before


def test_a_name_that_is_no_folder_is_fetched_only_if_it_can_be(tmp_path, monkeypatch, capsys):
    """A misspelt --model that is not a folder was read as a hub id: transformers retried each
    file five times over ~23 s, 22 lines of retries before its error. Now one line at once, for
    each reason the hub cannot give it; a hub id in the Hugging Face cache still loads offline."""
    from huggingface_hub import constants

    from omnigym.models.lm import check_hub_id

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    reasons = [
        (True, "https://huggingface.co", "nosuchmodel", "not in the Hugging Face cache (HF_HUB_OFFLINE is set"),
        (False, "http://127.0.0.1:9", "nosuchmodel", "http://127.0.0.1:9 cannot be reached to fetch it"),
        (True, "https://huggingface.co", "bad name!", "no such folder here, and not a hub id"),
    ]
    for offline, endpoint, name, message in reasons:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        before = snapshot(tmp_path)
        assert main(["train", "grpo", "--model", name]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--model {name}: " in err[0] and message in err[0], err
        assert snapshot(tmp_path) == before
    # in the cache (the layout huggingface_hub writes): nothing to ask the hub, offline or not
    snapshot_dir = tmp_path / "hub-cache" / "models--someone--cached" / "snapshots" / "abc123"
    snapshot_dir.mkdir(parents=True)
    (snapshot_dir / "config.json").write_text("{}")
    (tmp_path / "hub-cache" / "models--someone--cached" / "refs").mkdir()
    (tmp_path / "hub-cache" / "models--someone--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    check_hub_id("--model someone/cached", "someone/cached")
    with pytest.raises(OmnigymError, match="someone/other: no such folder here, and not in the Hugging Face cache"):
        check_hub_id("--model someone/other", "someone/other")


@pytest.mark.parametrize("algo", ["rlhf", "dpo", "online_dpo"])
@pytest.mark.parametrize("gold, said", [("gold_vowel:1.0", "unknown reward 'gold_vowel'"),
                                        ("gold_vowels", "--gold-reward must look like 'math:1.0,format:0.1'")])
def test_a_bad_gold_reward_is_one_line_before_the_demo_trains(tmp_path, monkeypatch, capsys, algo, gold, said):
    """A misspelt --gold-reward was found only once the demo's stages had trained (about 40 s,
    and runs/ written), and named as --rewards."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    assert main(["train", algo, "--gold-reward", gold, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("argv", [
    ["plot", ""], ["plot", ".", " "], ["plot", ".", "--out", ""], ["sample", ".", "--out", ""], ["sample", ""],
    ["export", ".", "--format", "torchscript", "--out", " "], ["export", "", "--format", "torchscript"],
    ["eval", ".", "--video-dir", ""], ["eval", "\t"], ["collect", ".", "--episodes", "1", "--dataset", "p/x-v0",
                                                        "--expert", ""],
    ["collect", "", "--episodes", "1", "--dataset", "p/x-v0"], ["import-gguf", "", "--out", "new"],
    ["import-gguf", "--out", ""], ["serve", "--base-model", ".", "--store", ""], ["serve", "--base-model", ""],
    ["serve-rm", ""],
], ids=repr)
def test_an_empty_file_or_folder_argument_is_one_line(tmp_path, monkeypatch, capsys, argv):
    """"" is Path("."): in a run's folder, `plot ""` plotted it, `sample . --out ""` wrote
    best_of_2.jsonl there, `export --out " "` wrote a file named " ", `eval --video-dir ""` and
    `serve --store ""` wrote into it, `import-gguf ""` imported the default model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"algo": "sft"}))
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is empty; give a file or folder" in err[0], err
    assert snapshot(tmp_path) == before


def test_a_resume_stopped_before_its_checkpoint_says_the_flags_it_was_given(tmp_path, capsys, monkeypatch):
    """A resume that wrote no checkpoint puts config.json back as it was, so its line says again
    what it changed (here a longer --total-timesteps); the plain ``--resume`` would find the run
    finished."""
    import re

    import numpy as np
    import toy_envs

    run_dir = tmp_path / "run"
    toy_envs.InterruptEnv.steps = 0
    argv = ["train", "ppo", "--env-id", "toy_envs:InterruptEnv", "--num-envs", "1", "--num-steps", "16",
            "--no-progress", "--no-plot"]
    assert main([*argv, "--total-timesteps", "64", "--run-dir", str(run_dir)]) == 0  # 64 steps: no Ctrl-C yet
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run_dir), "--total-timesteps", "256", "--checkpoint-every", "0",
                 "--no-progress"]) == 130  # the Ctrl-C on the process's 90th step, before a checkpoint
    err = capsys.readouterr().err.strip().splitlines()
    said = re.fullmatch(rf"omnigym: interrupted; continue with: (omnigym train ppo --resume {run_dir} .*)  "
                        r"\(last checkpoint: global_step \d+\)", err[-1])
    assert said and sorted(said[1].split()[5:]) == sorted(["--total-timesteps", "256", "--checkpoint-every", "0"]), err
    def calm_step(env, action):  # InterruptEnv's step without its Ctrl-C
        env.t += 1
        return np.zeros(2, np.float32), 1.0, False, env.t >= toy_envs.EPISODE, {}

    monkeypatch.setattr(toy_envs.InterruptEnv, "step", calm_step)
    assert main(said[1].split()[1:]) == 0
    assert json.loads((run_dir / "config.json").read_text())["total_timesteps"] == 256


def test_a_damaged_log_names_its_line_and_a_torn_last_line_is_left_out(tmp_path, monkeypatch, capsys):
    """plot said 'damaged at line 1' for any line (it counted lines within the line), and refused a run whose last
    line a killed process had cut short, which every row before it still plots."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1"}))
    rows = "".join(json.dumps({"global_step": i, "charts/episodic_return": float(i)}) + "\n" for i in range(1, 6))
    (run / "metrics.jsonl").write_text(rows + '{"global_step": 6, "charts/epis')
    assert main(["plot", "run", "--out", "plot.png"]) == 0
    assert (tmp_path / "plot.png").exists()
    capsys.readouterr()
    (run / "metrics.jsonl").write_text(rows.replace('{"global_step": 3', 'garbage{"global_step": 3'))
    assert main(["plot", "run", "--out", "again.png"]) == 2
    assert capsys.readouterr().err.strip() == f"omnigym: error: {Path('run') / 'metrics.jsonl'} is damaged at line 3"
    assert not (tmp_path / "again.png").exists()
    # valid JSON that is no row of metrics: a list was an AttributeError, a row without its step a KeyError
    for line, bad in (("[1, 2]", 2), ('{"charts/episodic_return": 1.0}', 4), ('{"global_step": "7"}', 1)):
        lines = rows.splitlines()
        lines[bad - 1] = line
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        assert main(["plot", "run", "--out", "again.png"]) == 2
        assert capsys.readouterr().err.strip() == (f"omnigym: error: {Path('run') / 'metrics.jsonl'} is damaged at "
                                                   f"line {bad} (not a row of metrics with its global_step)")
        assert not (tmp_path / "again.png").exists()


def test_a_run_past_a_smaller_budget_is_refused_even_with_its_model_unsaved(tmp_path, capsys):
    """A language run whose model/ was never written resumes to write it; but one stopped at step 4 of its own budget
    and resumed with --steps 2 went on, wrote its model and config.json's 'steps: 2'. Only a run that ended exactly
    at its budget saves its model again."""
    import shutil

    run = tmp_path / "run"
    flags = ["--model", "tiny", "--data", "words", "--eval-size", "16", "--batch-size", "4", "--no-progress",
             "--no-plot", "--no-tensorboard"]
    assert main(["train", "sft", *flags, "--steps", "4", "--run-dir", str(run)]) == 0
    shutil.rmtree(run / "model")  # as a run stopped while writing it leaves it
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "sft", "--resume", str(run), "--steps", "2"]) == 2
    assert f"{run} is already at step 4 of --steps 2" in capsys.readouterr().err
    assert snapshot(run) == before
    assert main(["train", "sft", "--resume", str(run)]) == 0  # its own budget: the model is written again
    assert (run / "model").is_dir()


def test_a_run_that_crashes_after_a_checkpoint_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    """A bug in the env's own code is a traceback (exit 1); the run keeps its checkpoint, and nothing said so or how
    to continue once the bug is fixed."""
    import toy_envs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(toy_envs.RaisesLateEnv, "steps", 0)
    assert main(["train", "ppo", "--env-id", "toy_envs:RaisesLateEnv", "--num-envs", "1", "--num-steps", "32",
                 "--checkpoint-every", "32", "--total-timesteps", "1024", "--run-dir", "run", "--no-plot",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "RuntimeError: late boom" in err[-2] and "Traceback" in "\n".join(err)
    assert err[-1].startswith("omnigym: the run stopped on the error above, and keeps its last checkpoint; once it "
                              "is fixed, continue with: omnigym train ppo --resume run")
    assert (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_resume_says_which_settings_it_changes(run_copy, capsys):
    """Flags given to --resume win over the run's config.json, which then records them: a changed learning rate
    passed in silence, and the value the run began with was lost from its config."""
    assert main(["train", "ppo", "--resume", str(run_copy), "--total-timesteps", "1024", "--learning-rate", "0.01",
                 "--no-progress", "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {run_copy} with changed settings: --learning-rate 0.002 -> 0.01 (config.json records the new " \
           "values)" in out, out
    assert main(["train", "ppo", "--resume", str(run_copy), "--total-timesteps", "1536", "--no-progress"]) == 0
    assert "changed settings" not in capsys.readouterr().out  # a longer budget is what a resume is for


def test_resuming_a_run_still_making_its_stages_names_the_process(tmp_path, capsys):
    """Before its first checkpoint a demo has only its stages: --resume said "start that run again with --run-dir",
    which the running process's lock then refused."""
    from omnigym.track.lock import RunLock

    run = tmp_path / "run"
    (run / "stages" / "warmup").mkdir(parents=True)
    held = RunLock(run)
    assert held.acquire()
    try:
        assert main(["train", "grpo", "--resume", str(run), "--steps", "3"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{run} is in use by another omnigym process (pid {os.getpid()}" in err[0], err
    finally:
        held.release()
    assert main(["train", "grpo", "--resume", str(run), "--steps", "3"]) == 2  # alone, as before
    assert "start that run again with --run-dir" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["stages"]


def test_integer_flags_and_numpy_scalar_rewards_pass_the_env_check():
    """The check refuses what the vector env cannot store, not what it can: 0/1 flags and numpy
    scalars (a refused run would be a false alarm)."""
    import toy_envs

    from omnigym.envs.vector import check_user_env

    check_user_env(toy_envs.IntFlagsEnv)  # raises OmnigymError on a refusal
    with pytest.raises(OmnigymError, match="terminated='yes'; it must be a bool"):
        check_user_env(toy_envs.StringTerminatedEnv)


def test_env_kwargs_read_literals_and_the_special_floats():
    """inf and nan are not Python literals: g=inf reached the env as the string "inf"."""
    import math

    from omnigym.envs.vector import parse_env_kwargs

    read = parse_env_kwargs(["g=inf", "h=-Infinity", "k=nan", "n=3", "s=abc", "t=None"])
    assert read["g"] == math.inf and read["h"] == -math.inf and math.isnan(read["k"])
    assert (read["n"], read["s"], read["t"]) == (3, "abc", None)


def test_a_preset_given_again_on_resume_is_the_runs_own(tmp_path, monkeypatch, capsys):
    """--preset auto resolves by env id, which a resume keeps: the same command again with --resume was
    refused ("made with --preset none, not auto"); another preset is refused (it was written, unapplied)."""
    monkeypatch.chdir(tmp_path)
    flags = ["train", "ppo", "--preset", "auto", "--run-dir", "run", "--no-progress", "--no-plot"]
    assert main([*flags, "--total-timesteps", "256"]) == 0
    assert main([*flags[:-4], "--resume", "run", "--total-timesteps", "512", "--no-progress", "--no-plot"]) == 0
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", "run", "--preset", "mujoco", "--total-timesteps", "1024"]) == 2
    assert "run was made with --preset none, not mujoco" in capsys.readouterr().err


def test_a_resume_without_the_replay_buffer_says_it_refills_it(tmp_path, monkeypatch, capsys):
    """It waited out --learning-starts again in silence: the resumed run's numbers left an
    uninterrupted run's, which docs/tracking.md promised (it holds only with --save-buffer)."""
    monkeypatch.chdir(tmp_path)
    flags = ["--learning-starts", "200", "--train-frequency", "50", "--gradient-steps", "1", "--hidden", "16",
             "--no-progress", "--no-plot"]
    assert main(["train", "dqn", "--total-timesteps", "400", "--run-dir", "run", *flags]) == 0
    capsys.readouterr()
    assert main(["train", "dqn", "--resume", "run", "--total-timesteps", "800", "--no-progress", "--no-plot"]) == 0
    assert "the checkpoint holds no replay buffer (--save-buffer was off), so the resumed run fills it again for " \
           "200 steps" in capsys.readouterr().err


def test_a_run_dir_through_a_broken_symbolic_link_is_one_line(tmp_path, monkeypatch, capsys):
    """A dangling link or a link to itself as --run-dir said 'cannot write to run directory ...: File exists'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to("loop")
    for run_dir, link, target in (("dangling", "dangling", tmp_path / "nowhere"), ("loop", "loop", "loop"),
                                  ("dangling/sub", "dangling", tmp_path / "nowhere")):
        assert main(["train", "ppo", "--run-dir", run_dir, "--total-timesteps", "256", "--no-progress"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"omnigym: error: --run-dir {run_dir}: {link} is a symbolic link to {target}, which does not exist or "
            "leads back to itself; make its target, or choose another --run-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "loop"] and not (tmp_path / "nowhere").exists()


def test_a_run_dir_with_a_runs_files_but_no_config_is_not_offered_to_resume(tmp_path, capsys):
    """It said 'continue it with --resume', and that --resume said 'not a run directory'."""
    (tmp_path / "nc").mkdir()
    (tmp_path / "nc" / "checkpoint.pt").write_bytes(b"")
    assert main(["train", "ppo", "--run-dir", str(tmp_path / "nc"), "--total-timesteps", "256"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"omnigym: error: {tmp_path / 'nc'} already holds a run's files without its config.json, so it cannot be "
        "resumed; choose a new --run-dir, or replace it with --overwrite")
    assert sorted(p.name for p in (tmp_path / "nc").iterdir()) == ["checkpoint.pt"]


def test_plot_never_writes_through_a_link_into_a_run_nor_over_a_file_that_is_not_its_image(run_copy, capsys):
    """A link named link.svg to a run's config.json made plot write an SVG into it; notes.pdf, a text file,
    was replaced by a PDF; a loop of links was a RuntimeError traceback."""
    here = run_copy.parent
    (here / "link.svg").symlink_to(run_copy / "config.json")
    (here / "notes.pdf").write_text("notes\n")
    (here / "loop_a").symlink_to(here / "loop_b")
    (here / "loop_b").symlink_to(here / "loop_a")
    before = snapshot(here)
    for argv, message in [(["--out", str(here / "link.svg")], "config.json (through a link); plot never replaces"),
                          (["--out", str(here / "notes.pdf")], "exists and is not a .pdf image")]:
        assert main(["plot", str(run_copy), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert main(["plot", str(here / "loop_a"), "--out", str(here / "x.png")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    assert snapshot(here) == before
    assert main(["plot", str(run_copy), "--out", str(here / "p.png")]) == 0  # a plot replaces its own kind of file
    assert main(["plot", str(run_copy), "--out", str(here / "p.png")]) == 0
    assert main(["plot", str(run_copy), "--out", str(run_copy / "curve.png")]) == 0  # a run's curve, drawn again


def test_a_run_this_user_cannot_read_is_one_line(run_copy):
    """eval, export and plot of a chmod-000 run raised PermissionError; root reads it anyway, so the commands run
    as nobody (setpriv) where the test runs as root."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("runs as root without setpriv (util-linux): cannot drop to a user that permissions stop")
    for folder in [run_copy.parent, *run_copy.parent.parents]:  # nobody may walk down to it
        if folder != Path("/"):
            folder.chmod(folder.stat().st_mode | 0o055)
    run_copy.chmod(0)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    omnigym = [sys.executable, "-m", "omnigym"]
    home = run_copy.parent / "home"  # matplotlib's cache, where nobody may write
    home.mkdir()
    home.chmod(0o777)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "HOME": str(home),
           "MPLCONFIGDIR": str(home)}
    try:
        for argv in (["eval", str(run_copy), "--episodes", "1"], ["export", str(run_copy), "--format", "torchscript"],
                     ["plot", str(run_copy), "--out", str(run_copy.parent / "p.png")]):
            done = subprocess.run([*drop, *omnigym, *argv], capture_output=True, text=True, timeout=120,
                                  cwd=run_copy.parent, env=env)
            assert done.returncode == 2 and done.stderr.strip().splitlines() == [
                f"omnigym: error: {run_copy} cannot be read (Permission denied); check its permissions, or run as "
                "the user who made it"], done.stderr
    finally:
        run_copy.chmod(0o755)
