"""PPO with a recurrent (LSTM) policy, following CleanRL's ``ppo_atari_lstm.py``.

For envs whose observation does not hold the whole state (``omnigym/CartPoleNoVel-v1``:
CartPole without its velocities), the policy must remember. Three things differ from
``ppo.py``; the rest (GAE, the clipped loss, the value loss, the schedule) is the same:

1. The rollout carries the LSTM's hidden state from step to step and from one rollout to
   the next; it is zeroed for an env whose observation begins an episode (``starts``), so no
   memory crosses an episode boundary.
2. The update does not shuffle single transitions: it replays each env's whole sequence
   through the LSTM from the state the rollout began with, with the same zeroing, so the
   hidden states of the first epoch are the rollout's own and the recomputed log-probs equal
   the rollout's (``tests/test_recurrent.py`` checks both).
3. A minibatch is a set of whole envs (``num_envs / num_minibatches`` sequences), as in CleanRL.

Defaults are RL-Zoo's tuned RecurrentPPO settings for CartPoleNoVel-v1 (8 envs x 32 steps,
gamma 0.98, lambda 0.8, lr 1e-3 decaying, 20 epochs of one minibatch, no entropy bonus,
normalized observations, a 64-unit LSTM, 64-unit actor and critic MLPs after it) with one LSTM
shared by actor and critic (RL-Zoo gives the critic its own): docs/recurrent.md has the figures.
Discrete actions take the env's action mask where it gives one; 1-D boxes get a Gaussian
head. ``omnigym eval`` replays the policy with its memory reset where each episode begins
(``load_policy``).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from omnigym.config import ControlConfig, require_fraction, require_non_negative, require_positive, require_rollout_holds_a_step
from omnigym.envs.vector import make_run_envs
from omnigym.errors import OmnigymError, require
from omnigym.models.control import obs_tensor
from omnigym.models.recurrent import RecurrentActorCritic
from omnigym.optim import Adam, clip_grad_norm
from omnigym.process import scoped_run
from omnigym.rl.advantages import AdvantageConfig, EpisodeEnds, gae, normalize
from omnigym.rl.losses import PolicyLossConfig, check_finite, ppo_clip, value_loss
from omnigym.rl.rollout import RolloutCollector
from omnigym.rl.running_stats import RunningMeanStd
from omnigym.track.episodes import EpisodeStats, close_control_run
from omnigym.track.progress import Clock, ProgressBar, whole_rollouts
from omnigym.track.run import start_run
from omnigym.track.stopping import checkpoint_due


@dataclass
class PPOLSTMConfig(ControlConfig):
    num_envs: int = 8
    num_steps: int = 32
    """steps per env per rollout: the length of the sequences the update replays"""
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    gamma: float = 0.98
    gae_lambda: float = 0.8
    update_epochs: int = 20
    num_minibatches: int = 1
    """minibatches per epoch, each of num_envs / num_minibatches whole env sequences"""
    clip_coef: float = 0.2
    clip_vloss: bool = False
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    normalize_obs: bool = True
    """normalize observations with running statistics (saved in checkpoints; eval uses the saved ones)"""
    hidden: tuple[int, ...] = (64,)
    """the actor's and the critic's MLPs after the LSTM"""
    lstm_size: int = 64
    """units of the LSTM cell (its hidden state and its output)"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("lstm_size", "normalize_obs")

    def check(self) -> None:
        super().check()
        require_positive(self, "num_steps", "learning_rate", "update_epochs", "num_minibatches", "max_grad_norm",
                         "lstm_size")
        require_rollout_holds_a_step(self)
        require_non_negative(self, "clip_coef", "ent_coef", "vf_coef")
        require_fraction(self, "gamma", "gae_lambda")
        require_positive(self, "hidden")
        require(self.num_envs % self.num_minibatches == 0,
                f"--num-minibatches {self.num_minibatches} must divide --num-envs {self.num_envs}: a minibatch is a "
                "set of whole env sequences")
        require(not self.pixels, "ppo_lstm reads state vectors; for --pixels use omnigym train ppo")


CONFIG = PPOLSTMConfig


class RecurrentStepper:
    """The LSTM agent as ``RolloutCollector``'s torch path steps it: ``act(obs, mask=)`` once per
    env step, ``value(obs)`` once after the last, with the hidden state carried between the calls.

    Before each step it reads the collector's cursor: an env whose step is an autoreset (NEXT_STEP
    mode, envs/cursor.py) shows a new episode's first observation on the step after, so its state
    is zeroed there. Per rollout it records the state it began from and the ``starts`` of each step:
    what the update replays. Its ``state_dict`` is that state, so a resumed run goes on with the
    memory its envs' episodes had."""

    def __init__(self, agent: RecurrentActorCritic, collector: RolloutCollector, device):
        self.agent, self.collector, self.device = agent, collector, device
        num_envs = collector.envs.num_envs
        self.state = agent.initial_state(num_envs, device)
        self.next_starts = np.ones(num_envs, dtype=bool)  # the first observations begin episodes
        self.starts = np.zeros((collector.num_steps, num_envs), dtype=bool)
        self.initial_state, self.t = self.state.clone(), 0

    def collect(self, global_step: int):
        """One rollout; returns ``(rollout, global_step, starts [T, N], initial state)``."""
        self.initial_state, self.t = self.state.clone(), 0
        rollout, global_step = self.collector.collect(self, global_step)
        return rollout, global_step, torch.from_numpy(self.starts.copy()), self.initial_state

    def act(self, obs, action=None, mask=None):
        starts = self.next_starts
        self.starts[self.t] = starts
        self.next_starts, self.t = self.collector.cursor.autoreset.copy(), self.t + 1
        action, log_prob, entropy, value, self.state = self.agent.act(
            obs[None], torch.from_numpy(starts[None]).to(self.device), self.state, action,
            None if mask is None else mask[None])
        return action[0], log_prob[0], entropy[0], value[0]

    def value(self, obs):  # the observation after the rollout's last step; the state is not advanced
        return self.agent.value(obs[None], torch.from_numpy(self.next_starts[None]).to(self.device), self.state)[0]

    def state_dict(self) -> dict:
        return {"state": self.state.cpu(), "next_starts": self.next_starts.copy()}

    def load_state_dict(self, saved: dict) -> None:
        self.state, self.next_starts = saved["state"].to(self.device), saved["next_starts"].copy()


@scoped_run
def train(cfg: PPOLSTMConfig) -> dict:
    envs, signal = make_run_envs(cfg, "ppo_lstm")  # bad ids fail before the run dir exists
    try:
        agent = RecurrentActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden,
                                     cfg.lstm_size).to(cfg.device)
    except OmnigymError:
        envs.close()
        raise
    run = start_run(cfg, "ppo_lstm", cfg.env_id)
    optimizer = Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    stats = EpisodeStats(cfg.print_episodes)
    collector = RolloutCollector(envs, cfg.num_steps, stats, cfg.device, cfg.seed, cfg.normalize_obs, signal=signal)
    stepper = RecurrentStepper(agent, collector, cfg.device)
    components = {"model": agent, "optimizer": optimizer, "episodes": stats, "collector": collector,
                  "memory": stepper}
    counters = run.begin(components)  # restores the checkpoint (the hidden state with it) when resuming
    global_step, first_update = counters.get("global_step", 0), counters.get("update", 0)
    batch_size = cfg.num_steps * cfg.num_envs
    num_updates = whole_rollouts(cfg.total_timesteps, cfg.num_envs, cfg.num_steps)
    advantage_cfg = AdvantageConfig(cfg.gamma, cfg.gae_lambda)
    loss_cfg = PolicyLossConfig(clip_low=cfg.clip_coef)
    envs_per_batch = cfg.num_envs // cfg.num_minibatches

    progress = ProgressBar(num_updates * batch_size, "ppo_lstm", start=global_step, enabled=cfg.progress)
    clock = Clock(global_step)
    for update in range(first_update, num_updates):
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.learning_rate * (1.0 - update / num_updates)

        # 1. Roll out with the hidden state carried; 2. GAE as in ppo.py (on [envs, steps]).
        rollout, global_step, starts, initial_state = stepper.collect(global_step)
        progress.update(global_step, sps=int(clock.sps(global_step)), **stats.shown())
        ends = EpisodeEnds(rollout.terminated.T, rollout.truncated.T, rollout.bootstrap_values.T)
        advantages, returns = gae(rollout.rewards.T, rollout.valid.T, values=rollout.values.T, cfg=advantage_cfg,
                                  ends=ends)
        sequences = [None if x is None else x.to(cfg.device) for x in (
            rollout.obs, starts, rollout.actions, rollout.masks, rollout.logprobs, rollout.values,
            advantages.T, returns.T, rollout.valid)]

        # 3. Clipped policy steps; a minibatch is whole env sequences ([steps, some envs]), replayed
        # from the state the rollout began with. Autoreset steps (not valid) are left out of the losses.
        clip_fractions = []
        for _ in range(cfg.update_epochs):
            order = torch.randperm(cfg.num_envs, device=cfg.device)
            for begin in range(0, cfg.num_envs, envs_per_batch):
                envs_in = order[begin:begin + envs_per_batch]
                loss, pg_loss, pg_stats, v_loss, entropy_loss = sequence_objective(
                    agent, cfg, loss_cfg, initial_state[:, envs_in],
                    *(None if x is None else x[:, envs_in] for x in sequences))
                check_finite(loss, global_step)
                optimizer.zero_grad()
                loss.backward()
                clip_grad_norm(agent.parameters(), cfg.max_grad_norm)
                optimizer.step()
                clip_fractions.append(pg_stats["clip_fraction"])

        # 4. Log, show, checkpoint.
        valid = rollout.valid
        b_returns, b_values = returns.T[valid], rollout.values[valid]
        variance = b_returns.var()
        explained_variance = float("nan") if variance == 0 else (1 - (b_returns - b_values).var() / variance).item()
        run.log(global_step, {
            **stats.drain(),
            "losses/policy_loss": pg_loss.item(), "losses/value_loss": v_loss.item(),
            "losses/entropy": entropy_loss.item(), "losses/approx_kl": pg_stats["approx_kl"].item(),
            "losses/clip_fraction": torch.stack(clip_fractions).mean().item(),
            "losses/explained_variance": explained_variance,
            "charts/learning_rate": optimizer.param_groups[0]["lr"], "perf/sps": clock.sps(global_step),
        })
        if update == num_updates - 1 or checkpoint_due(global_step, global_step - batch_size, cfg.checkpoint_every):
            run.save(components, global_step=global_step, update=update + 1)
    progress.close()
    collector.envs.close()
    return close_control_run(run, stats, cfg.plot, global_step, stepped=num_updates * batch_size)


def sequence_objective(agent, cfg: PPOLSTMConfig, loss_cfg: PolicyLossConfig, initial_state, obs, starts, actions,
                       masks, old_logprobs, old_values, advantages, returns, valid):
    """PPO's loss on some envs' whole sequences (each ``[T, envs, ...]``), replayed from
    ``initial_state``: ``(loss, policy loss, policy stats, value loss, entropy)`` over the valid steps."""
    _, new_logprob, entropy, new_value, _ = agent.act(obs, starts, initial_state, actions, masks)
    new_logprob, entropy, new_value = new_logprob[valid], entropy[valid], new_value[valid]
    advantages = advantages[valid]
    if cfg.norm_adv:
        advantages = normalize(advantages)
    pg_loss, pg_stats = ppo_clip(new_logprob, old_logprobs[valid], advantages, cfg=loss_cfg)
    v_loss = value_loss(new_value, old_values[valid], returns[valid], clip=cfg.clip_coef if cfg.clip_vloss else None)
    entropy_loss = entropy.mean()
    loss = pg_loss - cfg.ent_coef * entropy_loss + cfg.vf_coef * v_loss
    return loss, pg_loss, pg_stats, v_loss, entropy_loss


class RecurrentPolicy:
    """A checkpointed ``RecurrentActorCritic`` as ``obs batch (numpy) -> actions``, carrying its
    hidden state from call to call. ``reset(envs)`` (a bool per env, or None for all) marks the envs
    whose next observation begins an episode: their memory is zeroed before it is read."""

    def __init__(self, cfg: PPOLSTMConfig, components: dict, envs, greedy: bool = False):
        self.agent = RecurrentActorCritic(envs.single_observation_space, envs.single_action_space, tuple(cfg.hidden),
                                          cfg.lstm_size)
        self.agent.load_state_dict(components["model"])
        self.obs_rms = None
        if components["collector"].get("obs_rms"):  # the run's observation statistics, as training saw them
            self.obs_rms = RunningMeanStd(envs.single_observation_space.shape)
            self.obs_rms.load_state_dict(components["collector"]["obs_rms"])
        self.greedy, self.space, self.state, self.starts = greedy, envs.single_action_space, None, None

    def reset(self, envs=None) -> None:
        if envs is None or self.starts is None:
            self.state, self.starts = None, None
        else:
            self.starts = self.starts | np.asarray(envs, dtype=bool)

    @torch.inference_mode()
    def __call__(self, obs, mask=None):
        x = obs_tensor(self.obs_rms.normalize(obs) if self.obs_rms else obs, "cpu")[None]
        if self.state is None or self.state.shape[1] != x.shape[1]:
            self.state, self.starts = self.agent.initial_state(x.shape[1]), np.zeros(x.shape[1], dtype=bool)
        starts = torch.from_numpy(self.starts)[None]
        mask = None if mask is None else torch.as_tensor(mask)[None]
        if self.greedy:
            actions, self.state = self.agent.greedy(x, starts, self.state, mask)
        else:
            actions, *_, self.state = self.agent.act(x, starts, self.state, mask=mask)
        self.starts = np.zeros_like(self.starts)
        actions = actions[0].numpy()  # a Box's actions are clipped into it, as in training
        return np.clip(actions, self.space.low, self.space.high) if isinstance(self.space, gym.spaces.Box) else actions


def load_policy(cfg: PPOLSTMConfig, components: dict, envs, greedy: bool = False):
    """The trained policy as ``obs (numpy batch) -> actions (numpy)``, with memory: ``omnigym eval``
    calls its ``reset`` where an episode begins (evaluation/control.py)."""
    return RecurrentPolicy(cfg, components, envs, greedy)
