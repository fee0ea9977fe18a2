"""Continuous control from pixels (docs/pixels.md): random-shift augmentation, the pixel
wrappers, DrQ's encoder trained by the critic only, short DrQ and PPO runs (parameters change,
metrics move, same seed gives the same metrics, an interrupted run resumes to the same
metrics), and bad input in one line with nothing written. Frames are tiny (16 to 36 pixels)
to keep rendering cheap."""

import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

import test_bad_input
from omnigym.cli import main
from omnigym.envs.pixels import ActionRepeat, PixelOptions, default_action_repeat, make_pixel_env
from omnigym.rl.augment import random_shift, shift_images
from omnigym.track.checkpoint import load_checkpoint
from interrupts import interrupt_at_log
from omnigym.track.run import Run
from test_reproducibility import metrics

needs_dm_control = pytest.mark.skipif(importlib.util.find_spec("shimmy") is None or
                                      importlib.util.find_spec("dm_control") is None,
                                      reason="needs shimmy and dm_control: pip install 'omnigym[pixels]'")
needs_mujoco = pytest.mark.skipif(importlib.util.find_spec("mujoco") is None,
                                  reason="needs mujoco: pip install 'omnigym[mujoco]'")

DM_CARTPOLE = "dm_control/cartpole-swingup-v0"


# --- random shifts (rl/augment.py) -------------------------------------------------------------

def images(n=4, c=3, size=12):
    return torch.randint(0, 256, (n, c, size, size), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def test_zero_shift_is_the_identity():
    frames = images()
    shifted = shift_images(frames, torch.zeros(4, 2, dtype=torch.long), pad=4)
    assert shifted.shape == frames.shape and shifted.dtype == torch.float32
    torch.testing.assert_close(shifted, frames.float(), atol=1e-3, rtol=0)


@pytest.mark.parametrize("dx, dy", [(1, 0), (0, -2), (4, 4), (-4, 3)])
def test_a_shift_moves_the_image_by_whole_pixels_with_the_border_repeated(dx, dy):
    frames, pad = images(n=1), 4
    padded = torch.nn.functional.pad(frames.float(), (pad,) * 4, mode="replicate")
    expected = padded[:, :, pad + dy:pad + dy + 12, pad + dx:pad + dx + 12]
    torch.testing.assert_close(shift_images(frames, torch.tensor([[dx, dy]]), pad), expected, atol=1e-3, rtol=0)


def crops(frame, pad):
    """Every window of the padded frame that a shift of up to ``pad`` pixels can give."""
    padded = torch.nn.functional.pad(frame[None].float(), (pad,) * 4, mode="replicate")[0]
    size = frame.shape[-1]
    return {(dx, dy): padded[:, pad + dy:pad + dy + size, pad + dx:pad + dx + size]
            for dx in range(-pad, pad + 1) for dy in range(-pad, pad + 1)}


def shift_of(shifted, frame, pad):
    found = [s for s, crop in crops(frame, pad).items() if torch.allclose(shifted, crop, atol=1e-3)]
    assert found, "the output is no shift of at most pad pixels"
    return found[0]


def test_random_shifts_are_bounded_per_sample_and_seeded():
    frame = images(n=1, size=10)[0]
    batch = frame.expand(32, -1, -1, -1)  # the same image 32 times: each gets its own shift
    torch.manual_seed(3)
    shifted = random_shift(batch, pad=2)
    shifts = [shift_of(shifted[i], frame, 2) for i in range(32)]
    assert len(set(shifts)) > 5  # independent per sample, not one shift for the batch
    torch.manual_seed(3)
    torch.testing.assert_close(random_shift(batch, pad=2), shifted)  # same seed, same shifts
    assert not torch.equal(random_shift(batch, pad=2), shifted)  # the next draw differs


# --- the pixel env (envs/pixels.py) ------------------------------------------------------------

class CountingEnv(gym.Env):
    """Reward = the step's number; ends after ``length`` steps."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def __init__(self, length=5):
        self.length, self.t = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), self.t == self.length, False, {}


def test_action_repeat_sums_the_rewards_and_stops_at_the_episode_end():
    env = ActionRepeat(CountingEnv(length=5), 3)
    env.reset(seed=0)
    obs, reward, terminated, _, _ = env.step(np.zeros(1))
    assert reward == 1 + 2 + 3 and obs[0] == 3 and not terminated
    obs, reward, terminated, _, _ = env.step(np.zeros(1))
    assert reward == 4 + 5 and obs[0] == 5 and terminated  # 2 steps, not 3: the episode ended


@needs_mujoco
def test_env_kwargs_reach_the_rendered_env():
    """--env-kwargs with --pixels: before, make_vec dropped them and the default env was made."""
    from omnigym.envs.vector import make_vec

    envs = make_vec("InvertedPendulum-v5", 1, "sync", seed=0, pixels=PixelOptions(True, image_size=16, frame_stack=1,
                                                                                  action_repeat=1),
                    reset_noise_scale=0.3)
    try:
        assert envs.unwrapped.envs[0].unwrapped._reset_noise_scale == 0.3
    finally:
        envs.close()


@needs_dm_control
def test_pixel_observations_are_stacked_uint8_frames_newest_last():
    env = make_pixel_env(DM_CARTPOLE, PixelOptions(True, image_size=16, frame_stack=3, action_repeat=2))
    try:
        obs, _ = env.reset(seed=1)
        assert env.observation_space.shape == (9, 16, 16) and obs.shape == (9, 16, 16) and obs.dtype == np.uint8
        first = obs[:3].copy()
        assert (obs[3:6] == first).all() and (obs[6:] == first).all()  # the first frame repeated after a reset
        obs, *_ = env.step(np.ones(1, np.float32))
        obs2, *_ = env.step(np.ones(1, np.float32))
        newest = env.unwrapped.render().transpose(2, 0, 1)
        assert (obs2[6:] == newest).all() and (obs2[3:6] == obs[6:]).all() and (obs2[:3] == first).all()
        assert not (obs2[6:] == first).all()  # the cart moved
    finally:
        env.close()


def test_action_repeat_defaults_are_planets_per_domain_values():
    assert default_action_repeat(DM_CARTPOLE) == 8
    assert default_action_repeat("dm_control/reacher-easy-v0") == 4
    assert default_action_repeat("dm_control/walker-walk-v0") == 2
    assert default_action_repeat("dm_control/hopper-hop-v0") == 2  # DrQ-v2's, where PlaNet has none


# --- DrQ: the encoder is the critic's (algos/control/drq.py) -------------------------------------

def small_drq(**extra):
    from omnigym.algos.control.drq import DrQConfig

    values = dict(image_size=16, frame_stack=2, batch_size=16, hidden=(32, 32), features=8, buffer_size=2000,
                  learning_starts=100, log_every=100, checkpoint_every=200, progress=False, plot=False,
                  tensorboard=False, seed=3, action_repeat=2)
    return DrQConfig(**{**values, **extra})


def batch(n=16, shape=(6, 16, 16)):
    generator = torch.Generator().manual_seed(1)
    return {"obs": torch.randint(0, 256, (n, *shape), generator=generator, dtype=torch.uint8),
            "next_obs": torch.randint(0, 256, (n, *shape), generator=generator, dtype=torch.uint8),
            "actions": torch.rand(n, 1, generator=generator) * 2 - 1, "rewards": torch.rand(n, generator=generator),
            "terminated": torch.zeros(n)}


def snapshot_of(module):
    return [p.detach().clone() for p in module.parameters()]


def changed(before, module):
    return [not torch.equal(a, b) for a, b in zip(before, module.parameters())]


def test_the_actor_step_leaves_the_encoder_alone_and_the_critic_step_trains_it():
    from omnigym.algos.control.drq import Learner

    learner = Learner((6, 16, 16), gym.spaces.Box(-1, 1, (1,)), small_drq(), "cpu")
    encoder, actor, q = snapshot_of(learner.critic.encoder), snapshot_of(learner.actor), snapshot_of(learner.critic)
    maps, _ = learner.critic_step(batch())
    assert all(changed(encoder, learner.critic.encoder))  # the critic's loss trains the encoder
    encoder, q = snapshot_of(learner.critic.encoder), snapshot_of(learner.critic)
    learner.critic_optimizer.zero_grad()  # the critic step's gradients, gone: any now would be the actor's
    learner.actor_step(maps)
    assert not any(changed(encoder, learner.critic.encoder)) and not any(changed(q, learner.critic))
    assert all(p.grad is None for p in learner.critic.parameters())
    assert any(changed(actor, learner.actor))
    # the target critic (its encoder too) follows at rate tau
    target = snapshot_of(learner.critic_target)
    learner.update_target()
    assert all(changed(target, learner.critic_target))


def train_drq(run_dir, env_id=DM_CARTPOLE, **extra):
    from omnigym.algos.control import drq

    return drq.train(small_drq(env_id=env_id, run_dir=str(run_dir), **{"total_timesteps": 600, **extra}))


@needs_dm_control
def test_a_short_drq_run_changes_its_networks_and_moves_its_metrics(tmp_path, monkeypatch):
    saved, original_save = {}, Run.save

    def recording_save(self, components, **counters):
        saved[counters["global_step"]] = {name: {k: v.clone() for k, v in components[name].state_dict().items()}
                                          for name in ("critic", "actor")}
        original_save(self, components, **counters)

    monkeypatch.setattr(Run, "save", recording_save)
    train_drq(tmp_path / "run", total_timesteps=600, learning_starts=300)
    rows = metrics(tmp_path / "run")
    assert [r["global_step"] for r in rows] == list(range(100, 700, 100))  # frames: agent steps x action repeat 2
    learned = [r for r in rows if "losses/qf1_loss" in r]
    # cartpole-swingup pays 0 to 1 a frame: the critic's Q rises from about 0 as it learns the
    # reward to go (0.047, 0.115, 0.154 here), and the temperature falls from its 0.1 start toward
    # the target entropy (0.097, 0.095, 0.092)
    q_values, alphas = [r["losses/qf1_values"] for r in learned], [r["losses/alpha"] for r in learned]
    assert len(learned) == 3 and 0 < q_values[0] < q_values[1] < q_values[2], q_values
    assert 0.1 > alphas[0] > alphas[1] > alphas[2], alphas
    before, after = saved[200], saved[600]  # before learning starts (300 frames), and at the end
    for name in ("critic", "actor"):
        weights = [k for k in before[name] if k.endswith("weight") or k.startswith("qf.weights")]
        assert weights and all(not torch.equal(before[name][k], after[name][k]) for k in weights), name


@needs_dm_control
def test_same_seed_gives_identical_drq_metrics(tmp_path):
    # 300 frames: 100 of random actions, then 100 agent steps of updates, logged at 200 and 300
    # (each frame pair is one render, ~30 ms of CPU: the test's cost)
    train_drq(tmp_path / "a", total_timesteps=300)
    train_drq(tmp_path / "b", total_timesteps=300)
    a = metrics(tmp_path / "a")
    assert "losses/actor_loss" in a[-1] and a == metrics(tmp_path / "b")


@needs_mujoco
def test_an_interrupted_drq_run_resumes_to_the_same_metrics(tmp_path, monkeypatch):
    """gymnasium's MuJoCo envs come back mid-episode from a checkpoint (their physics state is
    saved); with --save-buffer the resumed run redoes the lost work to the same numbers."""
    env = "Reacher-v5"
    train_drq(tmp_path / "whole", env_id=env, save_buffer=True)
    # stopped after its 3rd metrics line, after the checkpoint at 200 frames
    interrupt_at_log(monkeypatch, lambda: train_drq(tmp_path / "cut", env_id=env, save_buffer=True), n=3)
    assert len(metrics(tmp_path / "cut")) == 3
    train_drq(tmp_path / "cut", env_id=env, save_buffer=True, resume=str(tmp_path / "cut"))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


@needs_dm_control
def test_omnigym_eval_replays_a_drq_run_on_pixels(tmp_path, capsys):
    from omnigym.runs import evaluate_run

    train_drq(tmp_path / "run", total_timesteps=200)
    returns = evaluate_run(str(tmp_path / "run"), episodes=1, greedy=True)
    assert len(returns) == 1 and 0 <= returns[0] <= 1000  # dm_control rewards are in [0, 1] per frame


@needs_dm_control
def test_ppo_trains_from_pixels_with_shifted_minibatches(tmp_path):
    def train_ppo(run_dir, steps):
        assert main(["train", "ppo", "--env-id", DM_CARTPOLE, "--pixels", "--image-size", "36", "--frame-stack", "2",
                     "--action-repeat", "8", "--image-pad", "2", "--num-envs", "2", "--num-steps", "32",
                     "--total-timesteps", str(steps), "--run-dir", str(run_dir), "--no-progress", "--no-plot",
                     "--no-tensorboard"]) == 0

    train_ppo(tmp_path / "first", 64)  # the same run stopped after its first update
    train_ppo(tmp_path / "ppo", 256)
    rows = metrics(tmp_path / "ppo")
    # by the fourth update the critic fits the returns better than at the first (11.2 -> 6.7
    # here; 39.9 and 25.0 between, as the returns it chases move)
    assert len(rows) == 4 and rows[-1]["losses/value_loss"] < rows[0]["losses/value_loss"]
    first, cnn = (load_checkpoint(tmp_path / name)["components"]["model"] for name in ("first", "ppo"))
    assert cnn["encoder.net.0.weight"].shape[1] == 6  # 2 stacked RGB frames
    weights = [k for k in cnn if k.endswith("weight")]
    assert "encoder.net.0.weight" in weights and all(not torch.equal(first[k], cnn[k]) for k in weights)


# --- bad input -----------------------------------------------------------------------------------

BAD = [
    (["train", "drq", "--env-id", "CartPole-v1"], "--pixels renders MuJoCo tasks (dm_control/... ids, gymnasium's "
                                                  "MuJoCo ids such as InvertedPendulum-v5); CartPole-v1 is neither"),
    (["train", "ppo", "--env-id", "CartPole-v1", "--pixels"], "--pixels renders MuJoCo tasks"),
    (["train", "drq", "--image-size", "8"], "--image-size must be between 16 and 512 pixels, got 8"),
    (["train", "drq", "--action-repeat", "0"], "--action-repeat must be positive, got 0"),
    (["train", "ppo", "--action-repeat", "4"], "--action-repeat is read with --pixels only"),
    (["train", "sac", "--env-id", DM_CARTPOLE, "--pixels"], "sac learns from state vectors; for continuous control "
                                                            "from pixels run omnigym train drq"),
    (["train", "drq", "--no-pixels"], "drq learns from pixels; give --pixels"),
    # it came from the network, and advised resizing what --image-size sets
    (["train", "ppo", "--env-id", DM_CARTPOLE, "--pixels", "--image-size", "20"],
     "--image-size 20: ppo's Nature CNN reads squares of 36 pixels or more; give --image-size 36 or more"),
    (["train", "drq", "--image-pad", "-1"], "--image-pad must be 0 or more, got -1"),
    (["train", "ppo", "--env-id", "InvertedPendulum-v5", "--pixels", "--normalize-obs"],
     "--normalize-obs normalizes state vectors"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message)


@needs_mujoco
def test_pixels_without_a_renderer_is_one_line_before_anything_is_made(tmp_path, monkeypatch, capsys):
    """A machine where MuJoCo cannot render offscreen (no EGL, no OSMesa): simulated by a
    renderer that fails as mujoco's does there."""
    import mujoco

    def no_context(*args, **kwargs):
        raise RuntimeError("Failed to initialize OpenGL (no EGL device)")

    monkeypatch.setattr(mujoco, "Renderer", no_context)
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(
        tmp_path, monkeypatch, capsys, ["train", "drq", "--env-id", "InvertedPendulum-v5"],
        "--pixels needs MuJoCo to render offscreen and MUJOCO_GL=")


def test_the_default_pixel_replay_fits_a_16_gb_machine_and_is_refused_clearly_on_a_small_one():
    """DrQ's 100k transitions of 3 stacked 84 x 84 RGB frames, each frame stored once: about
    2.7 GB; a 1 GB machine is told which flag to lower before anything is made."""
    from omnigym import resources
    from omnigym.algos.control.drq import DrQConfig
    from omnigym.errors import OmnigymError

    cfg = DrQConfig()
    frames, actions = gym.spaces.Box(0, 255, (9, 84, 84), np.uint8), gym.spaces.Box(-1, 1, (1,), np.float32)
    needs = resources.buffer_needs(cfg, None, frames, actions)
    assert 2 * 1024**3 < needs["replay memory"][1] < 3 * 1024**3  # once per frame, not 3 x 2 times
    resources.check_buffers(cfg, None, frames, actions, available=16 * 1024**3)
    with pytest.raises(OmnigymError, match="--buffer-size 100000 needs about .* give a smaller --buffer-size"):
        resources.check_buffers(cfg, None, frames, actions, available=1024**3)
