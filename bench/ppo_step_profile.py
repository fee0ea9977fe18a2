"""Where PPO's time goes at one env: HalfCheetah-v5 at CleanRL's settings (the mujoco preset:
1 env x 2048 steps per rollout, 10 epochs x 32 minibatches of 64, normalized observations,
scaled rewards, 64x64 tanh networks), one torch thread as omnigym runs by default.

Everything is built as ``ppo.train`` builds it (``make_run_envs``, ``ActorCritic``, omnigym's
``Adam``, ``RolloutCollector``); the rollout is the collector's own ``collect``, timed from
outside by wrapping the objects it calls (the vector env's ``step``, the numpy actor and
the critic's batched values, the observation normalizer, the reward scaler, the episode statistics), and the update is a copy
of ``ppo.train``'s loop with ``time.perf_counter`` around each part. Nothing in src/ is
changed. Logging and checkpoints (``run.log``, ``run.save``) are left out.

    OMP_NUM_THREADS=1 python bench/ppo_step_profile.py [--rollouts 6] [--warmup 1]

The table gives each part per 2048-step rollout (mean over the measured rollouts) and per
env step, and its share of the whole.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import time
from collections import defaultdict

import torch

from omnigym.algos.control.ppo import PPOConfig
from omnigym.envs.vector import make_run_envs
from omnigym.models.control import ActorCritic
from omnigym.optim import Adam, clip_grad_norm
from omnigym.rl.advantages import AdvantageConfig, EpisodeEnds, gae, normalize
from omnigym.rl.losses import PolicyLossConfig, check_finite, ppo_clip, value_loss
import omnigym.rl.rollout as rollout_module
from omnigym.rl.rollout import RolloutCollector
from omnigym.rl.running_stats import RewardScaler
from omnigym.track.episodes import EpisodeStats

clock = time.perf_counter
spent: dict[str, float] = defaultdict(float)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += clock() - start

    return wrapper


def time_policy() -> None:
    """Time the policy as the collector calls it: the numpy actor each step, the critic's
    batched values after the last one (``models/numpy_actor.py``)."""
    rollout_module.NumpyActor.act = timed("policy forward", rollout_module.NumpyActor.act)
    rollout_module.values_of = timed("policy forward", rollout_module.values_of)


def build(seed: int, env_id: str):
    cfg = PPOConfig(env_id=env_id, seed=seed, progress=False)
    with contextlib.redirect_stdout(io.StringIO()):
        cfg = cfg.with_preset({"env_id", "seed", "progress"})
    cfg.check()
    envs, signal = make_run_envs(cfg, "ppo")
    agent = ActorCritic(envs.single_observation_space, envs.single_action_space, cfg.hidden).to(cfg.device)
    optimizer = Adam(agent.parameters(), lr=cfg.learning_rate, eps=1e-5)
    scaler = RewardScaler(cfg.num_envs, cfg.gamma) if cfg.normalize_reward else None
    collector = RolloutCollector(envs, cfg.num_steps, EpisodeStats(False), cfg.device, cfg.seed, cfg.normalize_obs,
                                 scaler, signal)
    return cfg, agent, optimizer, collector


def instrument(collector: RolloutCollector) -> None:
    """Wrap what ``collect`` calls, on the instances only."""
    cursor, envs = collector.cursor, collector.cursor.envs
    inner = envs.env  # RecordEpisodeStatistics -> gymnasium's SyncVectorEnv
    for env in getattr(inner, "envs", []):
        sim = env.unwrapped
        if hasattr(sim, "do_simulation"):
            sim.do_simulation = timed("  of which MuJoCo physics (do_simulation)", sim.do_simulation)
    inner.step = timed("env step (SyncVectorEnv.step: wrappers + MuJoCo)", inner.step)
    envs.step = timed("_vector env with episode statistics", envs.step)
    cursor.prepare = timed("observation normalization (RunningMeanStd)", cursor.prepare)
    cursor.step = timed("_cursor.step", cursor.step)
    if collector.reward_scaler is not None:
        collector.reward_scaler = timed("reward scaling (RewardScaler)", collector.reward_scaler)
    collector.stats.add = timed("episode statistics (EpisodeStats.add)", collector.stats.add)
    collector.collect = timed("_collect", collector.collect)


def update(cfg: PPOConfig, agent, optimizer, rollout, loss_cfg: PolicyLossConfig, advantage_cfg: AdvantageConfig):
    """``ppo.train``'s steps 2 and 3, with each part timed."""
    start = clock()
    ends = EpisodeEnds(rollout.terminated.T, rollout.truncated.T, rollout.bootstrap_values.T)
    advantages, returns = gae(rollout.rewards.T, rollout.valid.T, values=rollout.values.T, cfg=advantage_cfg, ends=ends)
    advantages, returns = advantages.T, returns.T
    b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns, b_masks = rollout.flat(
        rollout.obs, rollout.actions, rollout.logprobs, rollout.values, advantages, returns, rollout.masks)
    spent["GAE and flattening"] += clock() - start
    n = len(b_obs)
    minibatch = max(n // cfg.num_minibatches, 1)
    for _ in range(cfg.update_epochs):
        t0 = clock()
        order = torch.randperm(n)
        shuffled = [x[order] for x in (b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns)]
        spent["update: indexing, advantage normalization, loop"] += clock() - t0
        for begin in range(0, n, minibatch):
            t0 = clock()
            obs, actions, old_logprobs, old_values, adv, mb_returns = (x[begin:begin + minibatch] for x in shuffled)
            adv = normalize(adv) if cfg.norm_adv and len(adv) > 1 else adv
            t1 = clock()
            _, new_logprob, entropy, new_value = agent.act(obs, actions, None)
            pg_loss, _ = ppo_clip(new_logprob, old_logprobs, adv, cfg=loss_cfg)
            v_loss = value_loss(new_value, old_values, mb_returns, clip=cfg.clip_coef if cfg.clip_vloss else None)
            loss = pg_loss - cfg.ent_coef * entropy.mean() + cfg.vf_coef * v_loss
            check_finite(loss, 0)
            t2 = clock()
            optimizer.zero_grad()
            loss.backward()
            t3 = clock()
            clip_grad_norm(agent.parameters(), cfg.max_grad_norm)
            t4 = clock()
            optimizer.step()
            t5 = clock()
            spent["update: indexing, advantage normalization, loop"] += t1 - t0
            spent["update: forward + losses"] += t2 - t1
            spent["update: zero_grad + backward"] += t3 - t2
            spent["update: clip_grad_norm_"] += t4 - t3
            spent["update: Adam step"] += t5 - t4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=6, help="rollouts (and updates) measured")
    parser.add_argument("--warmup", type=int, default=1, help="rollouts run first and not counted")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--env-id", default="HalfCheetah-v5")
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)

    cfg, agent, optimizer, collector = build(args.seed, args.env_id)
    instrument(collector)
    time_policy()
    advantage_cfg, loss_cfg = AdvantageConfig(cfg.gamma, cfg.gae_lambda), PolicyLossConfig(clip_low=cfg.clip_coef)
    num_updates = args.warmup + args.rollouts
    global_step = 0
    for i in range(num_updates):
        if i == args.warmup:
            spent.clear()
            wall = clock()
        optimizer.param_groups[0]["lr"] = cfg.learning_rate * (1.0 - i / max(cfg.total_timesteps // cfg.num_steps, 1))
        rollout, global_step = collector.collect(agent, global_step)
        update(cfg, agent, optimizer, rollout, loss_cfg, advantage_cfg)
    wall = clock() - wall
    collector.envs.close()

    steps = args.rollouts * cfg.num_steps * cfg.num_envs
    s = dict(spent)
    env = s["env step (SyncVectorEnv.step: wrappers + MuJoCo)"]
    parts = {
        "env step (SyncVectorEnv.step: wrappers + MuJoCo)": env,
        "  of which MuJoCo physics (do_simulation)": s.get("  of which MuJoCo physics (do_simulation)", 0.0),
        "policy forward": s["policy forward"],
        "observation normalization (RunningMeanStd)": s.get("observation normalization (RunningMeanStd)", 0.0),
        "reward scaling (RewardScaler)": s.get("reward scaling (RewardScaler)", 0.0),
        "episode statistics (EpisodeStats.add)": s["episode statistics (EpisodeStats.add)"],
        "RecordEpisodeStatistics wrapper": s["_vector env with episode statistics"] - env,
    }
    cursor_rest = s["_cursor.step"] - s["_vector env with episode statistics"] - parts[
        "observation normalization (RunningMeanStd)"]
    parts["EnvCursor.step's own Python (checks, autoreset)"] = cursor_rest
    accounted = s["_cursor.step"] + s["policy forward"] + parts["reward scaling (RewardScaler)"] + parts[
        "episode statistics (EpisodeStats.add)"]
    parts["collector's own Python (buffers, tensors, clipping)"] = s["_collect"] - accounted
    for key in ("GAE and flattening", "update: forward + losses", "update: zero_grad + backward",
                "update: clip_grad_norm_", "update: Adam step", "update: indexing, advantage normalization, loop"):
        parts[key] = s[key]
    total = sum(v for k, v in parts.items() if not k.startswith("  "))

    print(f"PPO on {cfg.env_id}: {cfg.num_envs} env x {cfg.num_steps} steps, {cfg.update_epochs} epochs x "
          f"{cfg.num_minibatches} minibatches, {args.torch_threads} torch thread(s); {args.rollouts} rollouts measured "
          f"after {args.warmup} warm-up")
    print(f"{'part':52s} {'ms/rollout':>11s} {'us/env step':>12s} {'share':>7s}")
    sections = [("rollout (RolloutCollector.collect)", list(parts)[:9]), ("update", list(parts)[9:])]
    for title, keys in sections:
        sub = sum(parts[k] for k in keys if not k.startswith("  "))
        print(f"{title:52s} {sub * 1e3 / args.rollouts:11.1f} {sub * 1e6 / steps:12.1f} {sub / total:7.1%}")
        for k in keys:
            v = parts[k]
            print(f"  {k:50s} {v * 1e3 / args.rollouts:11.1f} {v * 1e6 / steps:12.1f} {v / total:7.1%}")
    print(f"{'total (sum of parts)':52s} {total * 1e3 / args.rollouts:11.1f} {total * 1e6 / steps:12.1f} {1:7.1%}")
    print(f"{'wall clock of the measured rollouts and updates':52s} {wall * 1e3 / args.rollouts:11.1f} "
          f"{wall * 1e6 / steps:12.1f}   ({steps / wall:.0f} env steps/s)")


if __name__ == "__main__":
    main()
