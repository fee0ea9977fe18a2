"""Replies to plain prompts, scored later by the trainer: PPO-RLHF's generator.

RLHF's reward is the trainer's (a reward model, a KL penalty against the reference, a
critic), so this generator samples one token sequence per prompt and sample and leaves
``reward`` at 0. Each example carries its prompt's token ids as ``prompt_ids``; a reply that
ends at once keeps its end-of-sequence token, so no completion is empty.
"""

from __future__ import annotations

from omnigym.generators.base import Trajectories, Trajectory
from omnigym.inference.engine import SamplingParams


class PromptGenerator:
    def __init__(self, engine, params: SamplingParams, eos_token_id: int):
        self.engine, self.params, self.eos_token_id = engine, params, eos_token_id

    def update_weights(self, named_tensors, version: int) -> None:
        self.engine.update_weights(named_tensors, version)

    def generate(self, examples: list[dict], group_size: int) -> Trajectories:
        groups = self.engine.generate([e["prompt_ids"] for e in examples], group_size, self.params)
        items = []
        for group_id, (example, samples) in enumerate(zip(examples, groups)):
            for s in samples:
                completion = s.completion_ids or [self.eos_token_id]
                logprobs = s.logprobs if s.completion_ids else [0.0]
                items.append(Trajectory(list(example["prompt_ids"]), completion, [1] * len(completion), list(logprobs),
                                        0.0, group_id, self.engine.version, example,
                                        {"finished": s.finished, "cut_off": not s.finished}))
        return Trajectories(items)


def remote_prompt_generator(cfg, policy_source: str, cwd: str) -> PromptGenerator:
    """What a Ray generator actor runs: a policy of the same shape (its weights come from the
    trainer before it samples) with the same sampling settings. Paths are the trainer's."""
    import os

    from omnigym.inference import make_engine
    from omnigym.models.lm import LoraSettings, load_policy_and_tokenizer

    os.chdir(cwd)
    policy, tokenizer = load_policy_and_tokenizer(policy_source, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device, need_chat_template=False)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    return PromptGenerator(make_engine(policy, tokenizer), params, tokenizer.eos_token_id)
