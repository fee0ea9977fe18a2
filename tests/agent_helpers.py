"""What the agent tests share: a tiny model, a chat template with tool support for it, and an
engine that answers with scripted replies (so a test knows exactly what was sampled)."""

import asyncio

from omnigym.inference.engine import Sample

TOOL_TEMPLATE = (
    "{%- if tools %}<|system|>Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
    "Call as <tool_call>{\"name\": N, \"arguments\": {...}}</tool_call><|end|>{% endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}"
    "{%- for c in m['tool_calls'] or [] %}<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}</tool_call>{% endfor %}<|end|>{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""The tiny model's template plus Hermes-style tools: the tool names in a system turn, and an
assistant's tool calls rendered back as <tool_call>{json}</tool_call>."""


class ScriptedEngine:
    """Answers each prompt with the next scripted reply (its tokens then end-of-sequence, or cut
    at max_new_tokens); log-probs -0.01, -0.02, ...; every call is kept."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.replies, self.version, self.calls = tokenizer, list(replies), 0, []
        self.eos_token_id = tokenizer.eos_token_id

    def generate(self, prompts, n, params):
        out = []
        for prompt in prompts:
            ids = self.tokenizer(self.replies.pop(0), add_special_tokens=False)["input_ids"] + \
                [self.eos_token_id]
            finished = len(ids) <= params.max_new_tokens
            ids = ids[:params.max_new_tokens]
            sample = Sample(list(prompt), ids, [-0.01 * (i + 1) for i in range(len(ids))], finished)
            self.calls.append((list(prompt), params, sample))
            out.append([sample] * n)
        return out

    def update_weights(self, named_tensors, version):
        self.version = version


def run_async(coroutine):
    return asyncio.run(coroutine)
