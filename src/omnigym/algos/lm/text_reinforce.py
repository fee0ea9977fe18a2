"""REINFORCE on text: the classic first exercise of RL on a language model.

Play a single-turn text env whose one prompt asks for anything, reward the completions
that contain the keywords, and step on ``-(reward - mean reward) * log p(completion)``, the
score-function gradient with the batch mean as baseline. Same env layer, generator,
engine, batches, log-probs, tracking and rollouts seam (``--runtime ray``) as GRPO; no
clipping, no reference model.
"""

from __future__ import annotations

import functools
import os
from contextlib import closing
from dataclasses import dataclass

import torch

from omnigym.agents.config import AgentConfig
from omnigym.agents.episodes import agent_generators, load_agent
from omnigym.backends.local import LocalBackend
from omnigym.config import RunConfig, require_positive
from omnigym.envs.text import TextEnv
from omnigym.errors import OmnigymError, require
from omnigym.generators.base import Trajectories
from omnigym.generators.text_env import TextEnvGenerator
from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.lm import stripped_special_tokens
from omnigym.models.tokens import completion_logprobs, make_completion_batch, padded
from omnigym.optim import adamw
from omnigym.process import scoped_run
from omnigym.evaluation.text import SAMPLES_SHOWN, sample_row
from omnigym.rewards import get_reward, parse_weights
from omnigym.rewards.judge import judge_metrics
from omnigym.rl.hacking import HackingMonitor
from omnigym.rl.losses import PolicyLossConfig, check_finite, reinforce
from omnigym.runtime import RolloutRuntimeConfig, make_rollouts
from omnigym.track.progress import Clock
from omnigym.track.run import start_run


@dataclass
class TextReinforceConfig(AgentConfig, RolloutRuntimeConfig, RunConfig):
    model: str = "tiny"
    """hub id or local path; "tiny" builds a ~1M-parameter untrained model offline, "lstm" an untrained
    LSTM language model (embedding, LSTM, output head; the guide's first project)"""
    lstm_hidden: int | None = None
    """--model lstm: the LSTM's units (128 when not given)"""
    prompt: str = "Say something."
    keywords: str = "a"
    """comma-separated keywords the completion should contain"""
    rewards: str | None = None
    """weighted rewards (name:weight,...) instead of the keyword reward, e.g. rm:RUN_DIR:1.0 for a
    reward model trained by omnigym train rm"""
    steps: int = 40
    batch_size: int = 32
    learning_rate: float = 1e-3
    max_new_tokens: int = 16
    temperature: float = 1.0
    hacking_warnings: bool = True
    """say a warning line when the reward-hacking monitor finds a known hack (the prompt echoed and paid,
    a format part rising alone, the reward following reply length); the hacking/... metrics are logged
    either way (docs/hacking.md)"""

    RESUMABLE = False  # short runs: no checkpoint to continue from

    def check(self) -> None:
        super().check()
        require_positive(self, "steps", "batch_size", "learning_rate", "max_new_tokens", "temperature")
        self.check_runtime(self.batch_size, "samples of a step (--batch-size), split between them")
        require(self.batch_size % self.num_generators == 0,
                f"--batch-size {self.batch_size} does not split evenly between --num-generators {self.num_generators}; "
                "make it a multiple")
        self.check_agent()
        if self.lstm_hidden is not None:
            require(self.model == "lstm", f"--lstm-hidden sizes the LSTM of --model lstm; --model {self.model} has none")
            require_positive(self, "lstm_hidden")
            # the weights and Adam's moments grow with the square (4096 units: ~67M parameters, ~1 GB
            # with the moments); a size past that asked for tens of GB and died in an allocation
            require(self.lstm_hidden <= MAX_LSTM_HIDDEN,
                    f"--lstm-hidden {self.lstm_hidden} is more than {MAX_LSTM_HIDDEN}: --model lstm is a small "
                    "model built untrained for CPU runs; bring a larger model as --model PATH")
        require(not (self.agent and self.rewards), f"--agent {self.agent} returns the episode's reward: leave out --rewards")


CONFIG = TextReinforceConfig
LSTM_HIDDEN = 128
MAX_LSTM_HIDDEN = 4096


@scoped_run
def train(cfg: TextReinforceConfig) -> dict:
    from omnigym.models.lm import check_context, load_policy_and_tokenizer


    keywords = keywords_of(cfg)
    agent = load_agent(cfg.agent) if cfg.agent else None  # checked before the run starts
    if cfg.resume:
        raise OmnigymError("text_reinforce runs are short and keep no checkpoint; start a new run instead of --resume")
    run = start_run(cfg, "text_reinforce", cfg.model)
    policy, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, device=cfg.device,
                                                  lstm_hidden=cfg.lstm_hidden or LSTM_HIDDEN)
    check_context(policy, cfg.max_new_tokens)
    trainer = LocalBackend(policy, adamw(policy, cfg.learning_rate))
    example = {"question": cfg.prompt, "keywords": keywords}
    behaviour_cap = cfg.behaviour_cap_in_effect()
    loss_cfg = PolicyLossConfig(aggregation="seq-mean-token-sum-norm", normalizer=cfg.max_new_tokens,
                                behaviour_cap=behaviour_cap)
    run.begin({})

    def loss_fn(model, batch):
        tokens, advantages, behaviour = batch
        logprobs = completion_logprobs(model, tokens)
        loss, _ = reinforce(logprobs, logprobs.detach(), advantages, tokens.loss_mask, loss_cfg, behaviour)
        check_finite(loss, step)
        return loss, {}

    # sync: sample in this process; ray: generator actors up to K steps ahead, each with its share of the batch
    # --agent: your function plays each episode on {"question": --prompt, "keywords": [...]}, its return the reward
    local = agent_generators(cfg, agent, make_engine(policy, tokenizer), tokenizer, policy)[0] if agent else \
        make_generator(cfg, policy, tokenizer)
    rollouts = make_rollouts(cfg, local, functools.partial(remote_generator, cfg,
                             os.getcwd()), lambda step: [example] * cfg.num_generators,
                             cfg.batch_size // cfg.num_generators, cfg.steps, cfg.seed)
    monitor = HackingMonitor(warn=cfg.hacking_warnings)  # no --resume here: nothing to replay
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    with closing(rollouts):  # Ray's actors end with the run, however it ends
        clock = Clock(0)
        rollouts.update_weights(policy.named_parameters(), version=0)
        for step in range(cfg.steps):
            trajectories = rollouts.trajectories(step)
            items = [t for t in trajectories.items if not t.info.get("error")]  # a failed --agent episode: left out
            if not items:  # every episode failed: nothing to learn from, the policy stays
                rewards = torch.zeros(1)
                rollouts.update_weights((), version=step + 1)
                run.log(step + 1, {"reward/mean": 0.0, "agent/errors": len(trajectories)})
                continue
            rewards = torch.tensor([t.reward for t in items])
            tokens = make_completion_batch([t.prompt_ids for t in items], [t.response_ids for t in items],
                                           tokenizer.pad_token_id, [t.loss_mask for t in items] if agent else None,
                                           device=cfg.device)  # an agent's inserted tokens: mask 0
            advantages = (rewards - rewards.mean()).to(cfg.device).unsqueeze(1)
            behaviour = None if behaviour_cap is None else \
                padded([t.logprobs for t in items], tokens.loss_mask.shape[1]).to(cfg.device)
            loss = trainer.forward_backward((tokens, advantages, behaviour), loss_fn)["loss"]
            trainer.optim_step()
            rollouts.update_weights(policy.named_parameters(), version=step + 1)
            run.log(step + 1, {"reward/mean": rewards.mean().item(), "losses/policy_loss": loss.item(),
                               "completion/length": sum(sum(t.loss_mask) for t in items) / len(items),
                               **({"agent/errors": len(trajectories) - len(items)} if agent else {}),
                               "perf/steps_per_second": clock.sps(step + 1), **rollouts.metrics(),
                               **monitor.step(step + 1, Trajectories(items), decode),
                               **judge_metrics(Trajectories(items))})
            if step == 0 or (step + 1) % 10 == 0 or step + 1 == cfg.steps:  # a few of the batch's episodes, to read
                run.log_samples(step + 1, [
                    {**sample_row(t.example, tokenizer.decode(t.response_ids, skip_special_tokens=True), reward=t.reward),
                     **stripped_special_tokens(tokenizer, t.response_ids, t.loss_mask)} for t in items[:SAMPLES_SHOWN]])
    plot_path = run.close(plot=cfg.plot, metric="reward/mean")
    run.say(f"run: {run.dir}", f"final mean reward: {rewards.mean().item():.3f}")
    return {"run_dir": str(run.dir), "final_reward": rewards.mean().item(), "plot": str(plot_path) if plot_path else None}


def keywords_of(cfg: TextReinforceConfig) -> list[str]:
    keywords = [k for k in cfg.keywords.split(",") if k]
    if not keywords:
        raise OmnigymError("--keywords needs at least one keyword")
    return keywords


def make_generator(cfg: TextReinforceConfig, policy, tokenizer) -> TextEnvGenerator:
    """The one-prompt env played by ``policy`` (in this process, or in a Ray actor)."""
    example = {"question": cfg.prompt, "keywords": keywords_of(cfg)}
    reward = parse_weights(cfg.rewards).to(cfg.device) if cfg.rewards else get_reward("keyword")
    return TextEnvGenerator(TextEnv([example], reward), make_engine(policy, tokenizer), tokenizer,
                            SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature))


def remote_generator(cfg: TextReinforceConfig, cwd: str) -> TextEnvGenerator:
    """What a Ray generator actor runs: a policy of the same shape, fed the trainer's weights."""
    from omnigym.models.lm import load_policy_and_tokenizer

    os.chdir(cwd)
    policy, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, device=cfg.device,
                                                  lstm_hidden=cfg.lstm_hidden or LSTM_HIDDEN)
    return make_generator(cfg, policy, tokenizer)
