import pytest

from omnigym.envs.text import ToolEnv, calculator, make_text_env
from omnigym.errors import OmnigymError
from omnigym.rewards import get_reward


def test_single_turn_episode_is_scored_and_ends():
    env = make_text_env("arithmetic-v0", n=20)
    messages, info = env.reset(seed=1)
    assert messages[-1]["role"] == "user" and messages[-1]["content"].startswith("What is")
    answer = info["example"]["answer"]
    _, reward, terminated, truncated, _ = env.step(f"<think>adding</think><answer>{answer}</answer>")
    assert (reward, terminated, truncated) == (pytest.approx(1.1), True, False)
    env.reset(seed=1)
    assert env.step("<answer>-1</answer>")[1] == pytest.approx(0.05)


def test_tool_env_answers_calls_then_scores_the_final_reply():
    env = ToolEnv([{"question": "What is 6 * 7?", "answer": "42"}], get_reward("math"), max_turns=3)
    env.reset(seed=0)
    messages, reward, terminated, truncated, info = env.step('<tool name="calculator">6 * 7</tool>')
    assert messages[-1] == {"role": "tool", "content": "42"} and not terminated and not truncated
    messages, reward, terminated, truncated, _ = env.step('<tool name="python">print(sum(range(4)))</tool>')
    assert messages[-1]["content"] == "6"
    messages, reward, terminated, truncated, _ = env.step("<answer>42</answer>")
    assert reward == 1.0 and terminated


def test_tool_env_truncates_at_the_turn_limit():
    env = ToolEnv([{"question": "q", "answer": "1"}], get_reward("math"), max_turns=2)
    env.reset()
    env.step('<tool name="calculator">1+1</tool>')
    _, reward, terminated, truncated, _ = env.step('<tool name="calculator">1+1</tool>')
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_calculator_refuses_code():
    assert calculator("2 ** 10") == "1024"
    assert calculator("__import__('os')").startswith("error")


def test_unknown_text_env_id():
    with pytest.raises(OmnigymError, match="unknown text env id 'arithmetc-v0'; closest known ids: arithmetic-v0"):
        make_text_env("arithmetc-v0")


def test_registering_an_env_keeps_the_built_in_ones():
    from omnigym.envs.text import TEXT_ENVS, TextEnv, register_text_env

    def mine(**kwargs):
        return TextEnv([{"question": "Say hi.", "answer": "hi"}], get_reward("keyword"))

    register_text_env("mine-v0", mine)
    try:
        assert make_text_env("mine-v0").reset()[0][-1]["content"] == "Say hi."
        assert make_text_env("arithmetic-v0", n=3).reset(seed=0)[0][-1]["content"].startswith("What is")
        assert make_text_env("arithmetic-tools-v0", n=3).max_turns == 4
    finally:
        TEXT_ENVS.pop("mine-v0")


def test_built_in_envs_pickle_for_other_processes():
    import pickle

    env = pickle.loads(pickle.dumps(make_text_env("arithmetic-v0", n=5)))
    _, info = env.reset(seed=2)
    assert env.step(f"<answer>{info['example']['answer']}</answer>")[1] == pytest.approx(1.05)
