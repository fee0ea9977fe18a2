"""Stable-Baselines3 PPO on CartPole-v1 with RL-Zoo's tuned hyperparameters.

Run by cartpole_vs_anchors.py; prints one line per finished episode in CleanRL's format.
"""

import sys

from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env


class PrintEpisodes(BaseCallback):
    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                print(f"global_step={self.num_timesteps}, episodic_return={info['episode']['r']}", flush=True)
        return True


def linear(start):
    return lambda progress_remaining: progress_remaining * start


seed = int(sys.argv[1])
envs = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", envs, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
            learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed, device="cpu", verbose=0)
model.learn(total_timesteps=100_000, callback=PrintEpisodes())
