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
                keep=np.array([True, i == 1]))
    assert len(buf) == 3
    assert buf.position == 0
    assert sorted(buf.obs[:, 0].tolist()) == [0.0, 1.0, 1.0]
    batch = buf.sample(16, np.random.default_rng(0))
    assert batch["obs"].shape == (16, 2) and batch["terminated"].dtype == torch.float32


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
