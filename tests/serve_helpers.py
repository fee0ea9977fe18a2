"""A small hub that keeps serve/contract.py's promises (so the HTTP layer is tested before, and
apart from, the real one), and a uvicorn server on a free loopback port in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import torch

from omnigym.serve.contract import ForwardResult, RequestError, SampledSequence, SampleResult

LOSSES = ("cross_entropy", "importance_sampling")


class FakeHub:
    """A unigram model per run (one logit per token), trained by Adam: enough to see loss fall,
    state saved and loaded, and samples drawn, with every call recorded."""

    def __init__(self, base_model: str, root: Path, vocab_size: int = 32, max_length: int = 64):
        self.base_model, self.root = base_model, Path(root)
        self.vocab_size, self.max_length = vocab_size, max_length
        self.runs: dict[str, dict] = {}
        self.calls: list[tuple] = []

    def create_model(self, model_id, lora_rank, seed, train_mlp, train_attn, train_unembed):
        self.calls.append(("create_model", model_id, lora_rank, seed))
        gen = torch.Generator().manual_seed(seed)
        logits = (0.01 * torch.randn(self.vocab_size, generator=gen)).requires_grad_()
        self.runs[model_id] = {"logits": logits, "opt": None}

    def _run(self, model_id):
        if model_id not in self.runs:
            raise RequestError(f"model {model_id} is not loaded")
        return self.runs[model_id]

    def forward_backward(self, model_id, data, loss_fn, loss_fn_config, forward_only):
        self.calls.append(("forward_backward", model_id, loss_fn, forward_only))
        if loss_fn not in LOSSES:
            raise RequestError(f"unknown loss {loss_fn!r}; this server has {', '.join(LOSSES)}")
        run = self._run(model_id)
        outputs, total = [], torch.zeros(())
        for datum in data:
            logp = torch.log_softmax(run["logits"], -1)[datum.inputs["target_tokens"].long()]
            weights = datum.inputs.get("weights", torch.ones_like(logp))
            if loss_fn == "cross_entropy":
                loss = -(logp * weights).sum()
            else:
                loss = -(torch.exp(logp - datum.inputs["logprobs"]) * datum.inputs["advantages"]).sum()
            total = total + loss
            outputs.append({"logprobs": logp.detach().float(), "elementwise_loss": (-logp * weights).detach()})
        if not forward_only:
            total.backward()
        return ForwardResult(outputs, {"loss:sum": float(total.detach())})

    def optim_step(self, model_id, adam):
        self.calls.append(("optim_step", model_id, adam.learning_rate))
        run = self._run(model_id)
        if run["opt"] is None:
            run["opt"] = torch.optim.Adam([run["logits"]], lr=adam.learning_rate)
        for group in run["opt"].param_groups:
            group["lr"] = adam.learning_rate
        grad_norm = float(run["logits"].grad.norm()) if run["logits"].grad is not None else 0.0
        run["opt"].step()
        run["opt"].zero_grad()
        return {"grad_norm": grad_norm}

    def _file(self, model_id, name, kind):
        return self.root / model_id.replace(":", "_") / kind / f"{name}.pt"

    def save(self, model_id, name, kind):
        self.calls.append(("save", model_id, name, kind))
        run = self._run(model_id)
        path = self._file(model_id, name, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"logits": run["logits"].detach().clone(),
                    "opt": run["opt"].state_dict() if run["opt"] and kind == "state" else None}, path)

    def load(self, model_id, source_model_id, name, with_optimizer):
        self.calls.append(("load", model_id, source_model_id, name, with_optimizer))
        saved = torch.load(self._file(source_model_id, name, "state"))
        run = self._run(model_id)
        with torch.no_grad():
            run["logits"].copy_(saved["logits"])
        run["opt"] = None
        if with_optimizer and saved["opt"] is not None:
            run["opt"] = torch.optim.Adam([run["logits"]], lr=1e-3)
            run["opt"].load_state_dict(saved["opt"])

    def sample(self, source, prompt, n, params):
        self.calls.append(("sample", source.model_id, source.name, n))
        if source.model_id is None:
            logits = torch.zeros(self.vocab_size)
        else:
            logits = torch.load(self._file(source.model_id, source.name, "sampler"))["logits"]
        gen = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
        logp = torch.log_softmax(logits / max(params.temperature, 1e-6), -1)
        sequences = []
        for _ in range(n):
            tokens = torch.multinomial(logp.exp(), params.max_tokens, replacement=True, generator=gen).tolist()
            stop = "length"
            for i, t in enumerate(tokens):
                if t in params.stop_tokens:
                    tokens, stop = tokens[:i + 1], "stop"
                    break
            sequences.append(SampledSequence(tokens, [float(logp[t]) for t in tokens], stop))
        prompt_lp = [None] + [float(logp[t]) for t in prompt[1:]] if params.prompt_logprobs else None
        return SampleResult(sequences, prompt_lp)

    def drop(self, model_id):
        self.calls.append(("drop", model_id))
        self.runs.pop(model_id, None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app, port: int | None = None, close_clients: bool = True):
    """The app on 127.0.0.1 in a thread; yields its base URL and stops it (and its worker), after
    closing the tinker clients made meanwhile (``close_clients``: a test that restarts the server
    under the same client closes it itself)."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        with tinker_clients_closed() if close_clients else contextlib.nullcontext():
            yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        app.state.worker.stop()


@contextlib.contextmanager
def tinker_clients_closed():
    """Each tinker ``ServiceClient`` made in the block is closed at its end, while the server still
    answers: an open client sends a heartbeat every 10 s for as long as the test process lives,
    and warns that "Tinker is down" once the test's server has gone."""
    try:
        import tinker
    except ImportError:
        yield
        return
    made, original_init = [], tinker.ServiceClient.__init__

    def recorded_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        made.append(self)

    tinker.ServiceClient.__init__ = recorded_init
    try:
        yield
    finally:
        tinker.ServiceClient.__init__ = original_init
        for client in made:
            try:
                client.close("success").result(timeout=10)
            except Exception:  # a session the test ended or broke on purpose: its heartbeats stop all the same
                pass


def serve_fake_forever(store_dir: str, port: int) -> None:
    """A server process over FakeHub (its checkpoints under store_dir), for a test to kill."""
    import uvicorn

    from omnigym.serve.app import Limits, make_app
    from omnigym.serve.store import Store

    root = Path(store_dir)
    app = make_app(FakeHub("tiny-base", root / "hub"), Store(root / "serve.db"), limits=Limits(poll_s=2))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
