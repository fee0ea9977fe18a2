import copy
import io

import numpy as np
import pytest
import torch

from omnigym.optim import Adam
from omnigym.rl.replay import ReplayBuffer
from omnigym.rl.running_stats import RunningMeanStd


class StackedEpisodes:
    """``num_envs`` fake Atari envs: 4-frame stacks of 3x3 frames whose pixels number the
    frame, episodes of random length, NEXT_STEP autoreset (the step after an episode's end
    is not a transition). Every real transition is also kept whole, keyed by its action."""

    def __init__(self, num_envs: int, stack: int = 4, seed: int = 0):
        self.rng, self.stack, self.num_envs = np.random.default_rng(seed), stack, num_envs
        self.frame_id = 0
        self.obs = np.stack([self.new_episode() for _ in range(num_envs)])
        self.autoreset = np.zeros(num_envs, dtype=bool)
        self.transitions, self.next_action = {}, 0

    def frame(self):
        self.frame_id += 1
        return np.full((3, 3), self.frame_id % 251, dtype=np.uint8)

    def new_episode(self):
        first = self.frame()  # gymnasium's FrameStackObservation pads the first stack with copies
        return np.stack([first] * (self.stack - 1) + [self.frame()])

    def step(self):
        actions = self.next_action + np.arange(self.num_envs)
        self.next_action += self.num_envs
        next_obs = np.stack([np.concatenate([o[1:], self.frame()[None]]) for o in self.obs])
        done = self.rng.random(self.num_envs) < 0.1
        valid = ~self.autoreset
        for i in np.flatnonzero(self.autoreset):
            next_obs[i] = self.new_episode()
        rewards = self.rng.normal(size=self.num_envs).astype(np.float32)
        batch = (self.obs.copy(), actions, rewards, next_obs.copy(), done & valid, valid)
        for i in np.flatnonzero(valid):
            self.transitions[int(actions[i])] = (self.obs[i].copy(), rewards[i], next_obs[i].copy(), bool(done[i]))
        self.obs, self.autoreset = next_obs, done & valid
        return batch


@pytest.mark.parametrize("num_envs,capacity", [(1, 50), (4, 64), (3, 1000)])
def test_replay_buffer_rebuilds_every_stored_transition_bit_for_bit(num_envs, capacity):
    envs = StackedEpisodes(num_envs)
    buf = ReplayBuffer(capacity, (4, 3, 3), (), obs_dtype=np.uint8, num_envs=num_envs, frame_stack=4)
    for _ in range(200):
        obs, actions, rewards, next_obs, terminated, valid = envs.step()
        buf.add(obs, actions, rewards, next_obs, terminated, valid=valid)
    assert 0 < len(buf) <= capacity
    batch = buf.sample(2000, np.random.default_rng(1))
    seen = set()
    for i, action in enumerate(batch["actions"].tolist()):
        obs, reward, next_obs, terminated = envs.transitions[action]
        assert np.array_equal(batch["obs"][i].numpy(), obs) and np.array_equal(batch["next_obs"][i].numpy(), next_obs)
        assert batch["rewards"][i].item() == reward and batch["terminated"][i].item() == terminated
        seen.add(action)
    per_env = buf.env_capacity  # each env keeps its own newest transitions
    newest = {a for e in range(num_envs) for a in sorted(a for a in envs.transitions if a % num_envs == e)[-per_env:]}
    assert seen <= newest and len(seen) > 0.8 * len(buf)  # only live transitions, most of them drawn


def test_replay_buffer_stores_each_frame_about_once():
    capacity = 10_000
    buf = ReplayBuffer(capacity, (4, 84, 84), (), obs_dtype=np.uint8, num_envs=8, frame_stack=4)
    frames = buf.frames.nbytes / (84 * 84)
    assert frames < 1.3 * capacity  # obs + next_obs whole would be 8 frames a transition
    assert buf.nbytes < 1.4 * capacity * 84 * 84


def test_replay_buffer_vector_observations_share_next_obs_and_wrap():
    buf = ReplayBuffer(4, (2,), (), num_envs=1)
    obs = np.zeros((1, 2), dtype=np.float32)
    for i in range(10):  # one episode: each next_obs is the next obs
        nxt = obs + 1
        buf.add(obs, np.array([i]), np.array([float(i)]), nxt, np.array([False]))
        obs = nxt
    assert len(buf) == 4 and buf.frames_pushed[0] == 11  # 1 reset observation + 10 next observations
    batch = buf.sample(64, np.random.default_rng(0))
    assert set(batch["actions"].tolist()) == {6, 7, 8, 9}
    assert torch.equal(batch["next_obs"], batch["obs"] + 1) and torch.equal(batch["obs"][:, 0], batch["rewards"])


def test_replay_buffer_round_trips_through_its_state_dict():
    envs = StackedEpisodes(2)
    buf = ReplayBuffer(40, (4, 3, 3), (), obs_dtype=np.uint8, num_envs=2, frame_stack=4)
    for _ in range(30):
        obs, actions, rewards, next_obs, terminated, valid = envs.step()
        buf.add(obs, actions, rewards, next_obs, terminated, valid=valid)
    copy_ = ReplayBuffer(40, (4, 3, 3), (), obs_dtype=np.uint8, num_envs=2, frame_stack=4)
    copy_.load_state_dict(copy.deepcopy(buf.state_dict()))
    a, b = buf.sample(32, np.random.default_rng(3)), copy_.sample(32, np.random.default_rng(3))
    assert all(torch.equal(a[k], b[k]) for k in a)


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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: the fused kernel's step counts live beside CUDA parameters"))])
def test_adam_resumes_from_a_checkpoint_loaded_on_the_cpu(device):
    """A checkpoint is loaded with map_location="cpu"; a CUDA run resumed from it crashed in the
    fused kernel ("state_steps is on cpu", seen resuming a --backend mjlab run on an H100)."""
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2).to(device)
    resumed_net = copy.deepcopy(net)
    x = torch.randn(8, 4, device=device)
    ours = Adam(net.parameters(), lr=1e-2)

    def step(model, opt):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()

    for _ in range(3):
        step(net, ours)
    resumed_net.load_state_dict(net.state_dict())
    saved = io.BytesIO()
    torch.save(ours.state_dict(), saved)
    saved.seek(0)
    resumed = Adam(resumed_net.parameters(), lr=1e-2)
    resumed.load_state_dict(torch.load(saved, map_location="cpu"))
    assert all(s["step"].device == p.device for p, s in resumed.state.items())
    step(net, ours)
    step(resumed_net, resumed)
    for a, b in zip(net.parameters(), resumed_net.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


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
    """The reason it exists: torch.optim.Adam's first step imports torch._dynamo (what that costs a
    CartPole run is measured in docs/benchmarks.md)."""
    import subprocess
    import sys

    probe = ("import sys, torch\nfrom omnigym.optim import Adam\nnet = torch.nn.Linear(3, 2)\nopt = Adam(net.parameters())\n"
             "net(torch.randn(2, 3)).sum().backward()\nopt.step()\nopt.zero_grad()\n"
             "Adam(net.parameters()).load_state_dict(opt.state_dict())\n"
             "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_adam_steps_without_torchs_profiler_wrapper_and_still_runs_step_hooks():
    """Adam.step skips torch.optim's per-step profiler range (as long as the fused kernel on SAC's
    networks) and zero_grad its profiler range; a registered step hook still runs."""
    net = torch.nn.Linear(3, 2)
    opt = Adam(net.parameters(), lr=1e-2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        net(torch.randn(4, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
    names = {event.name for event in prof.events()}
    assert not any(name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")) for name in names)
    assert net.weight.grad is None and opt.state[net.weight]["step"].item() == 1
    seen = []
    opt.register_step_pre_hook(lambda *_: seen.append("pre"))
    opt.register_step_post_hook(lambda *_: seen.append("post"))
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    assert seen == ["pre", "post"] and opt.state[net.weight]["step"].item() == 2


def test_running_mean_std_one_row_path_equals_the_batch_update():
    rng = np.random.default_rng(1)
    rows = rng.normal(3.0, 2.0, size=(50, 1, 4))
    fast, general = RunningMeanStd((4,)), RunningMeanStd((4,))
    for row in rows:
        fast.update(row)
        # the general formula on the same row, which update() no longer takes for one row
        batch_mean, batch_var, total = row.mean(0), row.var(0), general.count + 1
        delta = batch_mean - general.mean
        general.mean = general.mean + delta * 1 / total
        general.var = (general.var * general.count + batch_var * 1 + delta**2 * general.count * 1 / total) / total
        general.count = total
    np.testing.assert_array_equal(fast.mean, general.mean)
    np.testing.assert_array_equal(fast.var, general.var)


def test_a_run_flushes_denormals_and_a_run_inside_it_leaves_that_as_it_was():
    """run_scope flushes denormal floats (Adam's state on a dead unit is many times slower
    without: bench/denormals.py) and puts the setting back; a demo's stage is a run inside a
    run, and the outer run goes on flushing after it."""
    from omnigym.process import run_scope

    tiny = torch.tensor([1e-40])  # a float32 denormal
    assert (tiny * 1.0).item() != 0.0  # torch's default: kept
    with run_scope(1):
        assert (tiny * 1.0).item() == 0.0
        with run_scope(2):
            assert (tiny * 1.0).item() == 0.0
        assert (tiny * 1.0).item() == 0.0  # still on after the inner run
    assert (tiny * 1.0).item() != 0.0
    with pytest.raises(RuntimeError):
        with run_scope(1):
            raise RuntimeError("a failed run")
    assert (tiny * 1.0).item() != 0.0  # put back after a failure too


def test_a_run_puts_back_the_flush_a_user_set_and_reads_it_per_thread():
    """A user who turned the flush on (torch.set_flush_denormal) still has it after a run,
    and a run in another thread reads that thread's setting, not this one's."""
    import threading

    from omnigym.process import run_scope

    tiny = torch.tensor([1e-40])
    torch.set_flush_denormal(True)
    try:
        with run_scope(1):
            pass
        assert (tiny * 1.0).item() == 0.0  # the user's setting, put back
        seen = []

        def in_a_thread():  # this thread does not flush: the run there must put back "off"
            torch.set_flush_denormal(False)  # a new thread starts with its parent's setting
            with run_scope(1):
                pass
            seen.append((torch.tensor([1e-40]) * 1.0).item())

        torch.set_flush_denormal(False)
        with run_scope(2):  # this thread flushes while the other one runs
            thread = threading.Thread(target=in_a_thread)
            thread.start()
            thread.join()
            assert (tiny * 1.0).item() == 0.0  # the other thread's run left this one flushing
        assert len(seen) == 1 and seen[0] != 0.0  # not flushed (approx would take 0 for 1e-40)
        assert (tiny * 1.0).item() != 0.0  # off again: as this thread was before the run
    finally:
        torch.set_flush_denormal(False)
    assert (tiny * 1.0).item() != 0.0


def test_a_run_on_several_threads_leaves_the_flush_alone():
    """torch's OpenMP threads do not follow a thread's flush setting: a run on more than one
    thread would flush in some chunks of a tensor op and not in others (and keep doing so after
    it, in the pool threads it started). Such a run leaves the setting as it was."""
    from omnigym.process import run_scope

    tiny = torch.tensor([1e-40])
    threads = torch.get_num_threads()
    try:
        with run_scope(1, torch_threads=2):
            assert (tiny * 1.0).item() != 0.0
        with run_scope(1, torch_threads=1):
            assert (tiny * 1.0).item() == 0.0
    finally:
        torch.set_num_threads(threads)
    assert (tiny * 1.0).item() != 0.0


def test_a_replay_memory_the_machine_cannot_map_is_one_line():
    """numpy's _ArrayMemoryError was a traceback (--buffer-size 3000000 of pixels: 73.9 GiB). 10**12 frames of
    84 x 84 bytes are past any address space, whatever the kernel's overcommit."""
    import numpy as np
    import pytest

    from omnigym.errors import OmnigymError
    from omnigym.rl.replay import ReplayBuffer

    with pytest.raises(OmnigymError, match=r"--buffer-size 1,000,000,000,000: its observations alone \(.* GiB\) cannot "
                                           "be allocated on this machine; give a smaller --buffer-size"):
        ReplayBuffer(10**12, (84, 84), (), obs_dtype=np.uint8)
