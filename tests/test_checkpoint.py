import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import load_checkpoint, save_checkpoint

DIES_MID_WRITE = """
import os, sys, torch
from omnigym.track.checkpoint import save_checkpoint
path = sys.argv[1]
save_checkpoint(path, {"step": 1, "weights": torch.arange(10)})
def dying_save(obj, f, *args, **kwargs):
    f.write(b"half a checkpoint")
    f.flush()
    os._exit(9)
torch.save = dying_save
save_checkpoint(path, {"step": 2, "weights": torch.arange(10)})
"""

SAVES_IN_A_LOOP = """
import sys, torch
from omnigym.track.checkpoint import save_checkpoint
for step in range(10_000):
    save_checkpoint(sys.argv[1], {"step": step, "weights": torch.full((1_000_000,), float(step))})
    print(step, flush=True)  # this step's checkpoint is complete
"""


def test_process_dying_mid_write_leaves_previous_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.run([sys.executable, "-c", DIES_MID_WRITE, str(path)], capture_output=True)
    assert proc.returncode == 9
    state = load_checkpoint(path)
    assert state["step"] == 1
    torch.testing.assert_close(state["weights"], torch.arange(10))


def test_sigkill_during_repeated_saves_leaves_a_whole_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.Popen([sys.executable, "-c", SAVES_IN_A_LOOP, str(path)], stdout=subprocess.PIPE, text=True)
    completed = [int(proc.stdout.readline()) for _ in range(3)]
    time.sleep(0.05)  # most likely mid-write of a later one
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert completed == [0, 1, 2] and proc.returncode == -signal.SIGKILL
    state = load_checkpoint(path)
    assert state["step"] >= completed[-1]  # no completed save is lost, and what loads is whole
    assert torch.all(state["weights"] == float(state["step"]))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(OmnigymError, match=r"no checkpoint at .*checkpoint.pt"):
        load_checkpoint(tmp_path)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"\x00not a checkpoint")
    with pytest.raises(OmnigymError, match="is corrupt or not an omnigym checkpoint"):
        load_checkpoint(tmp_path)


def test_save_leaves_no_temporary_file(tmp_path):
    save_checkpoint(tmp_path / "checkpoint.pt", {"a": 1})
    assert os.listdir(tmp_path) == ["checkpoint.pt"]
