import copy

import numpy as np
import torch

from omnigym.optim import Adam
from omnigym.rl.replay import ReplayBuffer
from omnigym.rl.running_stats import RunningMeanStd


def test_replay_buffer_wraps_and_skips_masked_rows():
    buf = ReplayBuffer(3, (2,), ())
    for i in range(2):
        obs = np.full((2, 2), i, dtype=np.float32)
        buf.add(obs, np.array([i, i]), np.array([1.0, 2.0]), obs + 1, np.array([False, True]),
                valid=np.array([True, i == 1]))
    assert len(buf) == 3
    assert buf.position == 0
    assert sorted(buf.obs[:, 0].tolist()) == [0.0, 1.0, 1.0]
    batch = buf.sample(16, np.random.default_rng(0))
    assert batch["obs"].shape == (16, 2) and batch["terminated"].dtype == torch.float32


def test_replay_buffer_batch_longer_than_the_buffer_keeps_its_last_rows():
    buf = ReplayBuffer(3, (1,), ())
    buf.add(np.zeros((1, 1)), np.array([0]), np.array([0.0]), np.zeros((1, 1)), np.array([False]))
    obs = np.arange(5, dtype=np.float32)[:, None]
    buf.add(obs, np.arange(5), np.arange(5.0), obs + 1, np.zeros(5, dtype=bool))
    assert len(buf) == 3 and buf.position == 0  # 1 + 5 rows written into 3: the last write ends at row 2
    assert buf.obs[:, 0].tolist() == [2.0, 3.0, 4.0] and buf.actions.tolist() == [2, 3, 4]


def test_adam_matches_torch_optim_adam_and_resumes():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    ref = copy.deepcopy(net)
    ours, theirs = Adam(net.parameters(), lr=1e-2, eps=1e-5), torch.optim.Adam(ref.parameters(), lr=1e-2, eps=1e-5)
    x = torch.randn(8, 4)
    for step in range(20):
        for model, opt in ((net, ours), (ref, theirs)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.param_groups[0]["lr"] = 1e-2 * (1 - step / 20)
            opt.step()
        if step == 9:  # a save/load round trip in the middle changes nothing
            state = copy.deepcopy(ours.state_dict())
            ours = Adam(net.parameters(), lr=0.0)
            ours.load_state_dict(state)
    for a, b in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 3))
    rms = RunningMeanStd((3,))
    for chunk in np.split(data, 10):
        rms.update(chunk)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-3)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-3)


def test_adam_is_a_torch_optimizer_with_torch_adams_state_layout():
    net = torch.nn.Linear(3, 2)
    ours = Adam([{"params": [net.weight], "lr": 1e-2}, {"params": [net.bias], "lr": 1e-3}])
    assert isinstance(ours, torch.optim.Optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(ours, lambda step: 0.5 ** step)
    net(torch.randn(4, 3)).sum().backward()
    ours.step()
    scheduler.step()
    assert [g["lr"] for g in ours.param_groups] == [5e-3, 5e-4]
    theirs = torch.optim.Adam([{"params": [net.weight]}, {"params": [net.bias]}])
    theirs.load_state_dict(ours.state_dict())  # a checkpoint of ours is a checkpoint of torch.optim.Adam
    assert set(theirs.state[net.weight]) == {"step", "exp_avg", "exp_avg_sq"}


def test_adam_does_not_import_torch_dynamo():
    """The reason it exists: torch.optim.Adam's first step imports torch._dynamo (about 1 s)."""
    import subprocess
    import sys

    probe = ("import sys, torch\nfrom omnigym.optim import Adam\nnet = torch.nn.Linear(3, 2)\nopt = Adam(net.parameters())\n"
             "net(torch.randn(2, 3)).sum().backward()\nopt.step()\nopt.zero_grad()\n"
             "Adam(net.parameters()).load_state_dict(opt.state_dict())\n"
             "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
