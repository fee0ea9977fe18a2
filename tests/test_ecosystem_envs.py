"""The ecosystem's envs (envs/skyrl.py: --env skyrl:NAME; envs/vf.py: --env vf:MODULE): an
episode's messages and reward are what skyrl-gym's and verifiers' own APIs give for the same
replies, the env's turns are masked in the trajectory, GRPO steps on them, and bad input is
one line with nothing written. The envs are ones the packages ship or ones written in
tests/eco_skyrl_toys.py and tests/eco_vf_toys.py."""

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from omnigym.errors import OmnigymError

skyrl_gym = pytest.importorskip("skyrl_gym")
TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # the toy env modules, importable as a user's own modules are
from eco_helpers import TOOL_TEMPLATE, Endpoint, Retrieval, Scripted, watch_parameters  # noqa: E402


def cli(*args, cwd=TESTS, env=None):
    """``python -m omnigym`` in a fresh process, run from the folder that holds the toy modules."""
    src = str(TESTS.parent / "src")
    environ = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.run([sys.executable, "-m", "omnigym", *args], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=300)


def row(question: str, answer: str, **extra) -> dict:
    from omnigym.envs.skyrl import as_skyrl_row

    return {**as_skyrl_row({"question": question, "answer": answer}, "x"), **extra}


# --- skyrl-gym ---------------------------------------------------------------------------------

def test_a_skyrl_episode_is_what_skyrl_gym_gives_for_the_same_replies():
    from omnigym.envs.skyrl import SkyrlEnv

    example = row("What is 2 + 5?", "7")
    replies = ["I think #### 6", "#### 6", "#### 7"]
    direct = skyrl_gym.make("gsm8k_multi_turn", env_config=None, extras={"reward_spec": example["reward_spec"],
                                                                          "extra_info": {}})
    conversation, _ = direct.init(list(example["prompt"]))
    rewards = []
    for reply in replies:
        out = direct.step(reply)
        conversation += [{"role": "assistant", "content": reply}, *out["observations"]]
        rewards.append(out["reward"])
    assert out["done"] and rewards == [0.04, 0.04, 1.0]

    env = SkyrlEnv("gsm8k_multi_turn", [example], max_turns=5)
    messages, _ = env.reset(options={"example": example})
    for reply in replies:
        messages, reward, terminated, truncated, info = env.step(reply)
    assert messages == conversation and (terminated, truncated) == (True, False)
    assert info["example"]["step_rewards"] == rewards and reward == pytest.approx(sum(rewards))
    assert "step_rewards" not in example  # the episode's rewards live in its own copy


@pytest.mark.parametrize("name, fields, reply, reward", [
    ("gsm8k", {"reward_spec": {"method": "rule", "ground_truth": "7"}}, "so #### 7", 1.0),
    ("gsm8k", {"reward_spec": {"method": "rule", "ground_truth": "7"}}, "7", 0.0),
    ("aime", {"reward_model": {"ground_truth": "7"}}, "Answer: 7", 1.0),  # aime reads reward_model, scores -1/+1
    ("aime", {"reward_model": {"ground_truth": "7"}}, "Answer: 8", -1.0)])
def test_a_single_reply_skyrl_env_scores_as_skyrl_gym_does(name, fields, reply, reward):
    from omnigym.envs.skyrl import SkyrlEnv

    example = {"prompt": [{"role": "user", "content": "2 + 5?"}], "question": "2 + 5?", "answer": "7", **fields}
    direct = skyrl_gym.make(name, env_config=None, extras=fields).step(reply)
    env = SkyrlEnv(name, [example])
    env.reset(options={"example": example})
    messages, ours, terminated, truncated, _ = env.step(reply)
    assert (ours, terminated, truncated) == (direct["reward"], True, False) and ours == reward
    assert messages == [*example["prompt"], {"role": "assistant", "content": reply}]


def test_a_tool_env_of_your_own_turn_by_turn_with_the_observations_masked():
    pytest.importorskip("transformers")
    from omnigym.envs.skyrl import SkyrlEnv, resolve
    from omnigym.generators.text_env import TextEnvGenerator, render
    from omnigym.inference import make_engine
    from omnigym.inference.engine import SamplingParams
    from omnigym.models.lm import load_policy_and_tokenizer

    name = resolve("eco_skyrl_toys:omnigym_calc")
    assert name == "omnigym_calc"
    example = row("3+4", "7")
    env = SkyrlEnv(name, [example], max_turns=4)
    policy, tokenizer = load_policy_and_tokenizer("tiny", 0)
    replies = ["<add>3 4</add>", "<answer>7</answer>"]
    engine = Scripted(make_engine(policy, tokenizer, "auto"), tokenizer, lambda text, j: replies[text.count("<|assistant|>") - 1])
    (episode,) = TextEnvGenerator(env, engine, tokenizer, SamplingParams(max_new_tokens=16)).generate([example], 1).items
    assert episode.reward == pytest.approx(1.1) and episode.info["turns"] == 2  # 0.1 for the tool step, 1 for the answer
    assert episode.example["step_rewards"] == [0.1, 1.0]
    # the tokens are the chat template's rendering of the conversation skyrl-gym made; the tool's
    # answer (a user message) is in them with loss mask 0, the model's replies with 1
    conversation = [*example["prompt"], {"role": "assistant", "content": replies[0]},
                    {"role": "user", "content": "<result>7</result>"}, {"role": "assistant", "content": replies[1]}]
    full = render(tokenizer, conversation, add_generation_prompt=False)
    tokens = episode.prompt_ids + episode.response_ids
    assert tokens == full[:len(tokens)] and len(full) - len(tokens) <= 2  # the template's closing marker aside
    generated = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask) if m],
                                 skip_special_tokens=True)
    inserted = tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask) if not m])
    assert generated == "".join(replies) and "<result>7</result>" in inserted and "<add>" not in inserted


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox runs on Linux only")
def test_skyrls_python_tool_runs_in_omnigyms_sandbox(tmp_path):
    from omnigym.envs.skyrl import SkyrlEnv
    from omnigym.envs.skyrl_sandbox import SandboxedPythonTools
    from omnigym.rewards.sandbox import Sandbox

    secret = tmp_path / "secret.txt"
    secret.write_text("host data")
    example = row("q", "1", max_turns=4)  # searchcode ends at its extras' max_turns, 2 unless given
    env = SkyrlEnv("searchcode", [example], max_turns=4)
    env.reset(options={"example": example})
    group = env.skyrl.tool_groups[1]
    assert isinstance(group, SandboxedPythonTools) and env.skyrl.tool_to_toolgroup["python"] == group.name
    out = env.step("<tool><python>print(6 * 7)</python></tool>")[0][-1]
    assert out == {"role": "user", "content": "42"}
    if Sandbox().isolation().kind == "bubblewrap":
        reply = env.step(f"<tool><python>print(open({str(secret)!r}).read())</python></tool>")[0][-1]["content"]
        assert reply.startswith("Error executing Python code:") and "host data" not in reply


def test_skyrls_search_env_against_a_local_retrieval_server():
    """skyrl's shipped search env, its search_url given by --env-args: the same conversation and
    reward as skyrl-gym's own env for the same replies."""
    from omnigym.envs.skyrl import SkyrlEnv

    example = {"prompt": [{"role": "user", "content": "What is the capital of Naptheul?"}], "env_class": "search",
               "reward_spec": {"method": "rule", "ground_truth": {"target": ["Fitor"]}}, "extra_info": {},
               "question": "What is the capital of Naptheul?", "answer": "Fitor"}
    replies = ["<search>capital Naptheul</search>", "<answer>Fitor</answer>"]
    with Retrieval() as server:
        config = {"search_url": server.url, "log_requests": False, "timeout": 5}
        env = SkyrlEnv("search", [example], config, max_turns=4)
        env.reset(options={"example": example})
        ours = [env.step(reply) for reply in replies]
        from omegaconf import OmegaConf

        direct = skyrl_gym.make("search", env_config=OmegaConf.create({**config, "topk": 3}),
                                extras={k: example[k] for k in ("reward_spec", "extra_info")})
        theirs = [direct.step(reply) for reply in replies]
    assert server.queries == ["capital Naptheul"] * 2
    observation = ours[0][0][-1]
    assert observation == theirs[0]["observations"][0] and observation["role"] == "user"
    assert "Doc 1: The capital of Naptheul is Fitor." in observation["content"]
    assert [o[1] for o in ours] == [0.0, 1.0] == [t["reward"] for t in theirs] and ours[1][2] is True


def first_numbers(text):
    return [int(n) for n in re.findall(r"\d+", text.split("<|user|>", 1)[1].split("<|end|>", 1)[0])]


def calc_policy(text, j):  # even samples use the tool then answer; odd ones answer at once, wrong
    a, b = first_numbers(text)  # "What is 12 + 7?"
    if j % 2:
        return "<answer>0</answer>"
    return f"<add>{a} {b}</add>" if "<result>" not in text else f"<answer>{a + b}</answer>"


def gsm8k_policy(text, j):  # even samples answer right at once; odd ones first wrong (well formatted), then right
    return f"#### {sum(first_numbers(text))}" if j % 2 == 0 else "#### 0"  # later turns sample one reply: j == 0


def search_policy(text, j):  # even samples search, then answer from the passage; odd ones guess wrong
    if j % 2:
        return "<answer>Oss</answer>"
    return "<answer>Fitor</answer>" if "Doc 1:" in text else "<search>capital Naptheul</search>"


SKYRL_RUNS = {  # env -> (policy, --max-turns, mean reward, mean turns, what every greedy sample shows)
    "eco_skyrl_toys:omnigym_calc": (calc_policy, 3, (1.1 + 0.0) / 2, 1.5, "<result>"),
    "gsm8k_multi_turn": (gsm8k_policy, 5, (1.0 + (0.2 / 5 + 1.0)) / 2, 1.5, "####"),  # a turn's format reward: 0.2/5
    "search": (search_policy, 3, (1.0 + 0.0) / 2, 1.5, "Doc 1: The capital of Naptheul is Fitor."),
}


@pytest.mark.parametrize("name", list(SKYRL_RUNS))
def test_grpo_trains_in_a_skyrl_env(tmp_path, monkeypatch, name):
    """A few GRPO steps in skyrl's multi-turn envs (a tool env of the tests', skyrl's gsm8k_multi_turn
    and search, the latter against a local retrieval server): the parameters move, the env's
    reward (the sum of its steps') is logged, the episodes with their env turns are in samples.jsonl."""
    pytest.importorskip("transformers")
    import torch

    from omnigym.algos import grpo

    policy, max_turns, reward, turns, shown = SKYRL_RUNS[name]
    real = grpo.make_engine
    monkeypatch.setattr(grpo, "make_engine", lambda model, tokenizer, kind: Scripted(real(model, tokenizer, kind),
                                                                                      tokenizer, policy))
    seen = watch_parameters(monkeypatch, grpo)
    monkeypatch.chdir(TESTS)
    flags = {}
    with Retrieval() as server:
        if name == "search":  # skyrl's search rows: ground_truth {"target": [...]}, the url in --env-args
            task = tmp_path / "search.jsonl"
            task.write_text("".join(json.dumps({
                "prompt": [{"role": "user", "content": f"Question {i}: what is the capital of Naptheul?"}],
                "env_class": "search", "reward_spec": {"method": "rule", "ground_truth": {"target": ["Fitor"]}},
                "extra_info": {"index": i}}) + "\n" for i in range(8)))
            flags = {"task": str(task), "env_args": json.dumps({"search_url": server.url, "log_requests": False})}
        grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "run"), env=f"skyrl:{name}", sft_steps=0, steps=2,
                                   prompts_per_step=2, group_size=2, eval_size=4, eval_every=1, checkpoint_every=10,
                                   max_new_tokens=16, max_turns=max_turns, progress=False, plot=False,
                                   tensorboard=False, **flags))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(rows) == 2 and all(r["reward/mean"] == pytest.approx(reward) for r in rows)
    assert all(r["groups/kept_fraction"] == 1.0 and r["episode/turns"] == turns for r in rows)
    assert rows[-1]["eval/accuracy"] == 1.0  # greedy: the first sample's path, right
    samples = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl")]
    assert samples and all(shown in s["completion"] for s in samples)
    assert any(not torch.equal(seen["before"][n], seen["after"][n]) for n in seen["before"])


def test_a_skyrl_dataset_file_is_read_as_skyrl_writes_it(tmp_path):
    from omnigym.algos.lm.grpo import GRPOConfig
    from omnigym.generators.text_tasks import text_task

    path = tmp_path / "train.jsonl"
    with open(path, "w") as f:
        for i in range(12):
            f.write(json.dumps({"data_source": "toy", "prompt": [{"role": "user", "content": f"{i}+1"}],
                                "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": str(i + 1)},
                                "extra_info": {"index": i}}) + "\n")
    task, agent = text_task(GRPOConfig(env="skyrl:gsm8k", task=str(path), eval_size=2, sft_steps=0))
    assert agent is None  # a skyrl env is played by the text env generator
    assert len(task.train) == 10 and len(task.heldout) == 2
    example = task.train[0]
    task.env.reset(options={"example": example})
    assert task.env.step("x")[1:3] == (0, True)
    task.env.reset(options={"example": example})
    assert task.env.step(f"#### {example['reward_spec']['ground_truth']}")[1] == 1.0


@pytest.mark.parametrize("flags, message", [
    (["--env", "skyrl:gsm9k"], "--env skyrl:gsm9k: no skyrl-gym env of that name (closest: gsm8k"),
    (["--env", "skyrl:lcb"], "--env skyrl:lcb is refused: its reward runs the model's program with exec()"),
    (["--env", "skyrl:text2sql"], "--env skyrl:text2sql is refused: its tool and its reward run the model's SQL"),
    (["--env", "skyrl:gsm8k", "--rewards", "math:1.0"], "--env skyrl:gsm8k is scored by the env's own rewards"),
    (["--env", "skyrl:eco_skyrl_toys:omnigym_calc"],
     "--env skyrl:omnigym_calc: the warm-up (--sft-steps 1000) needs a 'demonstration'"),
    (["--env", "skyrl:gsm8k", "--env-args", "[1]"], "--env-args must be a JSON object, got list"),
    (["--env", "skyrl:eco_skyrl_toys:omnigym_broken", "--sft-steps", "0"],
     "--env skyrl:omnigym_broken: step() returned observations of type str; a skyrl text env answers with a "
     "list of chat messages"),
    (["--env", "skyrl:eco_skyrl_toys:omnigym_broken", "--sft-steps", "0", "--env-args", '{"how": "raise"}'],
     "--env skyrl:omnigym_broken: step() raised KeyError: 'no such field' (at "),
    (["--env", "skyrl:eco_skyrl_toys:omnigym_broken", "--sft-steps", "0", "--env-args", '{"how": "reward"}'],
     "--env skyrl:omnigym_broken: step() returned reward '1.0'; a reward is a finite number"),
    (["--env", "skyrl:eco_skyrl_toys:omnigym_broken", "--sft-steps", "0", "--env-args", '{"how": "huge"}'],
     "--env skyrl:omnigym_broken: step() returned reward 1e+300; a reward is a finite number, at most 1e+15"),
    (["--env", "vf:no_such_env_module", "--sft-steps", "0"], "--env vf: no_such_env_module:load_environment: no module"),
    (["--env", "vf:eco_skyrl_toys", "--sft-steps", "0"], "--env vf:eco_skyrl_toys: module eco_skyrl_toys"),
    (["--env", "vf:eco_vf_toys", "--env-args", '{"kind": "nothing"}', "--sft-steps", "0"],
     "--env vf:eco_vf_toys: load_environment returned str, not a verifiers Environment"),
    (["--env", "vf:eco_vf_toys", "--env-args", '{"kind": "number_reply"}', "--sft-steps", "0"],
     "--env vf:eco_vf_toys: a rollout with the reply 'ok' raised TypeError: 'int' object is not iterable (at "),
    (["--env", "vf:eco_vf_toys", "--sft-steps", "10"], "--env vf:eco_vf_toys: the warm-up (--sft-steps 10) cannot"),
    (["--env", "vf:eco_vf_toys", "--sft-steps", "0", "--runtime", "ray"],
     "--env vf:eco_vf_toys plays its episodes in this process, through this run's endpoint: use --runtime sync"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, flags, message):
    """Through the CLI's entry point, in this process (a fresh interpreter costs 10 s a case
    here; test_without_the_extra_the_message_names_it runs the command itself)."""
    from omnigym.cli import main

    monkeypatch.chdir(TESTS)
    run = tmp_path / "run"
    code = main(["train", "grpo", "--run-dir", str(run), "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
                 "--eval-size", "2", "--max-new-tokens", "8", "--no-progress", *flags])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("omnigym: error:"), lines
    assert message in lines[0]
    assert not run.exists()


def test_a_row_the_env_rejects_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys):
    from omnigym.cli import main

    task = tmp_path / "rows.jsonl"  # gsm8k_multi_turn reads extras' max_turns, else extra_info's: neither here
    task.write_text("".join(json.dumps({"prompt": f"{i}+1", "env_class": "gsm8k_multi_turn",
                                        "reward_spec": {"method": "rule", "ground_truth": str(i + 1)}}) + "\n"
                            for i in range(12)))
    run = tmp_path / "run"
    assert main(["train", "grpo", "--env", "skyrl:gsm8k_multi_turn", "--task", str(task), "--sft-steps", "0",
                 "--eval-size", "2", "--prompts-per-step", "2", "--run-dir", str(run)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "omnigym: error: --env skyrl:gsm8k_multi_turn refused an example: KeyError: 'extra_info'"]
    assert not run.exists()


def test_the_gsm8k_demonstration_is_skyrls_answer_format():
    from omnigym.envs.skyrl import SkyrlEnv

    env = SkyrlEnv("gsm8k", [row("1+1", "2")])
    (reply,) = env.demonstration({"answer": "2"})
    env.reset(options={"example": row("1+1", "2")})
    assert env.step(reply["content"])[1] == 1.0


@pytest.mark.parametrize("package, env_flag, message", [
    ("skyrl_gym", "skyrl:gsm8k", "--env skyrl:NAME needs skyrl-gym, which is not installed; install it with: "
                                 "pip install 'omnigym[agents]'"),
    ("verifiers", "vf:eco_vf_toys", "--env vf:MODULE needs verifiers, which is not installed; install it with: "
                                    "pip install 'omnigym[agents]'")])
def test_without_the_extra_the_message_names_it(tmp_path, package, env_flag, message):
    blocker = tmp_path / "block" / package
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed here')\n")
    run = tmp_path / "run"
    done = cli("train", "grpo", "--run-dir", str(run), "--env", env_flag, "--sft-steps", "0",
               env={"PYTHONPATH": f"{tmp_path / 'block'}{os.pathsep}{TESTS.parent / 'src'}"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines == [f"omnigym: error: {message}"], done.stderr[-2000:]
    assert not run.exists()


# --- verifiers -----------------------------------------------------------------------------------

def user_turns(messages):
    return [m["content"] for m in messages if m["role"] == "user"]


def vf_reply(messages):
    """Right on the second try for the multi-turn env; a tool call first when the env offers one."""
    question = user_turns(messages)[0]
    a, b = question.split("+")
    if any(m["role"] == "tool" for m in messages):
        return f"<answer>{[m for m in messages if m['role'] == 'tool'][-1]['content']}</answer>"
    if len(user_turns(messages)) == 1 and "try" not in question:
        return "<answer>99</answer>"
    return f"<answer>{int(a) + int(b)}</answer>"


def tool_reply(messages):
    a, b = user_turns(messages)[0].split("+")
    return vf_reply(messages) if any(m["role"] == "tool" for m in messages) else ("add", {"a": int(a), "b": int(b)})


@pytest.mark.parametrize("kind, reply, expected_parts, requests", [
    ("single", vf_reply, {"correct": 0.0, "brief": 0.2}, 1),        # one wrong reply, brief
    ("multi", vf_reply, {"correct": 1.0, "brief": 0.2}, 2),         # wrong, "try again", right
    ("tool", tool_reply, {"correct": 1.0, "brief": 0.2}, 2)])       # the tool call, its result, the answer
def test_a_verifiers_episode_is_what_verifiers_gives_for_the_same_replies(kind, reply, expected_parts, requests):
    from verifiers.clients import OpenAIChatCompletionsClient

    from omnigym.envs.vf import VerifiersAgent, load_vf_environment, rows

    env = load_vf_environment("eco_vf_toys", {"kind": kind})
    example = rows(env.get_dataset())[3]

    async def both():
        async with Endpoint(reply) as endpoint:
            parts = await VerifiersAgent(env, "eco_vf_toys")(endpoint.client, dict(example))
            ours = list(endpoint.requests)
            direct = await env.run_rollout(dict(example), OpenAIChatCompletionsClient(endpoint.client), "m", {})
            return parts, ours, direct, endpoint.requests[len(ours):]

    parts, ours, direct, theirs = asyncio.run(both())
    assert parts == pytest.approx(expected_parts)  # the rubric's weighted functions; the weight-0 metric left out
    assert sum(parts.values()) == pytest.approx(direct["reward"])
    assert [r["messages"] for r in ours] == [r["messages"] for r in theirs] and len(ours) == requests
    if kind == "tool":  # verifiers ran the tool and sent its result back as a tool message
        assert ours[1]["messages"][-1]["role"] == "tool" and ours[1]["messages"][-1]["content"] == "6"  # 3 + 3
        assert ours[0]["tools"][0]["function"]["name"] == "add"


def test_a_failed_verifiers_rollout_raises_for_the_episode():
    from omnigym.envs.vf import VerifiersAgent, load_vf_environment, rows

    env = load_vf_environment("eco_vf_toys", {"kind": "single"})

    async def broken_endpoint():
        import openai

        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0, timeout=2)
        try:
            await VerifiersAgent(env, "eco_vf_toys")(client, rows(env.get_dataset())[0])
        finally:
            await client.close()

    with pytest.raises(Exception, match="verifiers rollout of vf:eco_vf_toys failed|Connection"):
        asyncio.run(broken_endpoint())


def test_the_vf_task_holds_out_eval_size_rows():
    from omnigym.algos.lm.grpo import GRPOConfig
    from omnigym.envs.vf import vf_task

    task, agent = vf_task(GRPOConfig(env="vf:eco_vf_toys", eval_size=5), "eco_vf_toys")
    assert len(task.train) == 35 and len(task.heldout) == 5 and agent.weights == (("correct", 1.0), ("brief", 0.2))
    assert {"prompt", "answer", "question", "example_id"} <= set(task.train[0])
    with pytest.raises(OmnigymError, match="\\(no eval dataset\\) has 40 examples and --eval-size"):
        vf_task(GRPOConfig(env="vf:eco_vf_toys", eval_size=40), "eco_vf_toys")


@pytest.mark.parametrize("kind", ["single", "multi", "tool"])
def test_grpo_trains_in_a_verifiers_env(tmp_path, monkeypatch, kind):
    """A few GRPO steps with a verifiers env's own rollout and rubric, its requests served by
    the run's endpoint: the first episode of each prompt answers right (after a tool call in
    the tool env), the second wrong, so each group's rewards differ and the parameters move."""
    pytest.importorskip("transformers")
    import torch

    from omnigym.algos import grpo

    visits = {}

    def policy(text, j):
        visits[text] = visits.get(text, 0) + 1
        users = re.findall(r"<\|user\|>(.*?)<\|end\|>", text)
        a, b = users[0].split("+")
        first_turn = len(users) == 1 and "<|tool|>" not in text
        if visits[text] > 1 or not first_turn and "<|tool|>" not in text:
            return "<answer>1234</answer>"
        if kind == "tool" and first_turn:
            return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        return f"<answer>{int(a) + int(b)}</answer>"

    real = grpo.make_engine
    monkeypatch.setattr(grpo, "make_engine", lambda model, tokenizer, kind_: Scripted(real(model, tokenizer, kind_),
                                                                                       tokenizer, policy))
    seen = watch_parameters(monkeypatch, grpo)
    monkeypatch.chdir(TESTS)
    template = tmp_path / "template.jinja"  # a file: read_chat_template takes a string this long for a path
    template.write_text(TOOL_TEMPLATE)
    grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "run"), env="vf:eco_vf_toys", env_args=json.dumps({"kind": kind}),
                               chat_template=str(template) if kind == "tool" else None, sft_steps=0, steps=2,
                               prompts_per_step=2, group_size=2, eval_size=4, eval_every=10, checkpoint_every=10,
                               max_new_tokens=48, progress=False, plot=False, tensorboard=False))
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(rows) == 2 and all(r["agent/errors"] == 0 for r in rows)
    # the rubric's parts: correct (weight 1) and brief (0.2); the right episode scores both, the wrong one neither
    assert all(r["reward/correct"] == 0.5 and r["reward/brief"] == pytest.approx(0.1) for r in rows)
    assert all(r["groups/kept_fraction"] == 1.0 for r in rows)
    assert all(r["agent/turns"] == {"single": 1, "multi": 2, "tool": 1.5}[kind] for r in rows)
    if kind == "tool":
        assert all(r["agent/tool_calls"] == 0.5 for r in rows)
    assert any(not torch.equal(seen["before"][n], seen["after"][n]) for n in seen["before"])


@pytest.mark.slow
def test_the_docs_section_runs_as_written(tmp_path):
    """docs/agents.md's "Bring a skyrl-gym or verifiers env", as a user would run it: its files
    written, its commands run from an empty folder."""
    page = (TESTS.parent / "docs" / "agents.md").read_text()
    section = page.split("## Bring a skyrl-gym or verifiers env", 1)[1].split("\n## ", 1)[0]
    outputs = {}
    for kind, body in re.findall(r"```(python|bash)\n(.*?)```", section, re.DOTALL):
        if kind == "python":
            name = body.splitlines()[0].removeprefix("# file: ").strip()
            (tmp_path / name).write_text(body)
            continue
        for line in filter(str.strip, body.splitlines()):
            argv = shlex.split(line)
            assert argv[0] == "omnigym"
            done = cli(*argv[1:], cwd=tmp_path)
            assert done.returncode == 0, (line, done.stderr[-3000:])
            outputs[line] = done.stderr
    assert len(outputs) == 3
    for line, err in outputs.items():
        run = tmp_path / shlex.split(line)[-1]
        rows = [json.loads(r) for r in open(run / "metrics.jsonl")]
        assert "held-out accuracy before GRPO" in err and rows and "reward/mean" in rows[-1], line
    gsm8k = [json.loads(r) for r in open(tmp_path / "runs" / "skyrl-gsm8k" / "metrics.jsonl")]
    assert any(r.get("reward/mean", 0) > 0 for r in gsm8k)  # the warm-up taught skyrl's "#### N": rewards come
    vf_rows = [json.loads(r) for r in open(tmp_path / "runs" / "vf-add" / "metrics.jsonl")]
    assert {"reward/correct", "reward/brief", "agent/errors"} <= set(vf_rows[-1])
