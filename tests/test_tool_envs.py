"""The built-in tool envs (envs/python_env.py, search_env.py, guess_env.py): each env's turns,
the interpreter's state across turns, what a hostile cell, query or reply can do (nothing to
the trainer, no exception out of the env), bad input in one line, and a short GRPO run on
each through the same generator."""

import copy
import functools
import json
import os
import socket
import sys
import time

import pytest

from omnigym.envs.guess_env import GuessEnv, guess_env, guess_score
from omnigym.envs.python_env import PythonEnv, python_env
from omnigym.envs.search_env import Index, search_env
from omnigym.envs.text import TEXT_ENVS, make_text_env
from omnigym.errors import OmnigymError
from omnigym.rewards import get_reward
from omnigym.rewards.sandbox import Sandbox

linux = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox runs on Linux only")
isolated = pytest.mark.skipif(sys.platform != "linux" or Sandbox().isolation().kind != "bubblewrap",
                              reason="bubblewrap is not available here")


def call(code: str) -> str:
    return f'<tool name="python">{code}</tool>'


def quick_python_env(**kwargs) -> PythonEnv:
    env = PythonEnv([{"question": "What is 6 * 7?", "answer": "42"}], get_reward("math"), cpu_seconds=1,
                    wall_seconds=2, **kwargs)
    env.reset(seed=0)
    return env


def tool_reply(env, text: str) -> str:
    messages, reward, terminated, truncated, _ = env.step(text)
    assert messages[-1]["role"] == "tool" and (reward, terminated) == (0.0, False)
    return messages[-1]["content"]


# --- the Python interpreter -------------------------------------------------------------------

@linux
def test_python_state_is_kept_across_turns_and_the_answer_is_scored():
    env = quick_python_env()
    assert tool_reply(env, call("xs = [3, 4]\nprint('defined')")) == "defined"  # only this cell's output
    assert tool_reply(env, call("def total():\n    return sum(x * x for x in xs)")) == "(no output)"
    assert tool_reply(env, call("print(total() + 17)")) == "42"  # turn 1's list and turn 2's function
    _, reward, terminated, truncated, _ = env.step("<answer>42</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)


@linux
def test_each_episode_has_its_own_session():
    env = quick_python_env()
    other = copy.copy(env)  # what the generator does for each episode
    other.reset(seed=0)
    tool_reply(env, call("x = 1"))
    assert "NameError" in tool_reply(other, call("print(x)"))
    env.reset(seed=0)
    assert "NameError" in tool_reply(env, call("print(x)"))  # a new episode starts empty


@linux
def test_the_turn_limit_truncates_the_episode():
    env = quick_python_env(max_turns=2)
    tool_reply(env, call("x = 1"))
    _, reward, terminated, truncated, _ = env.step(call("x = 2"))
    assert (reward, terminated, truncated) == (0.0, False, True)


@linux
def test_output_is_cut_to_the_budget():
    env = quick_python_env(output_chars=100)
    out = tool_reply(env, call("print('x' * 5000)"))
    assert out.startswith("x" * 100) and out.endswith("\n... (output cut at 100 characters)") and len(out) < 150


HOSTILE = {
    "deep nesting": "x = " + "(" * 5000 + "1" + ")" * 5000,
    "deep list": "x = " + "[" * 100_000 + "]" * 100_000,
    "lone surrogate": "print('\ud800')",
    "surrogate name": "\udfff = 1",
    "huge output": "while True:\n    print('x' * 10000)",
    "infinite loop": "while True:\n    pass",
    "sleep": "import time\ntime.sleep(60)",
    "kill everything": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "kill itself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "exit": "import os\nos._exit(3)",
    "system exit": "raise SystemExit(1)",
    "closed outputs": "import os\nos.close(1)\nos.close(2)",
    "recursion": "def f():\n    return f()\nf()",
    "memory": "x = bytearray(8 * 1024 ** 3)",
}


@linux
def test_a_hostile_cell_cannot_make_the_env_raise_and_the_session_survives_it():
    env = quick_python_env(max_turns=len(HOSTILE) + 5, output_chars=300)
    tool_reply(env, call("secret = 41"))
    for name, code in HOSTILE.items():
        out = tool_reply(env, call(code))  # a tool message, whatever the cell does
        assert isinstance(out, str) and 0 < len(out) <= 400, name
    assert tool_reply(env, call("print(secret + 1)")) == "42"  # every turn above replayed, or left out


@linux
def test_a_cell_that_does_not_finish_is_not_replayed():
    env = quick_python_env()
    tool_reply(env, call("x = 1"))
    assert "not kept" in tool_reply(env, call("while True:\n    pass"))
    assert env.cells == ["x = 1"]
    start = time.monotonic()
    assert tool_reply(env, call("print(x)")) == "1"
    assert time.monotonic() - start < 1.5  # the loop did not run again


@linux
def test_earlier_cells_that_no_longer_finish_reset_the_session():
    env = quick_python_env()
    deadline = time.time() + 0.5  # the cell finishes now, and exits when it is run again later
    tool_reply(env, call(f"import os, time\nif time.time() > {deadline}:\n    os._exit(0)\nx = 1"))
    time.sleep(0.6)
    assert "session was reset" in tool_reply(env, call("print(x)"))
    assert env.cells == [] and "NameError" in tool_reply(env, call("print(x)"))


@isolated
def test_a_cell_cannot_read_the_host_files_or_reach_the_network(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's data")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    env = quick_python_env(output_chars=2000)
    out = tool_reply(env, call(f"import os\nprint(os.path.exists({str(secret)!r}), os.path.exists({os.getcwd()!r}))\n"
                               f"open({str(secret)!r}).read()"))
    assert out.startswith("False False") and "FileNotFoundError" in out and "trainer's data" not in out
    out = tool_reply(env, call(f"import socket\ns = socket.socket()\ns.settimeout(1)\n"
                               f"s.connect(('127.0.0.1', {server.getsockname()[1]}))\nprint('CONNECTED')"))
    assert "CONNECTED" not in out and "Error" in out
    server.close()
    assert secret.read_text() == "the trainer's data"


# --- search ------------------------------------------------------------------------------------

def test_search_finds_the_fact_and_the_answer_is_checked():
    env = search_env(n_entities=50)
    messages, info = env.reset(seed=3)
    example = info["example"]
    passages = tool_reply(env, f'<tool name="search">{example["question"]}</tool>')
    assert example["answer"] in passages.splitlines()[0] and passages.startswith("[1] ")
    _, reward, terminated, _, _ = env.step(f"<answer> {example['answer'].upper()} </answer>")
    assert (reward, terminated) == (1.0, True)
    env.reset(seed=3)
    assert env.step("<answer>Nowhere</answer>")[1] == 0.0
    env.reset(seed=3)
    assert env.step("<answer></answer>")[1] == 0.0


def test_a_query_cannot_reach_outside_the_corpus():
    passages = ["The capital of Velmora is Drask.", "Velmora exports salt.", "The river Ul flows north."]
    env = search_env(examples=[{"question": "What is the capital of Velmora?", "answer": "Drask"}], n_entities=1)
    env.index = Index(passages)
    env.reset(seed=0)
    for query in ("../../../../etc/passwd", "/etc/shadow velmora", "", " ", "\ud800 velmora", "(.*)+$ [a-z]{99}",
                  "velmora " * 10_000, "{__import__('os').system('id')}", "\x00capital\x00", "ＶＥＬＭＯＲＡ"):
        reply = tool_reply(env, f'<tool name="search">{query}</tool>')
        lines = reply.splitlines()
        assert reply == "no passage matches those words" or all(
            line.split("] ", 1)[1] in passages for line in lines), (query, reply)
    assert "unknown tool" in tool_reply(env, '<tool name="python">print(1)</tool>')


def test_a_corpus_of_your_own(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in ["Tobor keeps the keys.", "Lina keeps bees."]))
    env = search_env(corpus=str(corpus), examples=[{"question": "Who keeps the keys?", "answer": "Tobor"}])
    env.reset(seed=0)
    assert tool_reply(env, '<tool name="search">keys</tool>') == "[1] Tobor keeps the keys."


@pytest.mark.parametrize("content, message", [
    (None, "search corpus {path}: no such file"),
    ("{\"text\": \"ok\"}\nnot json\n", "search corpus {path}: line 2 is not JSON"),
    ("{\"words\": \"ok\"}\n", "search corpus {path}: line 1 has no \"text\" string"),
    ("\n\n", "search corpus {path} has no passages")])
def test_a_bad_corpus_is_one_line(tmp_path, content, message):
    path = tmp_path / "corpus.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(OmnigymError) as error:
        search_env(corpus=str(path), examples=[{"question": "q", "answer": "a"}])
    assert str(error.value) == message.format(path=path) or str(error.value).startswith(message.format(path=path))
    assert "\n" not in str(error.value)


def test_without_bm25s_the_search_env_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bm25s", None)  # import bm25s now raises ImportError
    with pytest.raises(OmnigymError, match=r"^the search env needs bm25s: pip install 'omnigym\[agents\]'$"):
        search_env(n_entities=5)


# --- the guessing game -----------------------------------------------------------------------

def bisect(env, first=None):
    """Plays bisection from ``first``; returns the last step's result."""
    low, high = 1, int(env.example["high"])
    guess = first or (low + high) // 2
    while True:
        messages, reward, terminated, truncated, _ = env.step(f"<guess>{guess}</guess>")
        if terminated or truncated:
            return reward, terminated, truncated, env.turns
        low, high = (guess + 1, high) if "higher" in messages[-1]["content"] else (low, guess - 1)
        guess = (low + high) // 2


def test_bisection_wins_and_fewer_turns_score_more():
    env = guess_env(n=20, max_turns=8)
    env.reset(options={"example": {"question": "Guess.", "answer": "37", "high": 100}})
    reward, terminated, truncated, turns = bisect(env)
    assert (terminated, truncated, turns) == (True, False, 3)  # 50, 25, 37
    assert reward == pytest.approx(1 + 0.5 * 5 / 8)
    env.reset(options={"example": {"question": "Guess.", "answer": "50", "high": 100}})
    assert bisect(env) == (pytest.approx(1 + 0.5 * 7 / 8), True, False, 1)


def test_the_game_ends_at_the_turn_limit_unsolved():
    env = guess_env(n=5, max_turns=3)
    env.reset(options={"example": {"question": "Guess.", "answer": "99", "high": 100}})
    for guess in (1, 2):
        messages, reward, terminated, truncated, _ = env.step(f"<guess>{guess}</guess>")
        assert messages[-1] == {"role": "user", "content": f"{guess} is wrong: the secret is higher."}
    assert env.step("<guess>3</guess>")[1:4] == (0.0, False, True)


@pytest.mark.parametrize("reply", ["<guess>1</guess><guess>7</guess>", "<guess>７</guess>", "<guess>+7</guess>",
                                   "<guess>7.0</guess>", "<guess>0x7</guess>", "7", "<guess>7", "<GUESS>7</GUESS>",
                                   "<guess>-7</guess>", "<guess>107</guess>", "<guess>7</guess> or <guess>8</guess>",
                                   "\ud800<guess>\ud800</guess>", "<guess>" + "9" * 5000 + "</guess>"])
def test_a_malformed_reply_cannot_win(reply):
    env = guess_env(n=5, max_turns=4)
    env.reset(options={"example": {"question": "Guess.", "answer": "7", "high": 100}})
    messages, reward, terminated, truncated, _ = env.step(reply)
    assert (reward, terminated) == (0.0, False) and messages[-1]["content"].startswith("Reply with exactly one guess")
    assert guess_score(reply, {"answer": "7", "high": 100, "turns": 1, "max_turns": 4}) == 0.0


# --- registration, the command line, bad input ------------------------------------------------

def test_the_envs_are_registered_and_listed(capsys):
    from omnigym.cli import main

    assert {"python-v0", "search-v0", "guess-v0"} <= set(TEXT_ENVS)
    assert isinstance(make_text_env("guess-v0", n=3), GuessEnv)
    assert main(["list"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("text envs:"))
    assert all(name in line for name in ("python-v0", "search-v0", "guess-v0"))


def test_the_envs_pickle_for_other_processes():
    import pickle

    for env in (python_env(n=3), search_env(n_entities=5), guess_env(n=3)):
        copy_ = pickle.loads(pickle.dumps(env))
        assert copy_.reset(seed=1)[1]["example"] == env.reset(seed=1)[1]["example"]


@pytest.mark.parametrize("flags, message", [
    (["--env", "pyhton"], "--env must be one of single-turn, tools, python, search, guess, tictactoe, got 'pyhton'"),
    (["--env", "search", "--task", "gsm8k:x.jsonl"], "--env search brings its own task (search-v0); leave out --task"),
    (["--env", "guess", "--max-turns", "0"], "--max-turns must be positive, got 0"),
    (["--task", "pyhton-v0"], "unknown --task 'pyhton-v0'; closest known: python-v0")])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, flags, message):
    from omnigym.cli import main

    assert main(["train", "grpo", "--run-dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_bad_python_kinds_is_one_line():
    with pytest.raises(OmnigymError, match="^python-v0 kinds must be product and/or list, got sums$"):
        python_env(kinds=("sums",))


# --- GRPO through each env --------------------------------------------------------------------

class ScriptedEngine:
    """The real engine's contract, replies from ``policy(conversation, sample index)``: a
    scripted policy whose odd first replies differ (the later turns sample one reply each), so
    each group's rewards differ and GRPO steps."""

    def __init__(self, engine, tokenizer, policy):
        self.engine, self.tokenizer, self.policy = engine, tokenizer, policy

    @property
    def version(self):
        return self.engine.version

    def update_weights(self, named_tensors, version):
        self.engine.update_weights(named_tensors, version)

    def generate(self, prompts, n, params):
        from omnigym.inference.engine import Sample

        groups = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            groups.append([])
            for j in range(n):
                ids = self.tokenizer(self.policy(text, j), add_special_tokens=False)["input_ids"]
                ids.append(self.tokenizer.eos_token_id)
                groups[-1].append(Sample(list(prompt), ids, [-1.0] * len(ids), True))
        return groups


def scripted_replies(examples):
    """The env's own demonstration of the asked question, turn by turn; odd samples answer at once, wrong."""
    by_question = {e["question"]: e for e in examples}

    def policy(env, text, j):
        example = by_question[text.split("<|user|>", 1)[1].split("<|end|>", 1)[0]]
        replies = [m["content"] for m in env.demonstration(example) if m["role"] == "assistant"]
        turn = min(text.count("<|assistant|>") - 1, len(replies) - 1)
        return "<answer>0</answer>" if j % 2 else replies[turn]

    return policy


def guess_policy(text, j):
    """Bisection on the feedback so far; odd samples start at 1 instead of 50."""
    low, high = 1, 100
    feedback = text.split("<|user|>")[2:]
    for line in feedback:
        guess = int(line.split(" ", 1)[0])
        low, high = (guess + 1, high) if "higher" in line else (low, guess - 1)
    return f"<guess>{1 if j % 2 and not feedback else (low + high) // 2}</guess>"


@pytest.mark.parametrize("env_id", ["python", "search", "guess"])
def test_grpo_trains_through_each_tool_env(tmp_path, monkeypatch, env_id):
    pytest.importorskip("transformers")
    import torch

    from omnigym.algos import grpo
    from omnigym.envs.search_env import invented_world

    # the short questions only: the tiny model has 256 positions
    monkeypatch.setitem(TEXT_ENVS, "python-v0", functools.partial(python_env, kinds=("product",)))
    env = make_text_env(f"{env_id}-v0")
    if env_id == "guess":
        policy = guess_policy
    else:
        examples = env.examples if env_id == "python" else invented_world(1500, 0)[1]
        policy = functools.partial(scripted_replies(examples), env)
    real = grpo.make_engine
    monkeypatch.setattr(grpo, "make_engine", lambda model, tokenizer, kind: ScriptedEngine(
        real(model, tokenizer, kind), tokenizer, policy))
    seen, original = {}, grpo.policy_steps

    def watched(cfg, trainer, *args, **kwargs):
        seen.setdefault("before", {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        out = original(cfg, trainer, *args, **kwargs)
        seen["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path), env=env_id, system_prompt="", max_turns=8, sft_steps=0,
                               steps=2, prompts_per_step=2, group_size=2, eval_size=4, eval_every=1,
                               checkpoint_every=10, max_new_tokens=16, progress=False, plot=False,
                               tensorboard=False))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert len(rows) == 2 and all(r["episode/turns"] > 1 for r in rows)
    samples = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    call_tag = {"python": '<tool name="python">', "search": '<tool name="search">', "guess": "<guess>"}[env_id]
    assert samples and all(call_tag in s["completion"] for s in samples)
    if env_id == "python":  # the sandbox's output of the second cell sits in the trajectory
        assert all(s["reward"] >= 1 for s in samples)
    assert any(not torch.equal(seen["before"][n], seen["after"][n]) for n in seen["before"])


def test_the_docs_example_runs_as_written(capsys):
    """docs/text_env.md's ```python block of the tool envs, run as a reader would."""
    import re
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "text_env.md").read_text()
    section = page.split("## Built-in tool envs", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    exec(compile(block, "text_env.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["True", "1.05"] and re.fullmatch(r"50 is wrong: the secret is (higher|lower)\.", lines[2])


@pytest.mark.parametrize("env_id", ["python", "search", "guess"])
def test_max_turns_and_the_system_prompt_reach_the_env(env_id):
    pytest.importorskip("transformers")
    from omnigym.algos import grpo
    from omnigym.envs.task_spec import load_task
    from omnigym.generators.text_tasks import task_env, task_spec

    cfg = grpo.GRPOConfig(env=env_id, max_turns=3, system_prompt="Be brief.", eval_size=5)
    env, _ = task_env(cfg, load_task(task_spec(cfg), 0, 5))
    assert type(env).__name__ == {"python": "PythonEnv", "search": "SearchEnv", "guess": "GuessEnv"}[env_id]
    assert env.max_turns == 3 and env.reset(seed=0)[0][0] == {"role": "system", "content": "Be brief."}
