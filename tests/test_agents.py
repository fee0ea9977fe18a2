"""``--agent MODULE:FUNCTION``: an agent written with the ``openai`` package only (a file the
test writes, the way a user would) trains on the tiny model; an agent that raises, hangs or
returns no number costs its episode, not the run; a bad --agent is one line, nothing written."""

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from agent_helpers import TOOL_TEMPLATE
from omnigym.agents.episodes import reward_of
from omnigym.algos.lm import grpo
from omnigym.cli import main
from omnigym.generators.base import Trajectories, Trajectory
from omnigym.models.lm import build_tiny_model, load_tokenizer
from omnigym.rl.advantages import get_advantage

SOURCE = str(Path(grpo.__file__).parents[3])
"""this checkout's src/: a subprocess imports omnigym from here, and the user's files from its own folder only"""

TWO_TURN_AGENT = '''
import json

import openai

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "the answer to a question",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]


async def run(client: openai.AsyncOpenAI, example: dict) -> dict:
    messages = [{"role": "user", "content": example["question"]}]
    reply = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS, max_tokens=16)
    message = reply.choices[0].message
    messages.append(message)
    call_id = message.tool_calls[0].id if message.tool_calls else "none"
    messages.append({"role": "tool", "tool_call_id": call_id, "content": "it is " + str(example["answer"])})
    reply = await client.chat.completions.create(model="any", messages=messages, tools=TOOLS, max_tokens=16)
    text = reply.choices[0].message.content or ""
    return {"vowels": sum(text.count(v) for v in "aeo") / 16, "answered": float(str(example["answer"]) in text)}
'''


def write(folder, name, text):
    (folder / name).write_text(textwrap.dedent(text))


def rows(path):
    return [json.loads(line) for line in open(path)]


def test_an_openai_only_agent_trains_with_grpo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "two_turn_agent.py", TWO_TURN_AGENT)
    write(tmp_path, "tools.jinja", TOOL_TEMPLATE)
    assert "omnigym" not in TWO_TURN_AGENT
    seen, original = {}, grpo.policy_steps

    def watched(cfg, trainer, *args, **kwargs):
        seen.setdefault("before", {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        out = original(cfg, trainer, *args, **kwargs)
        seen["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        seen.setdefault("trained", []).extend(args[1].items)  # the trajectories of the informative groups
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    code = main(["train", "grpo", "--agent", "two_turn_agent:run", "--chat-template", "tools.jinja", "--sft-steps", "0",
                 "--steps", "3", "--prompts-per-step", "3", "--group-size", "3", "--eval-size", "4",
                 "--eval-every", "2", "--run-dir", "run", "--no-progress", "--no-plot", "--no-tensorboard"])
    assert code in (0, None)
    logged = rows(tmp_path / "run" / "metrics.jsonl")
    assert len([r for r in logged if "reward/mean" in r]) == 3
    assert all("reward/vowels" in r and "reward/answered" in r for r in logged if "reward/mean" in r)
    assert any(r.get("reward/vowels", 0) > 0 for r in logged)
    assert all(r["agent/turns"] == 2 and r["agent/errors"] == 0 for r in logged if "reward/mean" in r)
    changed = [n for n in seen["before"] if not torch.equal(seen["before"][n], seen["after"][n])]
    assert len(changed) >= len(seen["before"]) // 2
    tokenizer = load_tokenizer(str(build_tiny_model(tmp_path / "tokenizer")))
    stitched = [t for t in seen["trained"] if t.info["sequences"] == 1]
    assert stitched  # an episode whose two requests made one sequence was trained on
    for trajectory in stitched:  # trained on the model's tokens only: the tool's reply is in the sequence, masked
        assert len(trajectory.loss_mask) == len(trajectory.response_ids) == len(trajectory.logprobs)
        inserted = tokenizer.decode([i for i, m in zip(trajectory.response_ids, trajectory.loss_mask) if m == 0])
        assert f"<|tool|>it is {trajectory.example['answer']}<|end|><|assistant|>" in inserted
        assert sum(trajectory.loss_mask) <= 2 * 16  # two replies of at most max_tokens 16
        assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, trajectory.loss_mask) if m == 0)
    samples = rows(tmp_path / "run" / "samples.jsonl")
    assert samples and all(len(s["transcript"]) == 2 for s in samples)
    assert samples[0]["transcript"][1]["asked"]["role"] == "tool"
    assert all("tool_calls" in turn and "finish_reason" in turn for s in samples for turn in s["transcript"])


A_AGENT = '''
async def run(client, example):
    reply = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": example["question"]}])
    text = reply.choices[0].message.content or ""
    return text.count("a") / max(len(text), 1)
'''
"""rewarded for the share of 'a' in its reply: an untrained tiny model starts near 0"""


def test_agent_episodes_run_with_async_rollouts(tmp_path, monkeypatch):
    """--rollouts async plays the agent's episodes independently, on the sampler's own copy of
    the policy: the steps train and the scheduler's metrics are there beside the agent's."""
    monkeypatch.chdir(tmp_path)
    # varies from the start; a module name of its own: Python keeps the first module of a name it imports
    write(tmp_path, "distinct_agent.py", A_AGENT.replace('text.count("a")', 'len(set(text))'))
    seen, original = {}, grpo.policy_steps

    def watched(cfg, trainer, *args, **kwargs):
        seen.setdefault("before", {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        out = original(cfg, trainer, *args, **kwargs)
        seen["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    assert main(["train", "grpo", "--agent", "distinct_agent:run", "--rollouts", "async", "--sft-steps", "0",
                 "--steps", "3", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "12", "--eval-size", "4",
                 "--eval-every", "100", "--run-dir", "run", "--no-progress", "--no-plot", "--no-tensorboard"]) in (0, None)
    logged = [r for r in rows(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert len(logged) == 3 and all(r["agent/errors"] == 0 and r["agent/turns"] == 1 for r in logged)
    assert all("rollout/staleness_max" in r for r in logged)
    assert any(not torch.equal(seen["before"][n], seen["after"][n]) for n in seen["before"])


def run_fresh(folder, args: list[str]) -> None:
    """The command in a process of its own, as a user runs it: in the suite's process, an agent
    module of the same name imported by an earlier test (another a_agent.py, rewarding the count of
    distinct characters) was the one Python kept in sys.modules, and the rewards were its."""
    done = subprocess.run([sys.executable, "-m", "omnigym", *args], cwd=folder, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": SOURCE, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_text_reinforce_learns_through_an_agent(tmp_path, monkeypatch):
    """REINFORCE through the endpoint: the agent's reward (the share of 'a' in its reply)
    goes up. Measured (seed 1): 0.006, 0.016, 0.040 at steps 1-3, 0.78, 0.85, 0.89 at steps 13-15; not
    repeatable bit for bit (see the GRPO test below), hence the wide margins."""
    write(tmp_path, "a_agent.py", A_AGENT)
    run_fresh(tmp_path, ["train", "text_reinforce", "--agent", "a_agent:run", "--steps", "15", "--seed", "1",
                         "--learning-rate", "3e-3", "--run-dir", "run", "--no-progress", "--no-plot",
                         "--no-tensorboard"])
    rewards = [r["reward/mean"] for r in rows(tmp_path / "run" / "metrics.jsonl")]
    assert sum(rewards[:3]) / 3 < 0.05 and sum(rewards[-3:]) / 3 > 0.5


@pytest.mark.slow
def test_grpo_learns_through_an_agent(tmp_path, monkeypatch):
    """GRPO through the endpoint, the same reward. Measured (seed 1): 0.007, 0.021, 0.031 at steps
    1-3, 0.64, 0.75, 0.76 at steps 13-15. Not repeatable bit for bit (which requests share an
    engine call depends on timing), hence the wide margins."""
    write(tmp_path, "a_agent.py", A_AGENT)
    run_fresh(tmp_path, ["train", "grpo", "--agent", "a_agent:run", "--sft-steps", "0", "--steps", "15",
                         "--prompts-per-step", "4", "--group-size", "8", "--learning-rate", "3e-3", "--max-new-tokens",
                         "16", "--eval-size", "4", "--eval-every", "100", "--seed", "1", "--run-dir", "run",
                         "--no-progress", "--no-plot", "--no-tensorboard"])
    rewards = [r["reward/mean"] for r in rows(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert sum(rewards[:3]) / 3 < 0.05 and sum(rewards[-3:]) / 3 > 0.4



def test_an_agent_capped_by_its_own_max_tokens_is_told_so(tmp_path, monkeypatch, capsys):
    """The run's closing lines name the limit that cut the replies off: the agent asks for 4
    tokens under --max-new-tokens 16, and raising --max-new-tokens would change nothing."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "short_agent.py", '''
        async def run(client, example):
            messages = [{"role": "user", "content": example["question"]}]
            reply = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
            return float(reply.choices[0].finish_reason == "stop")
    ''')
    code = main(["train", "grpo", "--agent", "short_agent:run", "--sft-steps", "0", "--steps", "1",
                 "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "16", "--eval-size", "2",
                 "--eval-every", "100", "--run-dir", "run", "--no-progress", "--no-plot", "--no-tensorboard"])
    assert code in (0, None)
    [logged] = [r for r in rows(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert logged["completion/cut_by_max_tokens_fraction"] == logged["completion/cut_off_fraction"] > 0
    assert logged["completion/cut_by_max_new_tokens_fraction"] == 0
    said = capsys.readouterr().err  # the closing lines go to stderr
    assert "by the agent's own max_tokens:" in said and "raise max_tokens in its requests" in said
    assert "raise --max-new-tokens" not in said, said

def test_an_agent_that_changes_directory_moves_none_of_the_runs_files(tmp_path, monkeypatch):
    """A coding agent's os.chdir moved the trainer's relative --run-dir with it: samples.jsonl was not found
    under the agent's folder (a FileNotFoundError traceback), and the trainer wrote where the agent chose."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    write(tmp_path, "mover.py", f'''
        import os

        async def run(client, example):
            os.chdir({str(tmp_path / "elsewhere")!r})
            reply = await client.chat.completions.create(model="tiny", messages=[{{"role": "user", "content": "hi"}}])
            return 0.5
    ''')
    code = main(["train", "grpo", "--agent", "mover:run", "--sft-steps", "0", "--steps", "2", "--prompts-per-step", "2",
                 "--group-size", "2", "--max-new-tokens", "4", "--eval-size", "2", "--eval-every", "1", "--run-dir",
                 "rel/run", "--no-progress", "--no-plot", "--no-tensorboard"])
    assert code in (0, None) and os.getcwd() == str(tmp_path)
    assert (tmp_path / "rel" / "run" / "samples.jsonl").is_file() and (tmp_path / "rel" / "run" / "model").is_dir()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_stop_ends_the_agents_episodes_now_not_after_the_agent_timeout(tmp_path):
    """SIGTERM (after its grace) and Ctrl-C waited for every running episode to reach --agent-timeout (300 s by
    default), then said the episodes had failed for taking too long."""
    import signal
    import time

    write(tmp_path, "sleeper.py", f'''
        import asyncio
        import pathlib

        async def run(client, example):
            pathlib.Path({str(tmp_path / "asleep")!r}).touch()
            await asyncio.sleep(1000)
            return 0.0
    ''')
    process = subprocess.Popen(
        [sys.executable, "-m", "omnigym", "train", "grpo", "--agent", "sleeper:run", "--sft-steps", "0", "--steps", "2",
         "--prompts-per-step", "2", "--group-size", "2", "--eval-size", "2", "--agent-timeout", "300", "--run-dir", "run",
         "--no-progress"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": f"{SOURCE}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1",
             "OMNIGYM_STOP_GRACE": "1"})
    deadline = time.monotonic() + 300
    while not (tmp_path / "asleep").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert time.monotonic() - signalled < 60, err  # the grace (1 s) and the way out, not --agent-timeout's 300 s
    assert process.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err
    assert "did not finish within --agent-timeout" not in err and not (tmp_path / "run").exists()


def test_agents_that_raise_hang_or_return_no_number_cost_their_episode(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    task = tmp_path / "kinds.jsonl"
    task.write_text("\n".join(json.dumps({"question": f"{kind} {i}", "answer": "x"})
                              for i in range(3) for kind in ("ok", "raise", "hang", "text", "block", "exit")))
    write(tmp_path, "flaky.py", '''
        import asyncio
        import time

        async def run(client, example):
            reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
            kind = example["question"].split()[0]
            if kind == "raise":
                raise ValueError(f"the tool was down for {example['question']}")  # said once all the same
            if kind == "hang":
                await asyncio.sleep(3600)
            if kind == "block":  # holds its thread, not an await: the timeout walks away from it
                time.sleep(30)
            if kind == "exit":
                raise SystemExit(3)
            if kind == "text":
                return "fine"
            return len(reply.choices[0].message.content or "") / 24
    ''')
    code = main(["train", "grpo", "--agent", "flaky:run", "--task", str(task), "--sft-steps", "0", "--steps", "1",
                 "--prompts-per-step", "14", "--group-size", "2", "--eval-size", "4", "--eval-every", "100",
                 "--agent-timeout", "8", "--run-dir", "run", "--no-progress", "--no-plot", "--no-tensorboard"])
    assert code in (0, None)
    from omnigym.envs.task_spec import load_task

    train = load_task(str(task), 1, 4, 2, 2, "+").train  # the run's training split (seed 1 is the default)
    kinds = [e["question"].split()[0] for e in train]
    assert len(train) == 14  # every training example is drawn each step
    logged = [r for r in rows(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r]
    assert [r["agent/errors"] for r in logged] == [2 * (len(kinds) - kinds.count("ok"))]
    assert [r["agent/timeouts"] for r in logged] == [2 * (kinds.count("hang") + kinds.count("block"))]
    assert all(r["groups/kept_fraction"] <= kinds.count("ok") / 14 + 1e-6 for r in logged)  # float32
    err = capsys.readouterr().err
    assert err.count("ValueError: the tool was down") == 1
    assert err.count("did not finish within --agent-timeout 8 s") == 1
    assert err.count("the agent returned 'fine' (str): return a finite number") == 1
    assert err.count("the agent raised SystemExit: 3") == 1


def test_a_failed_episode_is_out_of_its_groups_baseline():
    def trajectory(reward, group, error=None):
        return Trajectory([1], [2, 3], [1, 1], [-0.1, -0.1], reward, group, 0, {},
                          {"error": error} if error else {})

    batch = Trajectories([trajectory(1.0, 0), trajectory(0.0, 0), trajectory(0.0, 0, "raised"),
                          trajectory(1.0, 1), trajectory(0.0, 1, "timed out")])
    cfg = grpo.GRPOConfig(group_size=3)
    advantages, informative = grpo.group_advantages(cfg, get_advantage("dr_grpo"), batch)
    # group 0's baseline is the mean of its two finished episodes (0.5), not of all three
    assert advantages[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0, 0.0])
    assert informative.tolist() == [True, True, False, False, False]  # group 1 has one finished episode


def test_an_agents_return_value_is_its_reward():
    assert reward_of(0.5) == (0.5, {})
    assert reward_of(True) == (1.0, {})
    assert reward_of({"correct": 1, "format": 0.25}) == (1.25, {"correct": 1.0, "format": 0.25})
    for bad in (None, "1.0", float("nan"), {}, {"a": "1"}, {"a": float("inf")}, [1.0]):
        with pytest.raises(Exception, match="return a finite number, or a dict of them"):
            reward_of(bad)


BAD_AGENTS = '''
def not_async(client, example):
    return 1.0


async def one_argument(client):
    return 1.0


async def sends_tools(client, example):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
    return 1.0


async def fine(client, example):
    return 1.0
'''


@pytest.mark.parametrize("flags, message", [
    (["--agent", "nowhere:run"], "--agent nowhere:run: no module named 'nowhere' here"),
    (["--agent", "agents_here:missing"], "--agent agents_here:missing: module agents_here has no 'missing'"),
    (["--agent", "agents_here:not_async"], "--agent agents_here:not_async is not an async function"),
    (["--agent", "agents_here:one_argument"], "--agent agents_here:one_argument(client) cannot be called as "
                                              "run(client, example)"),
    (["--agent", "agents_here.py:fine"], "name the module without .py"),
    (["--agent", "agents_here:sends_tools"], "the agent sent tools, but the model's chat template ignores tools="),
    (["--agent", "agents_here:fine", "--runtime", "ray"], "--agent runs its episodes in this process"),
    (["--agent", "agents_here:fine", "--rewards", "math:1.0"], "leave out --rewards and --env"),
    (["--agent", "agents_here:fine", "--agent-timeout", "0"], "--agent-timeout must be positive, got 0.0"),
    (["--agent-concurrency", "4"], "--agent-concurrency: read with --agent only"),
])
def test_a_bad_agent_is_one_line_and_nothing_written(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "agents_here.py", BAD_AGENTS)
    before = sorted(os.listdir(tmp_path))
    code = main(["train", "grpo", *flags, "--sft-steps", "0", "--steps", "1", "--prompts-per-step", "2",
                 "--group-size", "2", "--eval-size", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("omnigym: error:") and message in err and len(err.splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == before  # no runs/, no run directory


def test_agent_runs_train_in_one_process():
    """Under torchrun, each process would play episodes of its own (timing makes them differ)."""
    from omnigym.errors import OmnigymError

    with pytest.raises(OmnigymError, match="--agent plays its episodes in one process: use --training-backend local"):
        grpo.GRPOConfig(agent="a:run", training_backend="ddp").check_agent()


def test_the_command_line_refuses_a_sync_agent_in_one_line(tmp_path):
    write(tmp_path, "agents_here.py", BAD_AGENTS)
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "text_reinforce", "--agent",
                           "agents_here:not_async"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": SOURCE})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["omnigym: error: --agent agents_here:not_async is not an async "
                                                "function: write it as async def run(client, example) (it gets an "
                                                "openai.AsyncOpenAI client)"]
    assert sorted(os.listdir(tmp_path)) == ["agents_here.py"]


SECTION = re.compile(r"\n## Write your own agent\n(.*?)\n## ", re.DOTALL)
BLOCK = re.compile(r"```(python|jinja|bash)\n(.*?)```", re.DOTALL)
FILE = re.compile(r"^(?:# file: |\{# file: )(\S+)")


@pytest.mark.slow
def test_the_write_your_own_agent_section_runs_as_written(tmp_path):
    """docs/agents.md's example, as a user copies it: its files written, its command run."""
    section = SECTION.search((Path(__file__).parent.parent / "docs" / "agents.md").read_text()).group(1)
    written, commands = [], []
    for kind, body in BLOCK.findall(section):
        name = FILE.match(body)
        if name:
            (tmp_path / name.group(1)).write_text(body)
            written.append(name.group(1))
        elif kind == "bash":
            commands += [line for line in body.splitlines() if line.strip()]
    assert written == ["my_agent.py", "tools.jinja"] and len(commands) == 1
    agent = (tmp_path / "my_agent.py").read_text()
    assert "omnigym" not in agent and "import openai" in agent  # the openai package only
    omnigym = str(Path(sys.executable).parent / "omnigym")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": SOURCE}
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "omnigym"
        done = subprocess.run([omnigym, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    logged = [r for r in rows(tmp_path / "runs" / "my-agent" / "metrics.jsonl") if "reward/mean" in r]
    assert len(logged) == 2 and all("reward/correct" in r and "reward/used_tool" in r for r in logged)
    assert all(r["agent/errors"] == 0 and 1 <= r["agent/turns"] <= 3 for r in logged)
    samples = rows(tmp_path / "runs" / "my-agent" / "samples.jsonl")
    assert samples and all(s["transcript"][0]["asked"] == {"role": "user", "content": s["prompt"]} for s in samples)


def test_an_agent_with_the_default_warm_up_is_one_line(tmp_path, monkeypatch, capsys):
    """The warm-up imitates the task env's scripted answers: with --agent it would spend 1000
    steps on a format the agent never asks for, so it must be turned off, said in one line."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "agents_here.py", BAD_AGENTS)
    code = main(["train", "grpo", "--agent", "agents_here:fine", "--steps", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "the warm-up (--sft-steps 1000) imitates" in err and "--sft-steps 0" in err, err
    assert len(err.splitlines()) == 1 and not (tmp_path / "runs").exists()
