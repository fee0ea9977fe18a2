import json
import subprocess
import sys

import pytest

from omnigym.cli import main


def error_line(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_unknown_env_id(capsys, tmp_path):
    line = error_line(capsys, ["train", "ppo", "--env-id", "CartPol-v1", "--run-dir", str(tmp_path)])
    assert line.startswith("omnigym: error: unknown env id 'CartPol-v1'; closest known ids: CartPole-v1, CartPole-v0")
    assert not (tmp_path / "config.json").exists()


def test_dqn_refuses_continuous_actions(capsys, tmp_path):
    line = error_line(capsys, ["train", "dqn", "--env-id", "Pendulum-v1", "--run-dir", str(tmp_path)])
    assert line.startswith("omnigym: error: DQN needs a discrete action space, but Pendulum-v1 has Box(")


def test_unwritable_run_dir(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = error_line(capsys, ["train", "ppo", "--run-dir", str(blocker / "run")])
    assert line.startswith(f"omnigym: error: cannot write to run directory {blocker / 'run'}: {blocker} is not a directory")
    assert line.endswith("choose another --run-dir")


def test_resume_without_checkpoint_starts_the_run_again(capsys, tmp_path):
    """A run killed (SIGKILL, out of memory) before its first checkpoint has nothing to resume;
    --resume starts it again from step 0 with its config, instead of 'no checkpoint' while a
    new run there was told to --resume (tests/test_faults.py kills real runs so)."""
    (tmp_path / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1", "total_timesteps": 256,
                                                      "num_envs": 2, "num_steps": 128, "plot": False}))
    assert main(["train", "ppo", "--resume", str(tmp_path), "--no-progress", "--no-tensorboard"]) == 0
    assert "has no checkpoint (its process stopped before writing the first one): starting it again from step 0" \
        in capsys.readouterr().err
    assert (tmp_path / "checkpoint.pt").exists() and len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 1


def test_resume_of_a_run_whose_checkpoint_was_lost_is_refused_and_its_log_kept(capsys, tmp_path):
    """A finished run whose checkpoint.pt was deleted was taken for a start killed before its first
    checkpoint: --resume started it again from step 0 and replaced its log."""
    run = tmp_path / "fin"
    assert main(["train", "ppo", "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "128", "--run-dir",
                 str(run), "--no-progress", "--no-tensorboard"]) == 0
    (run / "checkpoint.pt").unlink()
    log = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "1024", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run} has no checkpoint.pt, yet it finished (its curve.png is drawn at the end)" in err
    assert (run / "metrics.jsonl").read_bytes() == log and not (run / "checkpoint.pt").exists()
    # without a curve (--no-plot): a log past --checkpoint-every shows a checkpoint was written
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    (quiet / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1", "total_timesteps": 4096,
                                                   "num_envs": 2, "num_steps": 128, "plot": False,
                                                   "checkpoint_every": 1024}))
    (quiet / "metrics.jsonl").write_text("".join(json.dumps({"global_step": s}) + "\n"
                                                  for s in (512, 1024, 1536, 2048)))
    assert main(["train", "ppo", "--resume", str(quiet), "--no-progress"]) == 2
    assert "logged step 2048, two rows past --checkpoint-every 1024, after its first checkpoint" in \
        capsys.readouterr().err
    # one row past it is a start killed while it wrote that first checkpoint (tests/test_faults.py): it restarts


def test_eval_on_corrupt_checkpoint(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1"}))
    (tmp_path / "checkpoint.pt").write_bytes(b"garbage")
    line = error_line(capsys, ["eval", str(tmp_path)])
    assert "is corrupt or not an omnigym checkpoint" in line


def test_unknown_algorithm(capsys):
    line = error_line(capsys, ["train", "a3c"])
    assert line.startswith("omnigym: error: unknown algorithm 'a3c'; choose one of reinforce, ppo, dqn")


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "ppo" in out and "native" in out


def test_train_eval_plot_and_resume_from_the_shell(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "omnigym.cli"]
    train = subprocess.run(cmd + ["train", "ppo", "--total-timesteps", "2048", "--run-dir", str(run_dir)],
                           capture_output=True, text=True)
    assert train.returncode == 0, train.stderr
    assert f"learning curve: {run_dir / 'curve.png'}" in train.stderr
    assert (run_dir / "curve.png").stat().st_size > 1000
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["algo"] == "ppo" and config["total_timesteps"] == 2048

    # Resuming a finished run with a larger budget continues it from its last checkpoint.
    more = subprocess.run(cmd + ["train", "ppo", "--resume", str(run_dir), "--total-timesteps", "4096"],
                          capture_output=True, text=True)
    assert more.returncode == 0, more.stderr
    steps = [json.loads(line)["global_step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] > 3000

    evaluation = subprocess.run(cmd + ["eval", str(run_dir), "--episodes", "3"], capture_output=True, text=True)
    assert evaluation.returncode == 0, evaluation.stderr
    assert evaluation.stdout.startswith("3 episodes: mean return")

    plot = subprocess.run(cmd + ["plot", str(run_dir), str(run_dir), "--out", str(tmp_path / "p.png")],
                          capture_output=True, text=True)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_summary_keeps_two_decimals(tmp_path, capsys):
    """A return of 0.93 was shown as 0.9."""
    import re

    assert main(["train", "ppo", "--env-id", "toy_envs:SignChoiceEnv", "--total-timesteps", "512", "--run-dir",
                 str(tmp_path / "run"), "--no-progress", "--no-plot"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"final mean return \(last \d+ episodes\): -?\d+\.\d\d", last), last


def test_progress_moves_when_a_rollout_is_collected_before_the_update(tmp_path, monkeypatch):
    """On Atari one update takes long; the bar moved only after it, so it sat at 0."""
    from omnigym.algos.control import ppo
    from omnigym.track.run import Run

    events = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            pass

        def update(self, completed, **stats):
            events.append(("progress", completed))

        def close(self):
            pass

    monkeypatch.setattr(ppo, "ProgressBar", Recorder)
    monkeypatch.setattr(Run, "log", lambda self, step, metrics: events.append(("log", step)))
    ppo.train(ppo.PPOConfig(total_timesteps=512, run_dir=str(tmp_path / "run"), plot=False, tensorboard=False))
    assert events[0][0] == "progress" and events[0][1] > 0 and events[1][0] == "log"


SFT = ["train", "sft", "--batch-size", "4", "--eval-size", "20", "--eval-every", "100", "--checkpoint-every", "1",
       "--no-progress", "--no-plot", "--no-tensorboard"]


@pytest.mark.parametrize("old", [["--backend", "ddp"], ["--backend=ddp"]])
def test_backend_on_a_language_command_is_the_training_backend_for_one_release(tmp_path, capsys, old):
    """``--backend`` was the language commands' name for ``--training-backend`` (on control commands
    it is the vector-env backend, and stays): it still picks the training backend, with one line
    saying it is going."""
    assert main([*SFT, "--steps", "1", "--run-dir", str(tmp_path / "run"), *old]) == 2
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert warning == ("omnigym: warning: --backend is now --training-backend on this command; --backend will "
                       "stop working in the next release")
    assert error.startswith("omnigym: error: --training-backend ddp trains on the processes its launcher starts")
    assert not (tmp_path / "run").exists()


def test_backend_beside_training_backend_is_one_line(tmp_path, capsys):
    line = error_line(capsys, [*SFT, "--run-dir", str(tmp_path / "run"), "--backend", "local",
                               "--training-backend", "local"])
    assert line == "omnigym: error: --backend is the old name of --training-backend; give --training-backend only"
    assert not (tmp_path / "run").exists()


def test_a_language_run_saved_with_the_old_backend_key_resumes(tmp_path):
    from omnigym.algos.control.ppo import PPOConfig
    from omnigym.algos.lm.sft import SFTConfig
    from omnigym.config import config_from_dict

    run = tmp_path / "run"
    assert main([*SFT, "--steps", "1", "--run-dir", str(run)]) == 0
    config = json.loads((run / "config.json").read_text())
    config["backend"] = config.pop("training_backend")  # config.json as runs before the rename wrote it
    (run / "config.json").write_text(json.dumps(config))
    assert main(["train", "sft", "--resume", str(run), "--steps", "2"]) == 0
    assert [json.loads(line)["global_step"] for line in (run / "metrics.jsonl").read_text().splitlines()][-1] == 2
    assert config_from_dict(SFTConfig, {"backend": "ddp"}).training_backend == "ddp"
    assert config_from_dict(PPOConfig, {"backend": "sync"}).backend == "sync"  # a control run's own field


def test_a_control_run_resumes_on_the_env_backend_it_was_made_with(tmp_path, capsys):
    """Resuming used to put ``backend`` back to its default (the language runs' training backend
    is for each command to say), so a run made with ``--backend sync`` was refused as changed."""
    run = tmp_path / "run"
    flags = ["--no-progress", "--no-plot", "--no-tensorboard"]
    assert main(["train", "ppo", "--total-timesteps", "512", "--backend", "sync", "--run-dir", str(run), *flags]) == 0
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "1024"]) == 0, capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["backend"] == "sync"
