"""Sampling from a recurrent LM (``models/lstm_lm.py``): the prompt read once, then one token
at a time with the LSTM's state carried from step to step, no attention and no KV cache.

Each step is the model's own ``forward`` on one token from the state the last step left, so
what the engine samples from is what ``completion_logprobs`` recomputes over the whole
sequence for the gradient; the log-prob recorded is that of ``processed_logits``, the
distribution the token was drawn from (temperature, top-k, top-p), as the other engines do.
"""

from __future__ import annotations

import torch

from omnigym.inference.engine import BatchedEngine, SamplingParams, decode
from omnigym.models.tokens import cache_name, distinct_rows, left_pad


class RecurrentEngine(BatchedEngine):
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams):
        device = next(self.model.parameters()).device
        name = cache_name()
        # a prompt sampled n times is read once, and each of its rows goes on from its state
        distinct, rows = distinct_rows(prompts)
        tokens, mask = left_pad(distinct, max(map(len, distinct)), self.pad_id)
        out = self.model(input_ids=tokens.to(device), attention_mask=mask.to(device))
        rows = rows.to(device)
        state = getattr(out, name)
        state.batch_select_indices(rows)

        def next_logits(token, t):
            nonlocal state
            out = self.model(input_ids=token[:, None], **{name: state})
            state = getattr(out, name)
            return out.logits[:, -1].float()

        generated, logprobs = decode(out.logits[rows, -1].float(), next_logits, params, self.pad_id, self.eos_id)
        return self._samples(prompts, generated.cpu(), logprobs.cpu(), params.stop_ids)
