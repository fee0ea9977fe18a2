"""omnigym's components against the implementations users trust, on the same inputs.

TRL (DPO, IPO, SimPO, reward-model losses, SFT masking), gymnasium's Atari wrappers, CleanRL's
GAE loop and Stable-Baselines3's reward normalization. Each test calls the reference's own
code and skips when it is not installed (all are in the ``[dev]`` extra). Where omnigym
differs on purpose, the test asserts the difference exactly and says where it is documented.
The measured differences are in the closing note of issue 24.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omnigym.models.tokens import batch_logprobs, make_trained_batch
from omnigym.rl.advantages import AdvantageConfig, EpisodeEnds, gae
from omnigym.rl.losses import bradley_terry, nll_loss, preference_loss
from omnigym.rl.running_stats import RewardScaler, RunningMeanStd
from omnigym.tasks.preference_data import pair_sequences, tokenize_pairs
from omnigym.tasks.sft_data import tokenize_rows

LOSS_TOLERANCE = 1e-5
FLOAT32_ROUNDING = 1e-6  # relative: IPO's loss is near (1 / (2 beta))^2 = 25, where 1e-5 is 4e-7 of it

# --- TRL: preference losses and SFT masking, on the tiny Llama of models/lm.py -------------

TEXT_PAIRS = [{"prompt": "2+2=", "chosen": "4", "rejected": "five"},
              {"prompt": "Say hi: ", "chosen": "hi there", "rejected": "no"},
              {"prompt": "Name a colour. ", "chosen": "red", "rejected": "a big blue sky"}]
CHAT_PAIRS = [{"prompt": [{"role": "user", "content": row["prompt"]}],
               "chosen": [{"role": "assistant", "content": row["chosen"]}],
               "rejected": [{"role": "assistant", "content": row["rejected"]}]} for row in TEXT_PAIRS]
PAIRS = {"text": TEXT_PAIRS, "chat": CHAT_PAIRS}


def trl_installed():
    return pytest.importorskip("trl", reason="TRL is not installed (pip install 'omnigym[dev]')")


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """Two tiny models of the same shape: the policy (seed 0) and a reference that is not
    the policy (seed 1), so that the log-ratios DPO reads are not all 0."""
    from omnigym.models.lm import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_model(root / "policy", seed=0), build_tiny_model(root / "reference", seed=1)


def load(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def trainer_args(tmp_path, **kwargs):
    return dict(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, max_length=None,
                dataset_num_proc=None, **kwargs)


def trl_dpo_batch(tmp_path, folders, rows, loss_type):
    """TRL's DPOTrainer on ``rows``: the trainer and its collated batch of every row."""
    trl_installed()
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    (policy, tokenizer), (reference, _) = load(folders[0]), load(folders[1])
    trainer = DPOTrainer(model=policy, ref_model=reference, processing_class=tokenizer,
                         args=DPOConfig(beta=0.1, loss_type=[loss_type], **trainer_args(tmp_path)),
                         train_dataset=Dataset.from_list(rows))
    examples = [trainer.train_dataset[i] for i in range(len(rows))]
    return trainer, examples, trainer.data_collator(examples)


def omnigym_sequence_logps(folder, pairs, averaged: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) log-probabilities as omnigym's DPO computes them (algos/lm/dpo.py)."""
    model, tokenizer = load(folder)
    batch = make_trained_batch(pair_sequences(pairs), tokenizer.pad_token_id)
    with torch.no_grad():
        logps = (batch_logprobs(model, batch) * batch.loss_mask).sum(1)
    if averaged:
        logps = logps / batch.loss_mask.sum(1)
    return logps[:len(pairs)], logps[len(pairs):]


def omnigym_pairs(rows, folder):
    _, tokenizer = load(folder)
    return tokenize_pairs([(f"row {i}", row) for i, row in enumerate(rows)], tokenizer, max_length=256).pairs


def dpo_losses(tmp_path, folders, kind, loss_type) -> tuple[float, float]:
    """(omnigym's loss, TRL's) on the same rows, model and reference."""
    rows = PAIRS[kind]
    trainer, examples, batch = trl_dpo_batch(tmp_path, folders, rows, loss_type)
    pairs = omnigym_pairs(rows, folders[0])
    # the same tokens on both sides: what follows compares log-probabilities and losses only
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == \
        [(e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]) for e in examples]
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, batch).item()
    averaged = loss_type == "ipo"  # omnigym gives IPO length-averaged log-probs; TRL divides the ratios
    chosen, rejected = omnigym_sequence_logps(folders[0], pairs, averaged)
    ref_chosen, ref_rejected = omnigym_sequence_logps(folders[1], pairs, averaged)
    ours, _ = preference_loss(chosen, rejected, ref_chosen, ref_rejected, loss_type, beta=0.1)
    return ours.item(), theirs


@pytest.mark.parametrize("kind", ["text", "chat"])
@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_and_ipo_losses_match_trls_dpo_trainer(tmp_path, tiny_folders, kind, loss_type):
    ours, theirs = dpo_losses(tmp_path, tiny_folders, kind, loss_type)
    assert ours == pytest.approx(theirs, abs=LOSS_TOLERANCE, rel=FLOAT32_ROUNDING)
    assert abs(theirs - np.log(2)) > 100 * LOSS_TOLERANCE  # policy and reference differ: not the trivial log 2


def simpo_losses(tmp_path, folders, kind, gamma=0.5, beta=2.0) -> tuple[float, float]:
    """SimPO through TRL's CPO trainer (trl.experimental.cpo, TRL's only SimPO): its
    length-averaged log-probs (``get_batch_logps``) and its loss (``cpo_loss``, called with a
    stand-in for the trainer holding the attributes it reads)."""
    trl_installed()
    cpo = pytest.importorskip("trl.experimental.cpo", reason="this TRL has no CPO trainer (SimPO)")
    _, _, batch = trl_dpo_batch(tmp_path, folders, PAIRS[kind], "sigmoid")
    model, _ = load(folders[0])
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = cpo.CPOTrainer.get_batch_logps(logits, labels, average_log_prob=True)
    stand_in = SimpleNamespace(alpha=0.0, loss_type="simpo", simpo_gamma=gamma, beta=beta, label_smoothing=0.0,
                               accelerator=SimpleNamespace(device=logps.device))
    theirs, _, _ = cpo.CPOTrainer.cpo_loss(stand_in, *logps.chunk(2))
    chosen, rejected = omnigym_sequence_logps(folders[0], omnigym_pairs(PAIRS[kind], folders[0]), averaged=True)
    ours, _ = preference_loss(chosen, rejected, None, None, "simpo", beta=beta, simpo_gamma=gamma)
    return ours.item(), theirs.mean().item()


@pytest.mark.parametrize("kind", ["text", "chat"])
def test_simpo_loss_matches_trls_cpo_trainer(tmp_path, tiny_folders, kind):
    ours, theirs = simpo_losses(tmp_path, tiny_folders, kind)
    assert ours == pytest.approx(theirs, abs=LOSS_TOLERANCE)


def reward_model_losses(use_margin: bool, center_coef: float) -> tuple[float, float]:
    """omnigym's Bradley-Terry loss and TRL's ``RewardTrainer.compute_loss`` (with a stand-in
    for the trainer, and a model that returns fixed scores) on the same scores."""
    trl_installed()
    from trl import RewardTrainer

    generator = torch.Generator().manual_seed(0)
    chosen, rejected = torch.randn(8, generator=generator), torch.randn(8, generator=generator)
    margin = torch.rand(8, generator=generator) if use_margin else None
    inputs = {"input_ids": torch.zeros(16, 3, dtype=torch.long), "attention_mask": torch.ones(16, 3, dtype=torch.long)}
    if use_margin:
        inputs["margin"] = margin
    identity = SimpleNamespace(gather=lambda x: x, gather_for_metrics=lambda x: x)
    stand_in = SimpleNamespace(model=SimpleNamespace(training=True), accelerator=identity, _tp_size=1,
                               _total_train_tokens=0, _metrics=defaultdict(lambda: defaultdict(list)),
                               args=SimpleNamespace(center_rewards_coefficient=center_coef or None))
    scores = SimpleNamespace(logits=torch.cat([chosen, rejected])[:, None])
    theirs = RewardTrainer.compute_loss(stand_in, lambda **kwargs: scores, inputs)
    ours, _ = bradley_terry(chosen, rejected, margin, center_coef)
    return ours.item(), theirs.item()


@pytest.mark.parametrize("use_margin, center_coef", [(False, 0.0), (True, 0.0), (True, 0.01)])
def test_reward_model_loss_matches_trls_reward_trainer(use_margin, center_coef):
    ours, theirs = reward_model_losses(use_margin, center_coef)
    assert ours == pytest.approx(theirs, abs=LOSS_TOLERANCE)


# The tiny model's chat template with the {% generation %} marks TRL's assistant-only loss
# needs; it renders exactly what models/lm.py's CHAT_TEMPLATE renders.
TEMPLATE_WITH_GENERATION = (
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['role'] == 'assistant' %}{% generation %}"
    "{{ m['content'] }}<|end|>{% endgeneration %}{% else %}{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SFT_ROWS = {
    "prompt-completion": [{"prompt": "2+2=", "completion": "4"}, {"prompt": "Say hi: ", "completion": "hi there"}],
    "chat prompt-completion": [{"prompt": [{"role": "user", "content": "2+2?"}],
                                "completion": [{"role": "assistant", "content": "4"}]},
                               {"prompt": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "hi"}],
                                "completion": [{"role": "assistant", "content": "hello"}]}],
    "text": [{"text": "plain words"}, {"text": "2+2=4"}],
    "messages": [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"},
                               {"role": "assistant", "content": "4"}]},
                 {"messages": [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "red"}]}],
}


def sft_batches(tmp_path, folder, kind, completion_only=True):
    """TRL's SFTTrainer (completion-only and assistant-only loss) and omnigym's SFT data on
    the same rows: (TRL's trainer, its collated batch, omnigym's sequences, omnigym's tokenizer)."""
    trl_installed()
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load(folder)
    tokenizer.chat_template = TEMPLATE_WITH_GENERATION
    rows = SFT_ROWS[kind]
    trainer = SFTTrainer(model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
                         args=SFTConfig(completion_only_loss=completion_only, assistant_only_loss=kind == "messages",
                                        packing=False, **trainer_args(tmp_path)))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(rows))])
    ours = tokenize_rows([(f"row {i}", row) for i, row in enumerate(rows)], tokenizer, max_length=None,
                         completion_only=completion_only).sequences
    return trainer, batch, ours, tokenizer


@pytest.mark.parametrize("kind, completion_only", [(kind, True) for kind in SFT_ROWS] + [("prompt-completion", False)])
def test_sft_trains_on_the_tokens_trl_trains_on_with_the_same_loss(tmp_path, tiny_folders, kind, completion_only):
    trainer, batch, ours, tokenizer = sft_batches(tmp_path, tiny_folders[0], kind, completion_only)
    assert any(0 in trained for _, trained in ours) == (completion_only and kind != "text")
    for row, (ids, trained) in enumerate(ours):
        n = len(ids)
        assert batch["input_ids"][row, :n].tolist() == ids
        assert (batch["labels"][row, :n] != -100).long().tolist() == trained
        assert (batch["labels"][row, n:] == -100).all()
    with torch.no_grad():
        theirs = trainer.compute_loss(trainer.model, batch).item()
        model, _ = load(tiny_folders[0])
        omnigym_batch = make_trained_batch(ours, tokenizer.pad_token_id)
        mine = nll_loss(batch_logprobs(model, omnigym_batch), omnigym_batch.loss_mask).item()
    assert mine == pytest.approx(theirs, abs=LOSS_TOLERANCE)


# --- gymnasium: Atari frames ----------------------------------------------------------------


def atari_frames(game: str, padding_type: str, seed: int = 0):
    """Observations of one game played with the same actions on omnigym's ``ale`` backend
    and on gymnasium's AtariPreprocessing + FrameStackObservation. No-op starts and sticky
    actions are off: each side draws them from its own random stream (docs/atari.md)."""
    pytest.importorskip("ale_py", reason="ale-py is not installed (pip install 'omnigym[atari]')")
    import ale_py
    import gymnasium as gym

    from omnigym.envs.atari import AtariOptions
    from omnigym.envs.vector import make_vec

    gym.register_envs(ale_py)
    ours = make_vec(game, 1, backend="ale", seed=seed,
                    atari=AtariOptions(noop_max=0, fire_reset=False, sticky_actions=0.0))
    theirs = gym.make(game, frameskip=1, repeat_action_probability=0.0)
    theirs = gym.wrappers.AtariPreprocessing(theirs, noop_max=0, frame_skip=4, screen_size=84,
                                             terminal_on_life_loss=False, grayscale_obs=True)
    theirs = gym.wrappers.FrameStackObservation(theirs, 4, padding_type=padding_type)
    obs, _ = ours.reset(seed=seed)
    reference_obs, _ = theirs.reset(seed=seed)
    frames, reference_frames, steps, reference_steps = [obs[0]], [reference_obs], [], []
    rng = np.random.default_rng(seed)
    while True:
        action = int(rng.integers(ours.single_action_space.n))
        obs, reward, terminated, truncated, info = ours.step(np.array([action]))
        reference_obs, reference_reward, reference_terminated, reference_truncated, reference_info = theirs.step(action)
        frames.append(obs[0])
        reference_frames.append(reference_obs)
        steps.append((float(reward[0]), bool(terminated[0]), bool(truncated[0]), int(info["lives"][0])))
        reference_steps.append((float(reference_reward), reference_terminated, reference_truncated,
                                int(reference_info["lives"])))
        if steps[-1][1] or steps[-1][2] or reference_terminated or reference_truncated:
            break
    ours.close()
    theirs.close()
    return np.stack(frames).astype(int), np.stack(reference_frames).astype(int), steps, reference_steps


@pytest.mark.parametrize("game", ["ALE/Breakout-v5", "ALE/Pong-v5"])
def test_ale_backend_frames_are_gymnasiums_frame_for_frame_over_a_whole_game(game):
    frames, reference_frames, steps, reference_steps = atari_frames(game, padding_type="zero")
    assert steps == reference_steps  # rewards, the game's end and lives, step by step
    assert np.array_equal(frames, reference_frames)


def test_ale_backend_starts_the_frame_stack_with_zeros_where_gymnasiums_default_repeats_the_first():
    # The documented difference (docs/atari.md): FrameStackObservation's default padding
    # repeats the reset frame; the ale backend's stack starts with black frames. Only the
    # padded slots of the first 3 observations differ.
    frames, reference_frames, _, _ = atari_frames("ALE/Breakout-v5", padding_type="reset")
    different = np.abs(frames - reference_frames).max(axis=(2, 3)) > 0  # [observation, stack slot]
    expected = np.zeros_like(different)
    for observation in range(3):
        expected[observation, :3 - observation] = True
    assert np.array_equal(different, expected)
    assert not frames[:3][expected[:3]].any()  # the ale side of them is all zeros
    assert np.array_equal(reference_frames[0], np.repeat(frames[0][3:], 4, axis=0))  # gymnasium: the first frame x4


# --- CleanRL: GAE ---------------------------------------------------------------------------


def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL's advantage loop, as written in cleanrl/ppo.py (time-major ``[T, N]``;
    ``dones[t]`` marks that the episode ended before observation t; ``values[t]`` is V(obs t)).
    CleanRL's scripts run it inline under ``__main__``, so there is no function to import."""
    num_steps = len(rewards)
    advantages = np.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


def gae_differences(seed: int, with_truncations: bool, num_steps=64, num_envs=5, gamma=0.99, lam=0.95):
    """Max |omnigym - CleanRL| of advantages and returns on one random rollout.

    CleanRL treats a truncation as a termination (no bootstrap); omnigym bootstraps it from
    the value of the episode's true final observation. The rollout CleanRL is given folds
    that bootstrap into the truncated step's reward (``r + gamma V(final obs)``, as SB3's
    on-policy collector does), which is what bootstrapping means; everything else is the same."""
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(num_steps, num_envs))
    values = rng.normal(size=(num_steps + 1, num_envs))  # V(obs 0) ... V(obs T)
    terminated = rng.random((num_steps, num_envs)) < 0.05
    truncated = (rng.random((num_steps, num_envs)) < 0.05) & ~terminated if with_truncations else \
        np.zeros_like(terminated)
    final_values = rng.normal(size=(num_steps, num_envs))  # V(true final obs) at truncations
    bootstrap = np.where(truncated, final_values, values[1:])
    ended = terminated | truncated
    cleanrl_rewards = rewards + gamma * np.where(truncated, final_values, 0.0)
    dones = np.concatenate([np.zeros((1, num_envs)), ended[:-1]]).astype(float)  # dones[t]: ended before obs t
    expected_advantages, expected_returns = cleanrl_gae(cleanrl_rewards, values[:-1], dones, values[-1],
                                                        ended[-1].astype(float), gamma, lam)

    def batch_major(x):
        return torch.tensor(np.ascontiguousarray(x.T))

    ends = EpisodeEnds(batch_major(terminated), batch_major(truncated), batch_major(bootstrap).float())
    advantages, returns = gae(batch_major(rewards).float(), torch.ones(num_envs, num_steps),
                              values=batch_major(values[:-1]).float(), cfg=AdvantageConfig(gamma, lam), ends=ends)
    return (np.abs(advantages.numpy().T - expected_advantages).max(),
            np.abs(returns.numpy().T - expected_returns).max(), int(truncated.sum()))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_truncations", [False, True])
def test_gae_matches_cleanrls_loop_with_terminations_and_truncations(seed, with_truncations):
    advantage_error, return_error, truncations = gae_differences(seed, with_truncations)
    assert (truncations > 0) == with_truncations
    assert advantage_error < 1e-5 and return_error < 1e-5  # float32 against float64


# --- Stable-Baselines3: running statistics and reward normalization ------------------------


def running_stats_difference(seed: int) -> float:
    sb3 = pytest.importorskip("stable_baselines3.common.running_mean_std",
                              reason="stable-baselines3 is not installed (pip install 'omnigym[dev]')")
    rng = np.random.default_rng(seed)
    ours, theirs = RunningMeanStd((3,)), sb3.RunningMeanStd(shape=(3,))
    for size in (1, 7, 1, 1, 32, 2, 1):  # one row takes omnigym's one-row path
        batch = rng.normal(loc=5.0, scale=3.0, size=(size, 3))
        ours.update(batch)
        theirs.update(batch)
    assert ours.count == theirs.count
    return max(np.abs(ours.mean - theirs.mean).max(), np.abs(ours.var - theirs.var).max())


def test_running_mean_std_matches_sb3():
    assert running_stats_difference(0) < 1e-12


def reward_stream(seed: int, num_envs=3, num_steps=400):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(loc=1.0, scale=2.0, size=(num_steps, num_envs)).astype(np.float32)
    terminated = rng.random((num_steps, num_envs)) < 0.03
    truncated = (rng.random((num_steps, num_envs)) < 0.03) & ~terminated
    return rewards, terminated, truncated


def scripted_envs(rewards, terminated, truncated):
    """One gymnasium env per column of the script: step t gives that row's reward and ends."""
    import gymnasium as gym

    class Scripted(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,))
        action_space = gym.spaces.Discrete(2)

        def __init__(self, column):
            self.column, self.t = column, 0

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, dtype=np.float32), {}

        def step(self, action):
            t, self.t = self.t, self.t + 1
            return (np.zeros(1, dtype=np.float32), float(rewards[t, self.column]), bool(terminated[t, self.column]),
                    bool(truncated[t, self.column]), {})

    return [lambda i=i: Scripted(i) for i in range(rewards.shape[1])]


def omnigym_scaled(rewards, terminated, gamma):
    scaler = RewardScaler(rewards.shape[1], gamma, clip=10.0)
    valid = np.ones(rewards.shape[1], dtype=bool)
    return np.array([scaler(reward, ended, valid) for reward, ended in zip(rewards, terminated)], dtype=np.float64)


def sb3_scaled(rewards, terminated, truncated, gamma):
    """SB3's VecNormalize (rewards only) over a DummyVecEnv of the scripted envs."""
    pytest.importorskip("stable_baselines3", reason="stable-baselines3 is not installed (pip install 'omnigym[dev]')")
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = VecNormalize(DummyVecEnv(scripted_envs(rewards, terminated, truncated)), norm_obs=False, norm_reward=True,
                        gamma=gamma, clip_reward=10.0)
    venv.reset()
    actions = np.zeros(rewards.shape[1], dtype=int)
    return np.array([venv.step(actions)[1] for _ in rewards], dtype=np.float64)


def gymnasium_against_omnigym(rewards, terminated, truncated, gamma):
    """gymnasium's vector NormalizeReward (what CleanRL's continuous PPO wraps its envs in)
    over the scripted envs with NEXT_STEP autoreset, as omnigym's envs run; omnigym's scaler
    is given what that vector env gives, its autoreset steps marked not valid, as
    rl/rollout.py does. Returns (omnigym's, gymnasium's) scaled rewards, ``[steps, envs]``."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    envs = gym.vector.SyncVectorEnv(scripted_envs(rewards, terminated, truncated),
                                    autoreset_mode=AutoresetMode.NEXT_STEP)
    envs = gym.wrappers.vector.NormalizeReward(envs, gamma=gamma)
    envs.reset(seed=0)
    scaler = RewardScaler(rewards.shape[1], gamma, clip=10.0)
    actions = np.zeros(rewards.shape[1], dtype=int)
    valid = np.ones(rewards.shape[1], dtype=bool)
    position = np.zeros(rewards.shape[1], dtype=int)  # each env's next row of the script
    columns = np.arange(rewards.shape[1])
    ours, theirs = [], []
    for _ in range(len(rewards) // 2):  # fewer vector steps than the script has: autoreset steps take some
        _, scaled, step_terminated, step_truncated, _ = envs.step(actions)
        theirs.append(np.clip(scaled, -10.0, 10.0))  # CleanRL clips after it (TransformReward), as RewardScaler does
        raw = np.where(valid, rewards[position, columns], 0.0).astype(np.float32)  # a reset step's reward is 0
        ours.append(scaler(raw, step_terminated, valid))
        position += valid
        valid = ~(step_terminated | step_truncated)  # the next step of an ended env is its reset
    return np.array(ours, dtype=np.float64), np.array(theirs, dtype=np.float64)


def test_reward_scaling_is_gymnasiums_normalize_reward_with_terminations_and_truncations():
    rewards, terminated, truncated = reward_stream(0)
    assert truncated[:200].any() and terminated[:200].any()
    ours, theirs = gymnasium_against_omnigym(rewards, terminated, truncated, gamma=0.99)
    assert np.abs(ours - theirs).max() < 1e-6


def test_reward_scaling_against_sb3s_vec_normalize_differs_only_in_when_the_return_restarts():
    # SB3 adds a terminating step's reward to the episode's return and restarts it at 0 on the
    # next step, at terminations and truncations alike; gymnasium's NormalizeReward, which
    # omnigym follows (docs/mujoco.md, RewardScaler), restarts it at the terminating step
    # itself and not at truncations. So SB3 gives omnigym's figures exactly when each
    # termination reaches it one step early and no truncation does; given the true ends, it
    # does not.
    rewards, terminated, truncated = reward_stream(0)
    ours = omnigym_scaled(rewards, terminated, gamma=0.99)
    one_step_early = np.concatenate([terminated[1:], np.zeros_like(terminated[:1])])
    never = np.zeros_like(terminated)
    assert np.abs(ours - sb3_scaled(rewards, one_step_early, never, gamma=0.99)).max() < 1e-6
    assert np.abs(ours - sb3_scaled(rewards, terminated, truncated, gamma=0.99)).max() > 1e-3
    no_end = sb3_scaled(rewards, never, never, gamma=0.99)
    assert np.abs(omnigym_scaled(rewards, never, gamma=0.99) - no_end).max() < 1e-6
