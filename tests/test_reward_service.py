"""omnigym serve-rm and the rm:http://HOST:PORT reward: the served scores are the in-process
rm:RUN_DIR scores, concurrent requests share forward passes, a full queue is 503 and then one
line, bad input is one line, and GRPO with rm:URL logs the metrics it logs with rm:RUN_DIR."""

import contextlib
import http.server
import json
import pickle
import socket
import threading
import time

import pytest
import torch

pytest.importorskip("fastapi", reason="the [serve] extra")

from omnigym.cli import main  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.rewards import parse_weights  # noqa: E402
from omnigym.rewards.remote import RemoteRewardModel  # noqa: E402
from omnigym.rewards.reward_model import RewardModelScorer  # noqa: E402
from omnigym.serve.reward_server import make_reward_app  # noqa: E402
from serve_helpers import free_port, serving  # noqa: E402

PROMPT = [{"role": "user", "content": "Say a few words about rain 1."}]
EXAMPLES = [{"prompt": PROMPT}, {"prompt": "Say something."}, {"question": "What is 2 + 3?"},
            {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]}] * 3
COMPLETIONS = ["aeiou oa ei", "xkcd trm pl", "", "5", "The answer is 5.", "rain falls", "ooo", "x", "a e i",
               "brr", "words words words", "?"]


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    """A reward model folder as `train rm` writes it: the tiny model with a seeded random head
    (the scores differ between replies, which is all these tests need)."""
    from omnigym.models.lm import build_tiny_model, load_tokenizer
    from omnigym.models.scalar_head import load_scalar_model, save_reward_model

    root = tmp_path_factory.mktemp("rm")
    base = build_tiny_model(root / "base", seed=0)
    tokenizer = load_tokenizer(str(base))
    torch.manual_seed(0)
    model = load_scalar_model(str(base), tokenizer.pad_token_id)
    save_reward_model(root / "run" / "model", model, tokenizer,
                      {"base_model": str(base), "conversational": True, "max_length": 256})
    return root / "run"


class GatedScorer(RewardModelScorer):
    """Each scoring call waits until the test opens ``gate``; ``entered`` says one is waiting."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.entered = threading.Event(), threading.Event()

    def __call__(self, completions, examples):
        self.entered.set()
        assert self.gate.wait(60)
        return super().__call__(completions, examples)


@contextlib.contextmanager
def served(reward_dir, scorer_class=RewardModelScorer, **settings):
    scorer = scorer_class(str(reward_dir))
    app = make_reward_app(scorer, **settings)
    with serving(app) as url:
        yield url, app.state.worker, scorer


def wait_for(condition, what: str, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_remote_scores_equal_the_in_process_scores(reward_dir, tmp_path):
    local = parse_weights(f"rm:{reward_dir}:1.0")(COMPLETIONS, EXAMPLES)
    with served(reward_dir, batch_size=32) as (url, batcher, _):
        remote_reward = parse_weights(f"rm:{url}:1.0")
        remote = remote_reward(COMPLETIONS, EXAMPLES)
        # what travels to a Ray actor: the URL and settings, and it scores there the same
        copy = pickle.loads(pickle.dumps(remote_reward))
        assert torch.equal(copy(COMPLETIONS, EXAMPLES), local)
        info = json.loads(urlopen_text(url + "/info"))
    assert remote.dtype == torch.float64 and remote.shape == (len(COMPLETIONS),)
    assert torch.equal(remote, local) and remote.std() > 0
    assert info["model"] == "run" and info["reward"]["conversational"] is True
    assert info["reward"]["base_model"] == "base"
    assert str(tmp_path.parent) not in json.dumps(info)  # no server path leaves the server
    assert info["requests"] == 2 and info["rows"] == 2 * len(COMPLETIONS)


def urlopen_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def test_concurrent_requests_share_forward_passes(reward_dir, monkeypatch):
    """Eight clients at once: the first request is scored alone (held at the gate until the seven
    others wait in the queue), the seven waiting ones in one forward pass."""
    import omnigym.rewards.reward_model as reward_model

    passes, original = [], reward_model.pair_scores
    monkeypatch.setattr(reward_model, "pair_scores", lambda model, prompts, *rest: passes.append(len(prompts))
                        or original(model, prompts, *rest))
    expected = parse_weights(f"rm:{reward_dir}:1.0")(COMPLETIONS[:8], EXAMPLES[:8])
    passes.clear()
    with served(reward_dir, GatedScorer, batch_size=32, max_queue=16) as (url, batcher, scorer):
        reward = RemoteRewardModel(url)
        results = {}

        def client(i):
            results[i] = reward(COMPLETIONS[i:i + 1] * 2, EXAMPLES[i:i + 1] * 2)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        # the first alone, held at the gate, and only then the seven (started together, two could
        # be taken into the first batch on a busy machine, and seven would never wait)
        threads[0].start()
        wait_for(scorer.entered.is_set, "the first request was not taken")
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: batcher.waiting() == 7, "the seven requests did not queue up")
        scorer.gate.set()
        for thread in threads:
            thread.join(60)
        info = json.loads(urlopen_text(url + "/info"))
    assert info["requests"] == 8 and info["rows"] == 16
    assert info["forward_passes"] == len(passes) == 2 < info["requests"]  # the server counts what it ran
    assert sorted(passes) == [2, 14]
    for i in range(8):  # merged with others or alone, each request gets its own rows' scores
        assert torch.allclose(results[i], expected[i].repeat(2), atol=1e-5)


def test_a_full_queue_is_503_and_after_the_retries_one_line(reward_dir):
    with served(reward_dir, GatedScorer, batch_size=4, max_queue=1) as (url, batcher, scorer):
        reward = RemoteRewardModel(url, retries=2, backoff_s=0.01)
        held = [threading.Thread(target=reward, args=(COMPLETIONS[:2], EXAMPLES[:2])) for _ in range(2)]
        held[0].start()
        wait_for(scorer.entered.is_set, "the first request was not taken")
        held[1].start()
        wait_for(lambda: batcher.waiting() == 1, "the second request did not queue")
        with pytest.raises(OmnigymError) as error:
            reward(COMPLETIONS[:2], EXAMPLES[:2])
        scorer.gate.set()
        for thread in held:
            thread.join(60)
        assert batcher.requests == 2
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"rm:{url}: the server's queue stayed full after 3 tries")
    assert "--max-queue" in message


@contextlib.contextmanager
def garbage_server(answer: bytes, info: bytes | None = None):
    """A loopback HTTP server that answers ``answer`` to every request (``info`` to /info when
    given): not a reward server."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(info if info is not None and self.path == "/info" else answer)

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_server():
    """A loopback port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@contextlib.contextmanager
def junk_server():
    """A loopback port that answers every connection with a line that is not HTTP."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def answer():
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                with connection:
                    connection.recv(65536)
                    connection.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def one_line_error(make) -> str:
    with pytest.raises(OmnigymError) as error:
        make()
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_server_that_is_down_garbage_or_silent_is_one_line():
    port = free_port()
    assert one_line_error(lambda: RemoteRewardModel(f"http://127.0.0.1:{port}")).startswith(
        f"rm:http://127.0.0.1:{port}: no reward server answers there")
    with garbage_server(b"<html>hello</html>") as url:
        assert "answered /info with something that is not JSON" in one_line_error(lambda: RemoteRewardModel(url))
    with garbage_server(b'{"status": "ok"}') as url:
        assert "without a reward model's description" in one_line_error(lambda: RemoteRewardModel(url))
    with junk_server() as url:
        assert "answered /info with something that is not HTTP" in one_line_error(lambda: RemoteRewardModel(url))
    with silent_server() as url:
        assert f"rm:{url}: no answer within 0.5 s" in one_line_error(lambda: RemoteRewardModel(url, timeout_s=0.5))


def test_a_reply_without_one_score_per_completion_is_one_line():
    with garbage_server(b'{"scores": [1.0]}', info=b'{"model": "run", "reward": {}}') as url:
        reward = RemoteRewardModel(url)
        assert "answered /score without one score per completion (2 sent)" in one_line_error(
            lambda: reward(COMPLETIONS[:2], EXAMPLES[:2]))


@pytest.mark.parametrize("body, message", [
    (b"not json", "bad /score request: Invalid JSON"),
    (b'{"completions": ["a"], "prompts": [3]}', "bad /score request: prompts.0"),
    (b'{"completions": ["a", "b"], "prompts": ["q"]}', "2 completions but 1 prompts"),
    (b'{"completions": ["a"], "prompts": [[{"role": "user"}]]}', "bad /score request: prompts.0"),
    (b'{"completions": ["a"], "prompts": [[]]}', "bad /score request: prompts.0"),  # was a 500
    (b'{"completions": ["a"], "prompts": ["/etc/passwd"], "path": "/etc/passwd"}', None),  # text, never a file
])
def test_bad_requests_are_400_with_a_line_and_never_name_a_file(reward_dir, body, message):
    import urllib.error
    import urllib.request

    with served(reward_dir) as (url, batcher, _):
        request = urllib.request.Request(url + "/score", data=body, method="POST")
        if message is None:
            with urllib.request.urlopen(request, timeout=30) as response:
                scores = json.loads(response.read())["scores"]
            assert scores == RewardModelScorer(str(reward_dir))(["a"], [{"prompt": "/etc/passwd"}]).tolist()
            return
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=30)
        assert error.value.code == 400 and message in json.loads(error.value.read())["detail"]
        assert batcher.requests == 0


@pytest.mark.parametrize("spec, message", [
    ("rm:http://127.0.0.1:8000", "--rewards rm:http://127.0.0.1:8000: give the weight after the port "
                                 "(rm:http://127.0.0.1:8000:1.0)"),
    ("rm:http://[::1]:8000", "give the weight after the port"),
    ("rm:ftp://127.0.0.1:8000:1.0", "no such folder"),  # not http(s): a folder, which is not there
    ("rm:http://127.0.0.1:99999:1.0", "rm:http://127.0.0.1:99999 is not a URL"),
    ("rm:http://:8000:1.0", "rm:http://:8000 is not a URL"),
    ("rm:http://127.0.0.1:8000/?key=1:1.0", "give the server's address alone"),
])
def test_bad_urls_are_one_line(spec, message):
    assert message in one_line_error(lambda: parse_weights(spec))


def test_the_weight_follows_the_port(reward_dir):
    with served(reward_dir) as (url, _, _):
        reward = parse_weights(f"format:0.5,rm:{url}:2.0")
    assert reward.weights == {"format": 0.5, f"rm:{url}": 2.0}


@pytest.mark.parametrize("argv, message", [
    (["{tmp}"], "is not a reward model"),
    (["{tmp}/missing"], "no such folder"),
    (["{rm}", "--batch-size", "0"], "--batch-size 0: must be at least 1"),
    (["{rm}", "--max-queue", "0"], "--max-queue 0: must be at least 1"),
    (["{rm}", "--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other machines; set an API key"),
    (["{rm}", "--port", "0"], "--port 0: choose 1-65535"),
    (["{rm}", "--device", "tpu"], "--device tpu: choose cpu, or cuda"),
    (["{rm}", "--port", "{busy}"], "cannot listen on 127.0.0.1:{busy}"),
    (["{rm}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_serve_rm_input_is_one_line(tmp_path, capsys, reward_dir, argv, message):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        names = dict(tmp=tmp_path, rm=reward_dir, busy=busy.getsockname()[1])
        assert main(["serve-rm", *[a.format(**names) for a in argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error:") and message.format(**names) in err[0], err
    assert list(tmp_path.iterdir()) == []


def grpo_metrics(run_dir):
    """The logged metrics, less wall-clock timings; the reward's own part (``reward/rm:<URL or
    folder>``) under one name."""
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [{("reward/rm" if k.startswith("reward/rm:") else k): v for k, v in r.items()
             if not k.startswith(("perf", "time", "async/generator_idle", "async/trainer_idle"))} for r in rows]


GRPO = dict(sft_steps=0, steps=2, prompts_per_step=4, group_size=4, eval_size=8, eval_every=100, max_new_tokens=8,
            skip_equal_groups=False, progress=False, plot=False, tensorboard=False)


def test_grpo_with_the_served_model_logs_what_it_logs_with_the_folder(tmp_path, reward_dir):
    from omnigym.algos import grpo

    grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "local"), rewards=f"rm:{reward_dir}:1.0", **GRPO))
    with served(reward_dir) as (url, batcher, _):
        grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "remote"), rewards=f"rm:{url}:1.0", **GRPO))
        scored = batcher.requests
    local, remote = grpo_metrics(tmp_path / "local"), grpo_metrics(tmp_path / "remote")
    steps = [r for r in remote if "reward/mean" in r]
    assert len(steps) == 2 and steps[0]["reward/std"] > 0 and scored >= 2
    assert remote == local


def test_a_grpo_run_on_a_server_that_is_down_is_one_line_and_no_run_dir(tmp_path, capsys):
    port = free_port()
    argv = ["train", "grpo", "--rewards", f"rm:http://127.0.0.1:{port}:1.0", "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"rm:http://127.0.0.1:{port}: no reward server answers there" in err[0], err
    assert "omnigym serve-rm" in err[0] and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_async_grpo_on_ray_with_the_served_model_matches_the_folder(tmp_path, reward_dir):
    """--runtime ray --max-staleness 1, two generator actors: each sends its batches to the server
    (which may merge the two actors' requests) instead of loading the model itself. Both runs join
    one local Ray started here (a run given none starts and stops its own: twice the start)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
    from omnigym.algos import grpo
    from omnigym.runtime.ray_actors import THREAD_ENV

    ray_flags = dict(GRPO, steps=3, runtime="ray", max_staleness=1, num_generators=2)
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": THREAD_ENV})
    try:
        grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "local"), rewards=f"rm:{reward_dir}:1.0", **ray_flags))
        with served(reward_dir) as (url, batcher, _):
            grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "remote"), rewards=f"rm:{url}:1.0", **ray_flags))
            scored = batcher.requests
    finally:
        ray.shutdown()
    local, remote = grpo_metrics(tmp_path / "local"), grpo_metrics(tmp_path / "remote")
    steps = [r for r in remote if "reward/mean" in r]
    assert len(steps) == 3 and all(r["async/staleness_max"] <= 1 for r in steps) and scored >= 3
    assert [r.keys() for r in remote] == [r.keys() for r in local]
    for mine, theirs in zip(remote, local):  # a merged batch pads differently: equal to float32 rounding
        assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-5)


def test_serve_rm_without_the_extra_is_one_line_naming_it(tmp_path, capsys, monkeypatch, reward_dir):
    import sys

    for name in ("fastapi", "uvicorn"):  # unimportable, as where [serve] is not installed
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["serve-rm", str(reward_dir), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'omnigym[serve]'" in err[0], err


def test_with_api_keys_a_request_without_one_is_refused_in_one_line(reward_dir, monkeypatch):
    from omnigym.rewards.remote import KEY_ENV

    monkeypatch.delenv(KEY_ENV, raising=False)
    with served(reward_dir, api_keys=["first-key-0123", "second-key-4567"]) as (url, batcher, _):
        message = one_line_error(lambda: RemoteRewardModel(url))
        assert message == f"rm:{url}: the server wants an API key; set ${KEY_ENV} to one of its keys"
        monkeypatch.setenv(KEY_ENV, "wrong-key-89ab")
        assert "wants an API key" in one_line_error(lambda: RemoteRewardModel(url))
        monkeypatch.setenv(KEY_ENV, "second-key-4567")
        scores = RemoteRewardModel(url)(COMPLETIONS[:3], EXAMPLES[:3])
    assert scores.shape == (3,) and batcher.requests == 1
