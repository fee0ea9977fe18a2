"""Invalid-action masking for discrete PPO: the mask comes from ``info["action_mask"]`` or an
``action_masks()`` method; masked actions get probability 0, in training and in eval."""

import json

import numpy as np
import torch

from omnigym.algos import ppo
from omnigym.runs import evaluate_run
from omnigym.models.control import CategoricalHead


def returns(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [row["charts/episodic_return"] for row in rows if "charts/episodic_return" in row]


def test_masked_head_gives_invalid_actions_no_probability_and_finite_gradients():
    torch.manual_seed(0)
    head = CategoricalHead(4, 5)
    features = torch.randn(64, 4, requires_grad=True)
    mask = torch.rand(64, 5) < 0.5
    mask[:, 2] = True  # at least one valid action per row
    actions, log_prob, entropy = head.sample(features, mask=mask)
    assert mask.gather(1, actions[:, None]).all()
    probs = torch.softmax(head.masked_logits(features, mask), -1)
    assert (probs[~mask] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(64))
    (log_prob.sum() + entropy.sum()).backward()
    assert torch.isfinite(features.grad).all() and torch.isfinite(entropy).all()
    assert mask.gather(1, head.mode(features, mask)[:, None]).all()


def test_masked_ppo_never_takes_an_invalid_action_and_learns(tmp_path):
    # An invalid action would end an episode with -10: every return >= 0 means none was taken.
    ppo.train(ppo.PPOConfig(env_id="toy_envs:MaskedChoiceEnv", total_timesteps=20_000, run_dir=str(tmp_path / "r"),
                            progress=False, plot=False, tensorboard=False, seed=1))
    got = returns(tmp_path / "r")
    assert min(got) >= 0
    assert np.mean(got[-5:]) >= 17  # best 20; valid actions at random get 10 (docs/masking.md)
    evaluated = evaluate_run(str(tmp_path / "r"), episodes=5, greedy=True)
    assert min(evaluated) >= 19


def test_mask_from_an_action_masks_method(tmp_path):
    ppo.train(ppo.PPOConfig(env_id="toy_envs:MaskMethodEnv", total_timesteps=3000, run_dir=str(tmp_path / "r"),
                            progress=False, plot=False, tensorboard=False, seed=2))
    got = returns(tmp_path / "r")
    assert len(got) > 5 and min(got) >= 0  # one row per update: each the mean of its episodes
    assert min(evaluate_run(str(tmp_path / "r"), episodes=5)) >= 0


def test_mask_as_a_python_list_in_the_info(tmp_path):
    """It was refused as "shape ()": the vector env holds one list per env as an object array."""
    ppo.train(ppo.PPOConfig(env_id="toy_envs:ListMaskEnv", total_timesteps=3000, run_dir=str(tmp_path / "r"),
                            progress=False, plot=False, tensorboard=False, seed=2))
    got = returns(tmp_path / "r")
    assert len(got) > 5 and min(got) >= 0  # no invalid action taken: the list was read as the mask


def test_reinforce_learns_with_the_mask_and_dqn_evaluates_with_it(tmp_path):
    from omnigym.algos import dqn, reinforce

    # Each step's reward depends on that step's action alone, so gamma 0 credits it exactly.
    reinforce.train(reinforce.ReinforceConfig(env_id="toy_envs:MaskedChoiceEnv", total_timesteps=20_000, seed=1,
                                              gamma=0.0, learning_rate=1e-2, run_dir=str(tmp_path / "re"),
                                              progress=False, plot=False, tensorboard=False))
    got = returns(tmp_path / "re")
    assert min(got) >= 0  # never an invalid action (it would end an episode with -10)
    # valid actions at random get 10, the best 20: 10.2 at the first update, 18.3 at the last here
    assert got[0] < 12 and got[-1] >= 17, got
    assert min(evaluate_run(str(tmp_path / "re"), episodes=5, greedy=True)) == 20  # 20 in all 5 here
    # DQN does not learn with masks, but its eval takes the best *valid* action.
    dqn.train(dqn.DQNConfig(env_id="toy_envs:MaskedChoiceEnv", total_timesteps=600, learning_starts=300,
                            run_dir=str(tmp_path / "dqn"), progress=False, plot=False, tensorboard=False))
    assert min(evaluate_run(str(tmp_path / "dqn"), episodes=3, greedy=True)) >= 0


def test_a_run_that_ends_no_episode_still_finishes_without_a_curve(tmp_path, capsys):
    from omnigym.cli import main

    assert main(["train", "ppo", "--env-id", "toy_envs:MaskedChoiceEnv", "--total-timesteps", "16", "--num-envs", "1",
                 "--num-steps", "16", "--run-dir", str(tmp_path / "r"), "--no-progress"]) == 0
    assert "no learning curve" in capsys.readouterr().err and (tmp_path / "r" / "checkpoint.pt").exists()


def test_the_async_backend_runs_with_and_without_masks(tmp_path):
    for env_id in ("CartPole-v1", "toy_envs:MaskedChoiceEnv"):  # the mask probe must not break async workers
        run = tmp_path / env_id.replace(":", "_")
        ppo.train(ppo.PPOConfig(env_id=env_id, backend="async", num_envs=2, total_timesteps=256, run_dir=str(run),
                                progress=False, plot=False, tensorboard=False))
        assert (run / "checkpoint.pt").exists()
    assert min(returns(tmp_path / "toy_envs_MaskedChoiceEnv")) >= 0  # the mask came from info
