"""A token-level LSTM language model (embedding, LSTM, output head): the text policy of the
guide's first project, as a Hugging Face ``PreTrainedModel`` so that it saves, loads and
fills ``model/`` folders as any causal LM does (``--model lstm``).

Its "cache" is the LSTM's state, ``LstmState`` (h and c per row): a forward given one goes
on from it, which is how the recurrent engine (``inference/recurrent.py``) carries the state
token by token while sampling, and how ``models/tokens.py`` runs a prompt's context once and
its completions after it. A position whose attention mask is 0 (padding, left or right)
leaves the state as it was, so a left-padded prompt reads the same as an unpadded one.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from omnigym.models.tokens import cache_name

MODEL_TYPE = "omnigym_lstm"


class LstmLMConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, vocab_size: int = 128, hidden_size: int = 128, num_layers: int = 1, **kwargs):
        self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
        super().__init__(**kwargs)


class LstmState:
    """The LSTM's ``(h, c)``, each ``[layers, B, hidden]``; ``batch_select_indices`` keeps the rows
    named (the KV cache's method of the same name, which ``shared_prefix_forward`` calls)."""

    def __init__(self, h: torch.Tensor, c: torch.Tensor):
        self.h, self.c = h, c

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.h, self.c = self.h[:, indices], self.c[:, indices]


class LstmForCausalLM(PreTrainedModel):
    config_class = LstmLMConfig
    base_model_prefix = "lstm_lm"
    is_recurrent = True
    """read by ``make_engine`` (the recurrent engine) and ``shared_prefix_forward`` (no packed rows)"""

    def __init__(self, config: LstmLMConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.lstm = nn.LSTM(config.hidden_size, config.hidden_size, num_layers=config.num_layers, batch_first=True)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def _init_weights(self, module):  # nn.LSTM and nn.Linear keep PyTorch's own initialisation
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.1)

    def get_input_embeddings(self):
        return self.embed_tokens

    def zero_state(self, batch: int) -> LstmState:
        weight = self.lm_head.weight
        h = weight.new_zeros(self.config.num_layers, batch, self.config.hidden_size)
        return LstmState(h, h.clone())

    def _masked_lstm(self, x: torch.Tensor, mask: torch.Tensor, state: LstmState):
        """The LSTM over each row's unmasked tokens only, in their order, as if the masked ones
        were not there (they keep the state they found; their outputs are zero): the tokens are
        moved to the front of their row, run as a packed sequence, and put back."""
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # unmasked positions first
        lengths = mask.sum(1)
        moved = x.gather(1, order[..., None].expand_as(x))
        packed = nn.utils.rnn.pack_padded_sequence(moved, lengths.clamp(min=1).cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, (h, c) = self.lstm(packed, (state.h, state.c))
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        out = torch.zeros_like(out).scatter(1, order[..., None].expand_as(out), out)
        some = (lengths > 0)[None, :, None]  # a row with no token to read keeps its state
        return out, torch.where(some, h, state.h), torch.where(some, c, state.c)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, use_cache: bool | None = None, **kwargs):
        """``attention_mask`` may cover earlier tokens too (the way attention models take it): its
        last ``L`` columns are this call's. ``position_ids`` and the like are not used."""
        state = kwargs.get("cache", kwargs.get("past_key_values"))
        batch, length = input_ids.shape
        state = self.zero_state(batch) if state is None else state
        x = self.embed_tokens(input_ids)
        mask = None if attention_mask is None else attention_mask[:, -length:].bool()
        if mask is None or bool(mask.all()):  # one call over the whole sequence
            out, (h, c) = self.lstm(x, (state.h, state.c))
        else:
            out, h, c = self._masked_lstm(x, mask, state)
        logits = self.lm_head(out)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                               ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{cache_name(): LstmState(h, c)})


def register() -> None:
    """Make the Auto classes load a saved LSTM LM (a folder whose config says ``omnigym_lstm``);
    called by ``models/lm.load_model`` before it loads anything."""
    AutoConfig.register(MODEL_TYPE, LstmLMConfig, exist_ok=True)
    AutoModelForCausalLM.register(LstmLMConfig, LstmForCausalLM, exist_ok=True)


def build_lstm_model(path, tokenizer, hidden: int = 128, seed: int = 0):
    """An untrained LSTM LM of ``hidden`` units over ``tokenizer`` (the tiny model's character
    tokenizer for ``--model lstm``: about 47k parameters at 64 units), saved with
    ``save_pretrained`` beside the tokenizer."""
    from pathlib import Path

    path = Path(path)
    config = LstmLMConfig(vocab_size=len(tokenizer), hidden_size=hidden, pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = LstmForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
