"""Sampling from a recurrent LM (``models/lstm_lm.py``): the prompt read once, then one token
at a time with the LSTM's state carried from step to step, no attention and no KV cache.

Each step is the model's own ``forward`` on one token from the state the last step left, so
what the engine samples from is what ``completion_logprobs`` recomputes over the whole
sequence for the gradient; the log-prob recorded is that of ``processed_logits``, the
distribution the token was drawn from (temperature, top-k, top-p), as the other engines do.
"""

from __future__ import annotations

import torch

from omnigym.inference.engine import BatchedEngine, SamplingParams, drawn_logprobs, processed_logits
from omnigym.inference.kv import draw
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
        logits = out.logits[rows, -1].float()
        batch = len(prompts)
        generated = torch.full((batch, params.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, params.max_new_tokens), device=device)
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        ends = torch.tensor(sorted({self.eos_id, *params.stop_ids}), device=device)
        for t in range(params.max_new_tokens):
            processed = processed_logits(logits, params)  # what is drawn from is what is recorded
            token = processed.argmax(-1) if params.greedy else draw(processed)
            token = torch.where(done, self.pad_id, token)
            generated[:, t], logprobs[:, t] = token, drawn_logprobs(processed, token)
            done |= torch.isin(token, ends)
            if t == params.max_new_tokens - 1 or bool(done.all()):
                break
            out = self.model(input_ids=token[:, None], **{name: state})
            state, logits = getattr(out, name), out.logits[:, -1].float()
        return self._samples(prompts, generated.cpu(), logprobs.cpu(), params.stop_ids)
