"""What tests/test_ecosystem_envs.py plays against: a scripted engine, a retrieval server of
the shape skyrl's search tool posts to, an OpenAI-compatible endpoint for verifiers' client,
a tool-rendering chat template for the tiny model, and a watch on GRPO's parameters."""

import json


class Scripted:
    """The engine contract, replies from ``policy(rendered prompt, sample index)``."""

    def __init__(self, engine, tokenizer, policy):
        self.engine, self.tokenizer, self.policy = engine, tokenizer, policy

    @property
    def version(self):
        return self.engine.version

    def update_weights(self, named_tensors, version):
        self.engine.update_weights(named_tensors, version)

    def generate(self, prompts, n, params):
        from omnigym.inference.engine import Sample

        groups = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            groups.append([])
            for j in range(n):
                ids = self.tokenizer(self.policy(text, j), add_special_tokens=False)["input_ids"]
                ids.append(self.tokenizer.eos_token_id)
                groups[-1].append(Sample(list(prompt), ids, [-1.0] * len(ids), True))
        return groups


class Retrieval:
    """A retrieval server of the shape skyrl's search tool posts to (Search-R1's): POST /retrieve
    {"query", "topk"} -> {"result": [[{"document": {"contents": ...}}]]}, over a two-line corpus."""

    CORPUS = ("The capital of Naptheul is Fitor.", "The river of Naptheul is the Oss.")

    def __enter__(self):
        import http.server
        import threading

        queries = self.queries = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                queries.append(body["query"])
                words = set(body["query"].lower().split())
                hits = [{"document": {"contents": text}} for text in Retrieval.CORPUS
                        if words & set(text.lower().rstrip(".").split())]
                data = json.dumps({"result": [hits[:body.get("topk", 3)]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Endpoint:
    """A small OpenAI-compatible chat endpoint (aiohttp) that answers with ``reply(messages)``:
    a string, or a tool call ``("add", {"a": 3, "b": 4})``. It keeps the requests it got."""

    def __init__(self, reply):
        self.reply, self.requests = reply, []

    async def __aenter__(self):
        from aiohttp import web

        async def chat(request):
            body = await request.json()
            self.requests.append(body)
            reply = self.reply(body["messages"])
            message = {"role": "assistant", "content": reply if isinstance(reply, str) else None}
            if not isinstance(reply, str):
                message["tool_calls"] = [{"id": f"call_{len(body['messages'])}", "type": "function",
                                          "function": {"name": reply[0], "arguments": json.dumps(reply[1])}}]
            return web.json_response({
                "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
                "model": body["model"], "choices": [{"index": 0, "message": message,
                                                     "finish_reason": "stop" if isinstance(reply, str) else "tool_calls"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        import openai

        self.client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="test")
        return self

    async def __aexit__(self, *exc):
        await self.client.close()
        await self.runner.cleanup()


TOOL_TEMPLATE = (  # the tiny model's template, with the tools shown and tool calls rendered back (Hermes format)
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ (t.function or t).name }}{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}"
    "{% for c in (m.tool_calls or []) %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def watch_parameters(monkeypatch, grpo) -> dict:
    """``seen["before"]`` / ``seen["after"]``: the policy's parameters around GRPO's policy steps."""
    seen, original = {}, grpo.policy_steps

    def watched(cfg, trainer, *args, **kwargs):
        seen.setdefault("before", {n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        out = original(cfg, trainer, *args, **kwargs)
        seen["after"] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return out

    monkeypatch.setattr(grpo, "policy_steps", watched)
    return seen
