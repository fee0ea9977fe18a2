"""``omnigym serve``'s flags: each mistake is one line and exit code 2, and nothing is created on
disk; a good command serves the tinker SDK (when serve/hub.py is present)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omnigym.cli import main


@pytest.fixture
def base(tmp_path):
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def one_line(capsys, argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no store, nothing
    return err[0]


@pytest.mark.parametrize("argv, text", [
    ([], "the following arguments are required: --base-model"),
    (["--base-model", "nowhere"], "--base-model nowhere: no model there"),
    (["--base-model", "{base}", "--host", "0.0.0.0"], "--host 0.0.0.0 is reachable from other machines"),
    (["--base-model", "{base}", "--host", "192.168.1.5"], "set an API key with --api-key-env"),
    (["--base-model", "{base}", "--api-key-env", "OMNIGYM_TEST_NO_SUCH_VAR"], "that variable is not set or empty"),
    (["--base-model", "{base}", "--api-key-env", "OMNIGYM_TEST_BAD_KEY"], "each key must start with tml-"),
    (["--base-model", "{base}", "--port", "70000"], "--port 70000: choose 1-65535"),
    (["--base-model", "{base}", "--port", "eighty"], "argument --port: invalid int value"),
    (["--base-model", "{base}", "--max-data", "0"], "--max-data 0: must be at least 1"),
    (["--base-model", "{base}", "--store", "afile"], "--store afile is a file"),
    (["--base-model", "{base}", "--wat"], "unrecognized arguments: --wat"),
    # it was made there, and a --overwrite of the run would have moved the server's records aside
    (["--base-model", "{base}", "--store", "runs/ppo/store"], "--store runs/ppo/store is inside the run "),
])
def test_bad_flags_one_line_nothing_created(argv, text, base, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMNIGYM_TEST_BAD_KEY", "hunter2")
    monkeypatch.delenv("OMNIGYM_TEST_NO_SUCH_VAR", raising=False)
    if "afile" in argv:
        (tmp_path / "afile").write_text("x")
    if "runs/ppo/store" in argv:
        (tmp_path / "runs" / "ppo").mkdir(parents=True)
        (tmp_path / "runs" / "ppo" / "metrics.jsonl").write_text("")
    line = one_line(capsys, [a.replace("{base}", str(base)) for a in argv], tmp_path, monkeypatch)
    assert text in line, line
    assert not (tmp_path / "runs" / "ppo" / "store").exists()


@pytest.mark.parametrize("store, text", [("afile/sub", "Not a directory"), ("/proc/omnigym-store", "No such file")])
def test_a_store_that_cannot_be_made_is_one_line(store, text, tmp_path, capsys, monkeypatch):
    """It was a NotADirectoryError (or FileNotFoundError) traceback."""
    from serve_helpers import free_port

    (tmp_path / "afile").write_text("x")
    line = one_line(capsys, ["--base-model", "tiny", "--store", store, "--port", str(free_port())], tmp_path, monkeypatch)
    assert f"--store {store} cannot be made or written here: {text}" in line, line


def test_port_in_use_one_line(base, tmp_path, capsys, monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line(capsys, ["--base-model", str(base), "--port", str(port)], tmp_path, monkeypatch)
    assert f"cannot listen on 127.0.0.1:{port}" in line


@pytest.mark.parametrize("damage, text", [
    ("no weights", "has no weights"),
    ("cut weights", "is damaged or incomplete"),
    ("run config", "is a ppo run's config"),
])
def test_a_base_model_that_cannot_load_is_one_line_and_no_store(damage, text, tmp_path, capsys, monkeypatch):
    from omnigym.models.lm import build_tiny_model

    model = build_tiny_model(tmp_path / "m")
    if damage == "no weights":
        (model / "model.safetensors").unlink()
    elif damage == "cut weights":
        data = (model / "model.safetensors").read_bytes()
        (model / "model.safetensors").write_bytes(data[:40])
    else:
        (model / "config.json").write_text('{"algo": "ppo"}')
    from serve_helpers import free_port

    line = one_line(capsys, ["--base-model", str(model), "--port", str(free_port())], tmp_path, monkeypatch)
    assert text in line and f"--base-model {model}" in line, line


def test_a_run_directory_is_its_model(tmp_path, base):
    from omnigym.serve.command import resolve_base

    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "model" / "config.json").write_text("{}")
    assert resolve_base(str(run)) == run / "model"
    assert resolve_base(str(base)) == base


def test_serve_command_answers_the_sdk_and_is_alone_on_its_store(tmp_path, capsys, monkeypatch):
    pytest.importorskip("omnigym.serve.hub", reason="serve/hub.py is not on this branch yet (h-hub)")
    tinker = pytest.importorskip("tinker")
    from serve_helpers import free_port

    from omnigym.models.lm import build_tiny_model

    port = free_port()
    import omnigym

    # the server process imports the same omnigym as this test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(omnigym.__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")]),
           "SERVE_KEY": "tml-test-key-0123"}
    # the built-in default: tiny, built into the store
    proc = subprocess.Popen([sys.executable, "-m", "omnigym", "serve", "--base-model", "tiny", "--port", str(port),
                             "--store", str(tmp_path / "store"), "--api-key-env", "SERVE_KEY"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        import httpx

        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() is not None else "timeout"
            time.sleep(0.3)
        sc = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key="tml-test-key-0123")
        tc = sc.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
        assert tc.model_id.endswith(":train:0")
        assert (tmp_path / "store" / "serve.db").is_file()
        built = tmp_path / "store" / "tiny"
        assert tc.get_info().model_data.tokenizer_id == str(built.resolve())
        # the same weights as omnigym's tiny model of seed 0 (every restart serves the same base)
        reference = build_tiny_model(tmp_path / "reference", max_positions=2048, seed=0)
        assert (built / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()
        sc.close("success").result(timeout=10)  # its heartbeats would outlive the server
        # a second server on the store marked the first one's pending requests failed as it opened it
        before = sorted(p.name for p in (tmp_path / "store").iterdir())
        line = one_line(capsys, ["--base-model", "tiny", "--port", str(free_port()), "--store", str(tmp_path / "store")],
                        tmp_path, monkeypatch)
        assert f"--store {tmp_path / 'store'} is in use by another omnigym process (pid {proc.pid}: " in line, line
        assert sorted(p.name for p in (tmp_path / "store").iterdir()) == before
    finally:
        proc.terminate()
        proc.wait(timeout=30)
