"""``omnigym export``: the ONNX file (run by onnxruntime) and the TorchScript file (run by
``torch.jit.load``) give the actions of the checkpoint's policy as ``omnigym eval`` rebuilds it
(the algorithm's ``load_policy``), on a batch of random observations, for PPO (discrete, and
continuous with observation normalization and the action clip), SAC, TD3 and DQN; the check
can fail (a changed normalization statistic is caught, and such a file is never written); bad
input is one line with nothing written."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import test_bad_input
from omnigym.algos import dqn, ppo, reinforce, sac, td3
from omnigym.algos import config_class
from omnigym.cli import main
from omnigym.config import config_from_dict
from omnigym.envs.vector import make_vec
from omnigym.errors import OmnigymError
from omnigym.export import FORMATS, export_run, load_exported, mismatch, probe_observations, read_metadata
from omnigym.track.checkpoint import load_checkpoint

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'omnigym[export]'")
pytest.importorskip("onnxscript", reason="onnxscript is not installed: pip install 'omnigym[export]'")

QUIET = dict(progress=False, plot=False, tensorboard=False, seed=3)
RUNS = {  # tiny runs: the networks move off their initialization, which is all export needs
    "ppo-discrete": (ppo, dict(env_id="CartPole-v1", total_timesteps=512)),
    "ppo-normalized": (ppo, dict(env_id="toy_envs:SignEnv", total_timesteps=1024, normalize_obs=True)),
    "ppo-pixels": (ppo, dict(env_id="toy_envs:SidePixelEnv", total_timesteps=256)),  # uint8 frames, the CNN
    "reinforce": (reinforce, dict(env_id="CartPole-v1", total_timesteps=512, num_steps=64)),
    "sac": (sac, dict(env_id="Pendulum-v1", total_timesteps=400, learning_starts=200, batch_size=32,
                      hidden=(32, 32))),
    "td3": (td3, dict(env_id="Pendulum-v1", total_timesteps=400, learning_starts=200, batch_size=32,
                      hidden=(32, 32))),
    "dqn": (dqn, dict(env_id="CartPole-v1", total_timesteps=600, learning_starts=300, train_frequency=100,
                      gradient_steps=20, hidden=(32, 32))),
}


def trained(tmp_path, name):
    module, flags = RUNS[name]
    return module.train(module.CONFIG(run_dir=str(tmp_path / name), **QUIET, **flags))["run_dir"]


def checkpoint_policy(run_dir, components=None):
    """The run's policy as ``omnigym eval`` rebuilds it: the algorithm's ``load_policy``, greedy."""
    values = json.loads(open(f"{run_dir}/config.json").read())
    module = {"ppo": ppo, "reinforce": reinforce, "sac": sac, "td3": td3, "dqn": dqn}[values["algo"]]
    cfg = config_from_dict(config_class(module), values, "config.json")
    envs = make_vec(cfg.env_id, 1, backend="sync")
    components = components or load_checkpoint(run_dir)["components"]
    return module.load_policy(cfg, components, envs, greedy=True), envs


@pytest.mark.parametrize("name", list(RUNS))
def test_exported_files_act_as_the_checkpoint_policy(tmp_path, name):
    run_dir = trained(tmp_path, name)
    reference, envs = checkpoint_policy(run_dir)
    space = envs.single_observation_space
    obs_rms = load_checkpoint(run_dir)["components"].get("collector", {}).get("obs_rms")
    # Random observations other than the ones export checked itself on (its seed is 0).
    observations = probe_observations(space, obs_rms, n=64 if name == "ppo-pixels" else 500, seed=11)
    want = reference(observations)
    for fmt in FORMATS:
        done = export_run(run_dir, fmt, out=tmp_path / f"{name}.{fmt}")
        exported = load_exported(done["path"], fmt)
        got = exported(observations)
        assert got.shape == want.shape and got.dtype.kind == want.dtype.kind, (fmt, got.shape, got.dtype)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=fmt)
        one = exported(observations[:1])  # the batch axis is free: one row, as a robot runs it
        np.testing.assert_allclose(one, want[:1], rtol=0, atol=1e-5)
        meta = read_metadata(done["path"], fmt)
        assert meta["algorithm"] == name.split("-")[0] and meta["format"] == fmt
        assert meta["observation_space"]["shape"] == list(space.shape)
        assert meta["action_space"]["type"] == type(envs.single_action_space).__name__
        assert meta["observation_normalization"] == (obs_rms is not None)
        assert meta["action_clipping"] == name.startswith("ppo-normalized")  # only PPO on a Box clips
        assert (meta.get("opset", 0) >= 18) == (fmt == "onnx")


def test_the_onnx_file_drives_the_env_to_omnigym_evals_greedy_returns(tmp_path):
    """Closed loop: the exported file, fed the env's raw observations, scores what
    ``omnigym eval --greedy`` scores with the checkpoint (same seed, same episodes)."""
    from omnigym.runs import evaluate_run

    run_dir = trained(tmp_path, "ppo-normalized")
    policy = load_exported(export_run(run_dir, "onnx")["path"], "onnx")
    envs = make_vec("toy_envs:SignEnv", 1, backend="sync", seed=12345)
    obs, _ = envs.reset(seed=12345)
    returns = []
    while len(returns) < 5:
        obs, _, _, _, info = envs.step(policy(obs.astype(np.float32)))
        if "episode" in info and info["_episode"][0]:
            returns.append(float(info["episode"]["r"][0]))
    expected = evaluate_run(run_dir, episodes=5, greedy=True, seed=12345)
    np.testing.assert_allclose(returns, expected, atol=1e-4)
    assert np.mean(returns) > -10  # a policy that reads the sign: random play scores about -20


def test_ppo_actions_are_clipped_into_the_box_as_the_env_receives_them(tmp_path):
    """PPO's Gaussian mean is not bounded; the file clips it as rollouts and eval do."""
    from omnigym.export import build_policy

    run_dir = trained(tmp_path, "ppo-normalized")
    components = load_checkpoint(run_dir)["components"]
    components["model"]["head.mean.weight"] *= 1000  # a mean far outside [-1, 1]
    reference, envs = checkpoint_policy(run_dir, components)
    cfg = config_from_dict(ppo.PPOConfig, json.loads(open(f"{run_dir}/config.json").read()), "config.json")
    policy = build_policy("ppo", cfg, components, envs.single_observation_space, envs.single_action_space)
    observations = probe_observations(envs.single_observation_space, components["collector"]["obs_rms"])
    with torch.no_grad():
        x = torch.as_tensor(observations)
        unclipped = policy.actor(((x.double() - policy.obs_mean) / policy.obs_std).clamp(-10, 10).float()).numpy()
        clipped = policy(x).numpy()
    assert np.abs(unclipped).max() > 1.5 and np.abs(clipped).max() == 1.0
    np.testing.assert_allclose(clipped, reference(observations), rtol=0, atol=1e-5)


def test_a_changed_normalization_statistic_is_caught(tmp_path, monkeypatch):
    """The comparison above can fail: the same file against the checkpoint policy with one
    statistic moved by a fraction of its standard deviation disagrees; and export refuses to
    write a file that disagrees with the checkpoint."""
    run_dir = trained(tmp_path, "ppo-normalized")
    components = load_checkpoint(run_dir)["components"]
    obs_rms = components["collector"]["obs_rms"]
    observations = probe_observations(make_vec("toy_envs:SignEnv", 1).single_observation_space, obs_rms, seed=5)
    done = export_run(run_dir, "onnx", out=tmp_path / "policy.onnx")
    exported = load_exported(done["path"], "onnx")
    reference, _ = checkpoint_policy(run_dir)
    assert mismatch(exported, reference, observations, discrete=False) is None
    obs_rms["mean"] = obs_rms["mean"] + 0.5 * np.sqrt(obs_rms["var"])
    moved, _ = checkpoint_policy(run_dir, components)
    assert "actions differ by up to" in mismatch(exported, moved, observations, discrete=False)

    import omnigym.export

    build = omnigym.export.build_policy

    def with_moved_mean(algo, cfg, saved_components, *spaces):  # the file, built from the moved statistic
        return build(algo, cfg, components, *spaces)

    monkeypatch.setattr(omnigym.export, "build_policy", with_moved_mean)
    before = test_bad_input.snapshot(tmp_path)
    with pytest.raises(OmnigymError, match="does not reproduce the checkpoint's: actions differ by up to"):
        export_run(run_dir, "torchscript", out=tmp_path / "policy.pt")
    assert test_bad_input.snapshot(tmp_path) == before


def test_cli_writes_into_the_run_and_refuses_to_overwrite(tmp_path, capsys):
    run_dir = trained(tmp_path, "ppo-discrete")
    assert main(["export", run_dir, "--format", "torchscript"]) == 0
    assert "policy.pt" in capsys.readouterr().out
    assert load_exported(f"{run_dir}/policy.pt", "torchscript")(np.zeros((3, 4), np.float32)).shape == (3,)
    other = tmp_path / "other-run"  # another finished run, and a Minari dataset's folder
    other.mkdir()
    for name in ("config.json", "checkpoint.pt", "metrics.jsonl"):
        (other / name).write_text("{}")
    (tmp_path / "ds" / "data").mkdir(parents=True)
    (tmp_path / "ds" / "data" / "metadata.json").write_text("{}")
    (tmp_path / "ds" / "data" / "main_data.hdf5").write_text("x")
    before = test_bad_input.snapshot(tmp_path)
    for argv, message in [([], "policy.pt exists; pass --force to replace it"),
                          # --force replaced another run's checkpoint and a dataset's data file
                          (["--out", f"{other}/checkpoint.pt", "--force"], f"is one of the run {other}'s own files"),
                          (["--out", f"{tmp_path}/ds/data/main_data.hdf5", "--force"],
                           f"is a file of the Minari dataset in {tmp_path}/ds"),
                          (["--out", f"{run_dir}/config.json", "--force"], "is one of the run's own files"),
                          (["--out", f"{run_dir}/checkpoint.pt"], "is one of the run's own files"),
                          (["--out", f"{tmp_path}/no/such/policy.pt"], "no such folder"),
                          (["--out", str(tmp_path)], "is a directory; name the file to write"),
                          (["--out", f"{tmp_path}/new-folder/"], "names a folder; name the file to write"),
                          # a PPO policy under another run's own export name
                          (["--out", f"{other}/policy.onnx"], f"--out {other}/policy.onnx is inside the run {other}, "
                                                              "which this export is not of")]:
        assert main(["export", run_dir, "--format", "torchscript", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
        assert test_bad_input.snapshot(tmp_path) == before
    assert main(["export", run_dir, "--format", "torchscript", "--force"]) == 0  # replaced, atomically
    assert sorted(p.name for p in tmp_path.joinpath("ppo-discrete").iterdir() if p.name.startswith(".")) == []
    # into its own run while another process writes it (a training run, a second export): not past its lock
    from omnigym.track.lock import RunLock

    held = RunLock(Path(run_dir))
    assert held.acquire()
    try:
        assert main(["export", run_dir, "--format", "torchscript", "--force"]) == 2
        assert f"{run_dir} is in use by another omnigym process" in capsys.readouterr().err
    finally:
        held.release()


BAD = [
    (["export", "RUN", "--format", "gguf"], "unknown export format 'gguf'; choose onnx or torchscript"),
    (["export", "RUN"], "the following arguments are required: --format"),
    (["export", "LANGUAGE_RUN", "--format", "onnx"], "is a language-model grpo run; omnigym export writes the control "
                                                     "policies of ppo, reinforce, dqn, sac, td3, drq, bc, td3_bc, iql, cql runs"),
    (["export", "RUN", "--format", "onnx"], "no checkpoint at"),
    (["export", "NOT_A_RUN", "--format", "torchscript"], "is not a run directory (no config.json)"),
]


def prepare(tmp_path, argv):
    (tmp_path / "not-a-run").mkdir()
    for name, algo in (("run", "ppo"), ("language-run", "grpo")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"algo": algo, "env_id": "CartPole-v1"}))
    names = {"RUN": "run", "LANGUAGE_RUN": "language-run", "NOT_A_RUN": "not-a-run"}
    return [names.get(a, a) for a in argv]


def refused(tmp_path, capsys, argv, message):
    before = test_bad_input.snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
    assert test_bad_input.snapshot(tmp_path) == before


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    refused(tmp_path, capsys, prepare(tmp_path, argv), message)


def test_onnx_without_the_export_extra_names_it(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    refused(tmp_path, capsys, prepare(tmp_path, ["export", "RUN", "--format", "onnx"]),
            "onnxscript is not installed; install it with: pip install 'omnigym[export]'")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_full_disk_is_one_line_and_leaves_no_temporary(tmp_path, fmt):
    """A write that cannot finish (here a 4 KiB file-size limit, EFBIG, as test_disk_full plays
    ENOSPC where mounting is not permitted): one DiskFault line naming --out, exit 2, no
    ``.tmp`` left. torch.jit.save writing to a path aborted the whole process (a C++
    ``terminate``, exit 134, its temporary left); onnx.save raised a bare OSError traceback."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    run_dir = trained(tmp_path, "ppo-discrete")
    out = tmp_path / "out"
    out.mkdir()

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    done = subprocess.run([sys.executable, "-m", "omnigym", "export", run_dir, "--format", fmt, "--out",
                           str(out / "policy.bin")], capture_output=True, text=True, preexec_fn=limit,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr[-2000:]
    assert err[0].startswith(f"omnigym: error: cannot write {out / 'policy.bin'}: file too large"), err
    assert list(out.iterdir()) == []


def test_a_symlinked_out_gets_its_temporary_beside_the_link(tmp_path, monkeypatch):
    """--out a symlink (here to the run's own policy.pt, replaced with --force): the temporary
    is written beside the link and renamed over it. It was written beside the link's target,
    inside the run, and where the link sits on another file system (/dev/shm -> the run)
    os.replace failed with EXDEV, an OSError traceback."""
    import os

    from omnigym import export as export_module

    run_dir = trained(tmp_path, "ppo-discrete")
    assert main(["export", run_dir, "--format", "torchscript"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "link.pt").symlink_to(f"{run_dir}/policy.pt")
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(export_module.os, "replace", lambda a, b: (renamed.append((a, b)), real_replace(a, b)))
    assert main(["export", run_dir, "--format", "torchscript", "--out", str(elsewhere / "link.pt"), "--force"]) == 0
    assert [Path(a).parent for a, b in renamed if str(b).endswith("link.pt")] == [elsewhere]
    assert not (elsewhere / "link.pt").is_symlink()  # the link was replaced by the file, the run's file kept
    assert sorted(p.name for p in Path(run_dir).iterdir() if p.name.startswith(".")) == []


def test_an_output_written_while_the_export_ran_is_not_replaced_without_force(tmp_path, monkeypatch, capsys):
    """Two exports to one new --out at once: both pass the existence check; the second to
    finish is refused instead of replacing the first's file."""
    import omnigym.export as export

    run_dir = trained(tmp_path, "ppo-discrete")
    capsys.readouterr()  # the training's own lines
    out = tmp_path / "raced.pt"
    write = export.write_torchscript

    def another_export_finishes_first(policy, example, metadata, path):
        write(policy, example, metadata, path)
        out.write_bytes(b"the other export's file")

    monkeypatch.setattr(export, "write_torchscript", another_export_finishes_first)
    assert main(["export", run_dir, "--format", "torchscript", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists (written while this export ran); pass --force" in err[0], err
    assert out.read_bytes() == b"the other export's file"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_overwrite_sets_the_old_runs_exported_policy_aside(tmp_path, capsys):
    """--overwrite replaced the run's files but left its export: the old run's policy.pt beside the new run, taken for
    its policy (and export then refused to write the new one without --force)."""
    run_dir = trained(tmp_path, "ppo-discrete")
    assert main(["export", run_dir, "--format", "torchscript"]) == 0
    assert main(["train", "ppo", "--env-id", "CartPole-v1", "--run-dir", run_dir, "--overwrite",
                 "--total-timesteps", "256", "--no-plot", "--no-progress"]) == 0
    assert not Path(run_dir, "policy.pt").exists()
    capsys.readouterr()
    assert main(["export", run_dir, "--format", "torchscript"]) == 0
    assert "policy.pt" in capsys.readouterr().out
