"""Sampling with Hugging Face ``generate``: any causal LM, CPU or GPU, LoRA included."""

from __future__ import annotations

import torch

from omnigym.inference.engine import BatchedEngine, Sample, SamplingParams, drawn_logprobs
from omnigym.models.precision import autocast_for
from omnigym.models.tokens import left_pad


class HFEngine(BatchedEngine):
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        device = next(self.model.parameters()).device
        width = max(map(len, prompts))
        input_ids, attention = left_pad(prompts, width, self.pad_id)
        sampling = {} if params.greedy else {"temperature": params.temperature, "top_p": params.top_p,
                                             "top_k": params.top_k}
        with autocast_for(self.model):  # --precision bf16: one region, the weights cast once and not at every token
            out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                      max_new_tokens=params.max_new_tokens,
                                      eos_token_id=[self.eos_id, *params.stop_ids] if params.stop_ids else self.eos_id,
                                      pad_token_id=self.pad_id, use_cache=True, return_dict_in_generate=True,
                                      output_logits=True, output_scores=not params.greedy,
                                      do_sample=not params.greedy, **sampling)
        new_tokens = out.sequences[:, width:].cpu()
        # sampling: generate's own processed scores (temperature, top-k, top-p and whatever the
        # model's generation config adds), the distribution each token was drawn from; greedy:
        # the model's logits
        processed = torch.stack(out.logits if params.greedy else out.scores, 1).float().cpu()
        return self._samples(prompts, new_tokens, drawn_logprobs(processed, new_tokens), params.stop_ids)
