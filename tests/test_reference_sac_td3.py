"""SAC's and TD3's update against Stable-Baselines3's ``SAC.train()`` and ``TD3.train()``: the
same networks (omnigym's initial weights copied into SB3's), the same batch of 32 transitions,
the same hyperparameters, one gradient step each; the losses and every updated parameter
(actor, twin critics, their targets, the temperature) compared. omnigym's side is its own
``train()`` run for one env step, its buffer handing out the fixed batch.

Differences, each asserted below:

- SB3 halves its critic loss (``0.5 * (mse_1 + mse_2)``); CleanRL and omnigym do not. Adam's
  step does not see the factor (up to its eps), so the parameters still agree.
- SAC's log-std: SB3 clamps the layer's output to [-20, 2]; CleanRL and omnigym squash it with
  tanh into [-5, 2]. A network-shape choice, not the update's: the test puts the tanh squash on
  SB3's log-std layer so both sides sample from the same policy.
- SAC's temperature: SB3 steps it first, on the actor's log-probs before the actor's step, with
  ``-log_alpha * (log_pi + target)``; CleanRL and omnigym step it last, on a fresh sample from the
  updated actor, with ``-alpha * (...)``. At the start (alpha = 1) both gradients are
  ``-mean(log_pi + target)``, so one Adam step moves log-alpha by the same ``lr`` in the same
  direction; the loss values differ (SB3's is 0 there).
- Noise: both draw from torch's global generator, in a different order (SB3 samples the batch's
  actions before the next actions); the SAC test gives both the same fixed noise, the TD3 test
  reseeds the generator right after the batch is drawn (TD3 draws its smoothing noise first).

Skips when Stable-Baselines3 is not installed (``[bench]``, in ``[dev]``).
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is not installed (pip install 'omnigym[bench]')")

from omnigym.algos.control import sac, td3  # noqa: E402
from omnigym.track.checkpoint import load_checkpoint  # noqa: E402

BATCH, OBS, ACT, HIDDEN = 32, 3, 2, (16, 16)
LR, GAMMA, TAU = 1e-3, 0.9, 0.05
TOLERANCE = 1e-5
NOISE_SEED = 11


class PlaneEnv(gym.Env):
    """Only its spaces matter: vector observations and a 2-D action in [-1, 1] (SB3's own scale)."""

    observation_space = gym.spaces.Box(-5.0, 5.0, (OBS,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (ACT,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(OBS, np.float32), {}

    def step(self, action):
        return np.zeros(OBS, np.float32), 0.0, False, False, {}


def fixed_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"obs": torch.randn(BATCH, OBS, generator=g), "next_obs": torch.randn(BATCH, OBS, generator=g),
            "actions": torch.rand(BATCH, ACT, generator=g) * 2 - 1, "rewards": torch.randn(BATCH, generator=g),
            "terminated": (torch.rand(BATCH, generator=g) < 0.25).float()}


def serve_fixed_batch(monkeypatch, module, reseed: bool):
    """omnigym's replay buffer hands out the fixed batch (and with ``reseed``, reseeds torch)."""
    original = module.replay_buffer

    def replay_buffer(*args, **kwargs):
        buffer = original(*args, **kwargs)

        def sample(batch_size, rng, with_index=False):
            assert batch_size == BATCH
            if reseed:
                torch.manual_seed(NOISE_SEED)
            return fixed_batch()

        buffer.sample = sample
        return buffer

    monkeypatch.setattr(module, "replay_buffer", replay_buffer)


def start_from(monkeypatch, module, name: str, state: dict):
    """``module.<name>`` built with ``state``'s weights (the run's seed would pick its own)."""
    cls = getattr(module, name)

    class Fixed(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.load_state_dict(state)

    monkeypatch.setattr(module, name, Fixed)


def run_omnigym(module, config, tmp_path, **flags) -> tuple[dict, dict]:
    """One env step and one update; the checkpoint's components and the logged losses."""
    run_dir = tmp_path / module.__name__.rsplit(".", 1)[-1]
    module.train(config(env_id=f"{__name__}:PlaneEnv", total_timesteps=1, learning_starts=0, batch_size=BATCH,
                        buffer_size=100, gamma=GAMMA, tau=TAU, hidden=HIDDEN, policy_frequency=1, seed=0,
                        run_dir=str(run_dir), progress=False, plot=False, tensorboard=False, log_every=1, **flags))
    row = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][-1]
    return load_checkpoint(run_dir)["components"], row


# --- weights between the two layouts: omnigym's batched twin Q [n, in, out] and SB3's Linears ----------


def q_into_sb3(q_state: dict, critic) -> None:
    layers = sorted(k for k in q_state if k.startswith("weights."))
    with torch.no_grad():
        for i, net in enumerate(critic.q_networks):
            linears = [m for m in net if isinstance(m, torch.nn.Linear)]
            for j, linear in enumerate(linears):
                assert len(linears) == len(layers)
                linear.weight.copy_(q_state[f"weights.{j}"][i].T)
                linear.bias.copy_(q_state[f"biases.{j}"][i, 0])


def q_from_sb3(critic) -> dict:
    linears = [[m for m in net if isinstance(m, torch.nn.Linear)] for net in critic.q_networks]
    state = {}
    for j in range(len(linears[0])):
        state[f"weights.{j}"] = torch.stack([net[j].weight.T for net in linears])
        state[f"biases.{j}"] = torch.stack([net[j].bias[None] for net in linears])
    return state


def torso_into(linears: list, state: dict) -> None:
    with torch.no_grad():
        for linear, j in zip(linears, (0, 2)):
            linear.weight.copy_(state[f"torso.{j}.weight"])
            linear.bias.copy_(state[f"torso.{j}.bias"])


def largest_difference(ours: dict, theirs: dict) -> float:
    assert ours.keys() == theirs.keys()
    return max((ours[k] - theirs[k]).abs().max().item() for k in ours)


@pytest.fixture(autouse=True)
def sb3_logs_in_the_tests_folder(tmp_path, monkeypatch):
    """SB3's logger makes a folder even when it writes nothing: in the test's own, not /tmp/SB3-<time>."""
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path / "sb3"))


def sb3_logger():
    from stable_baselines3.common.logger import configure

    return configure(None, [])


def sb3_serves(model, batch: dict, reseed: bool) -> None:
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    def sample(batch_size, env=None):
        assert batch_size == BATCH
        if reseed:
            torch.manual_seed(NOISE_SEED)
        return ReplayBufferSamples(batch["obs"], batch["actions"], batch["next_obs"], batch["terminated"][:, None],
                                   batch["rewards"][:, None])

    model.replay_buffer.sample = sample


# --- SAC ----------------------------------------------------------------------------------------------


def fixed_noise(monkeypatch):
    """Every standard-normal draw of a given shape is the same fixed tensor, on both sides."""
    import torch.distributions.normal as normal

    draws: dict[tuple, torch.Tensor] = {}

    def draw(shape, dtype=torch.float32, device=None):
        shape = tuple(shape)
        if shape not in draws:
            draws[shape] = torch.randn(shape, generator=torch.Generator().manual_seed(NOISE_SEED + len(shape)))
        return draws[shape].clone()

    monkeypatch.setattr(torch, "randn_like", lambda t: draw(t.shape))  # omnigym's actor
    monkeypatch.setattr(normal, "_standard_normal", draw)  # SB3's, through torch.distributions.Normal


class TanhLogStd(torch.nn.Module):
    """CleanRL's log-std squash, ``-5 + 3.5 * (tanh(x) + 1)``, put after SB3's log-std layer."""

    def forward(self, x):
        from omnigym.models.continuous import LOG_STD_MAX, LOG_STD_MIN

        return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(x) + 1)


def sb3_sac(actor_state: dict, q_state: dict):
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", PlaneEnv(), learning_rate=LR, buffer_size=100, learning_starts=0, batch_size=BATCH,
                tau=TAU, gamma=GAMMA, ent_coef="auto", target_update_interval=1, policy_kwargs={"net_arch": list(HIDDEN)},
                device="cpu", seed=0)
    model.set_logger(sb3_logger())
    actor = model.actor
    torso_into([m for m in actor.latent_pi if isinstance(m, torch.nn.Linear)], actor_state)
    head_w, head_b = actor_state["head.weight"], actor_state["head.bias"]
    with torch.no_grad():
        actor.mu.weight.copy_(head_w[:ACT]), actor.mu.bias.copy_(head_b[:ACT])
        actor.log_std.weight.copy_(head_w[ACT:]), actor.log_std.bias.copy_(head_b[ACT:])
    actor.log_std = torch.nn.Sequential(actor.log_std, TanhLogStd())  # the same Linear: its optimizer still holds it
    q_into_sb3(q_state, model.critic)
    q_into_sb3(q_state, model.critic_target)
    return model


def sac_actor_from_sb3(actor) -> dict:
    linears = [m for m in actor.latent_pi if isinstance(m, torch.nn.Linear)]
    log_std = actor.log_std[0]
    return {"torso.0.weight": linears[0].weight, "torso.0.bias": linears[0].bias,
            "torso.2.weight": linears[1].weight, "torso.2.bias": linears[1].bias,
            "head.weight": torch.cat([actor.mu.weight, log_std.weight]),
            "head.bias": torch.cat([actor.mu.bias, log_std.bias])}


def initial_weights(module, actor_cls: str):
    torch.manual_seed(5)
    space = PlaneEnv.action_space
    actor = getattr(module, actor_cls)(OBS, space, HIDDEN)
    return actor.state_dict(), module.QNetwork(OBS, ACT, HIDDEN, n=2).state_dict()


def test_sac_update_matches_sb3(tmp_path, monkeypatch):
    actor0, q0 = initial_weights(sac, "SquashedGaussianActor")
    fixed_noise(monkeypatch)
    start_from(monkeypatch, sac, "SquashedGaussianActor", actor0)
    start_from(monkeypatch, sac, "QNetwork", q0)
    serve_fixed_batch(monkeypatch, sac, reseed=False)
    ours, row = run_omnigym(sac, sac.SACConfig, tmp_path, policy_lr=LR, q_lr=LR, autotune=True,
                            target_network_frequency=1)

    model = sb3_sac(actor0, q0)
    sb3_serves(model, fixed_batch(), reseed=False)
    model.train(gradient_steps=1, batch_size=BATCH)
    logged = model.logger.name_to_value

    assert row["losses/qf1_loss"] + row["losses/qf2_loss"] == pytest.approx(2 * logged["train/critic_loss"],
                                                                            abs=TOLERANCE)
    assert row["losses/actor_loss"] == pytest.approx(logged["train/actor_loss"], abs=TOLERANCE)
    their_actor = {k: v.detach() for k, v in sac_actor_from_sb3(model.actor).items()}
    assert largest_difference(ours["actor"], {**their_actor, **{k: ours["actor"][k] for k in ours["actor"]
                                                                if k.startswith("action_")}}) < TOLERANCE
    assert largest_difference(ours["qf"], q_from_sb3(model.critic)) < TOLERANCE
    assert largest_difference(ours["qf_target"], q_from_sb3(model.critic_target)) < TOLERANCE
    assert largest_difference(ours["actor"], actor0) > 100 * TOLERANCE  # the step moved them
    assert largest_difference(ours["qf"], q0) > 100 * TOLERANCE
    # the temperature: one Adam step of lr from log-alpha 0 on both sides, in the same direction
    their_log_alpha = model.log_ent_coef.detach()
    assert ours["temperature"]["log_alpha"].item() == pytest.approx(their_log_alpha.item(), abs=TOLERANCE)
    assert abs(their_log_alpha.item()) == pytest.approx(LR, rel=1e-3)
    assert row["losses/alpha"] == pytest.approx(np.exp(their_log_alpha.item()), abs=TOLERANCE)
    assert logged["train/ent_coef_loss"] == 0.0  # SB3's -log_alpha * (...) at log_alpha 0
    assert row["losses/alpha_loss"] != 0.0  # CleanRL's -alpha * (...) at alpha 1


def test_sb3s_log_std_clamp_is_not_cleanrls_tanh_squash():
    """Why the SAC test puts a tanh squash on SB3's log-std layer: given the same weights, the
    two actors have the same mean and different standard deviations without it."""
    actor0, q0 = initial_weights(sac, "SquashedGaussianActor")
    ours = sac.SquashedGaussianActor(OBS, PlaneEnv.action_space, HIDDEN)
    ours.load_state_dict(actor0)
    theirs = sb3_sac(actor0, q0).actor
    theirs.log_std = theirs.log_std[0]  # SB3's own: the Linear, then its clamp to [-20, 2]
    obs = fixed_batch()["obs"]
    with torch.no_grad():
        our_mean, our_log_std = ours._mean_log_std(obs)
        their_mean, their_log_std, _ = theirs.get_action_dist_params(obs)
    assert (our_mean - their_mean).abs().max() < 1e-6
    assert (our_log_std - their_log_std).abs().min() > 0.1


# --- TD3 ----------------------------------------------------------------------------------------------


def sb3_td3(actor_state: dict, q_state: dict, policy_noise: float, noise_clip: float):
    from stable_baselines3 import TD3

    model = TD3("MlpPolicy", PlaneEnv(), learning_rate=LR, buffer_size=100, learning_starts=0, batch_size=BATCH,
                tau=TAU, gamma=GAMMA, policy_delay=1, target_policy_noise=policy_noise, target_noise_clip=noise_clip,
                policy_kwargs={"net_arch": list(HIDDEN)}, device="cpu", seed=0)
    model.set_logger(sb3_logger())
    for actor in (model.actor, model.actor_target):
        linears = [m for m in actor.mu if isinstance(m, torch.nn.Linear)]
        torso_into(linears[:2], actor_state)
        with torch.no_grad():
            linears[2].weight.copy_(actor_state["head.weight"]), linears[2].bias.copy_(actor_state["head.bias"])
    q_into_sb3(q_state, model.critic)
    q_into_sb3(q_state, model.critic_target)
    return model


def td3_actor_from_sb3(actor, like: dict) -> dict:
    linears = [m for m in actor.mu if isinstance(m, torch.nn.Linear)]
    state = {"torso.0.weight": linears[0].weight, "torso.0.bias": linears[0].bias, "torso.2.weight": linears[1].weight,
             "torso.2.bias": linears[1].bias, "head.weight": linears[2].weight, "head.bias": linears[2].bias}
    return {**{k: v.detach() for k, v in state.items()}, **{k: like[k] for k in like if k.startswith("action_")}}


@pytest.mark.parametrize("policy_noise", [0.0, 0.2])
def test_td3_update_matches_sb3(policy_noise, tmp_path, monkeypatch):
    actor0, q0 = initial_weights(td3, "DeterministicActor")
    start_from(monkeypatch, td3, "DeterministicActor", actor0)
    start_from(monkeypatch, td3, "QNetwork", q0)
    serve_fixed_batch(monkeypatch, td3, reseed=True)
    ours, row = run_omnigym(td3, td3.TD3Config, tmp_path, learning_rate=LR, policy_noise=policy_noise,
                            noise_clip=0.3, exploration_noise=0.1)

    model = sb3_td3(actor0, q0, policy_noise, noise_clip=0.3)
    sb3_serves(model, fixed_batch(), reseed=True)
    model.train(gradient_steps=1, batch_size=BATCH)
    logged = model.logger.name_to_value

    assert row["losses/qf1_loss"] + row["losses/qf2_loss"] == pytest.approx(logged["train/critic_loss"], abs=TOLERANCE)
    assert row["losses/actor_loss"] == pytest.approx(logged["train/actor_loss"], abs=TOLERANCE)
    assert largest_difference(ours["actor"], td3_actor_from_sb3(model.actor, ours["actor"])) < TOLERANCE
    assert largest_difference(ours["actor_target"], td3_actor_from_sb3(model.actor_target, ours["actor"])) < TOLERANCE
    assert largest_difference(ours["qf"], q_from_sb3(model.critic)) < TOLERANCE
    assert largest_difference(ours["qf_target"], q_from_sb3(model.critic_target)) < TOLERANCE
    assert largest_difference(ours["actor"], actor0) > 100 * TOLERANCE  # the step moved them
    assert largest_difference(ours["qf"], q0) > 100 * TOLERANCE
