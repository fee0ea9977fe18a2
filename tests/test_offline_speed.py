"""IQL's one backward of its three summed losses takes the same step as CORL's three backward
passes and three optimizer steps in turn."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

minari = pytest.importorskip("minari")

from omnigym.algos import bc, iql, td3_bc  # noqa: E402
from omnigym.runs import collect  # noqa: E402

SMALL = {"hidden": (32, 32), "batch_size": 16, "eval_every": 4, "log_every": 2, "eval_episodes": 1,
         "checkpoint_every": 4, "progress": False, "plot": False, "tensorboard": False}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("minari")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        collect(["random"], 3, "pendulum/random-v0", env_id="Pendulum-v1", seed=1, ref_max_score=-150.0,
                reference_episodes=2)
    return root


@pytest.fixture(autouse=True)
def datasets_path(datasets, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))


def capture_first_update(monkeypatch, module, cfg):
    """Train ``module`` for one step, handing back its ``update``, its components as they were
    before that step and the batch it took."""
    seen = {}
    original = module.train_offline

    def capturing(cfg, name, run, data, evaluator, components, update, act):
        def first(batch, step):
            if step == 0:
                seen.update(before=copy.deepcopy({k: v for k, v in components.items()
                                                  if isinstance(v, torch.nn.Module)}), batch=batch)
            return update(batch, step)

        seen["components"] = components
        return original(cfg, name, run, data, evaluator, components, first, act)

    monkeypatch.setattr(module, "train_offline", capturing)
    module.train(cfg)
    return seen


def test_iqls_one_backward_steps_as_corls_three_updates(monkeypatch, tmp_path):
    """CORL's order: V's loss, backward and Adam step; then Q's (toward r + gamma V(s') with V(s')
    taken before V's step), the target networks; then the actor's with the advantage of before
    V's step. Replayed here on copies of the networks as they were before step 1: the same
    gradients and the same parameters after the step."""
    cfg = iql.CONFIG(dataset="pendulum/random-v0", seed=3, total_timesteps=1, run_dir=str(tmp_path / "run"),
                     **SMALL)
    seen = capture_first_update(monkeypatch, iql, cfg)
    nets, batch = seen["before"], seen["batch"]
    start = copy.deepcopy(nets)
    vf, qf, qf_target, actor = nets["vf"], nets["qf"], nets["qf_target"], nets["actor"]
    adam = {name: torch.optim.Adam(nets[name].parameters(), lr=cfg.learning_rate) for name in ("vf", "qf", "actor")}
    obs, actions = batch["obs"], batch["actions"]
    with torch.no_grad():
        target_q, next_v = qf_target(obs, actions).min(0).values, vf(batch["next_obs"])
    advantage = target_q - vf(obs)
    adam["vf"].zero_grad()
    iql.expectile_loss(advantage, cfg.expectile).backward()
    adam["vf"].step()
    target = batch["rewards"] + cfg.gamma * (1.0 - batch["terminated"]) * next_v
    q = qf(obs, actions)
    adam["qf"].zero_grad()
    ((F.mse_loss(q[0], target) + F.mse_loss(q[1], target)) / 2).backward()
    adam["qf"].step()
    with torch.no_grad():
        for t, p in zip(qf_target.parameters(), qf.parameters()):
            t.copy_((1 - cfg.tau) * t + cfg.tau * p)
    weights = torch.exp(cfg.beta * advantage.detach()).clamp(max=cfg.exp_adv_max)
    adam["actor"].zero_grad()
    (-(weights * actor.log_prob(obs, actions)).mean()).backward()
    adam["actor"].step()
    trained = seen["components"]
    for name in ("vf", "qf", "actor"):  # each network's gradient is its own loss's (Adam's first step alone is ~ its sign)
        for expected, actual in zip(nets[name].parameters(), trained[name].parameters()):
            torch.testing.assert_close(actual.grad, expected.grad, rtol=1e-5, atol=1e-7, msg=name)
    for name in ("vf", "qf", "qf_target", "actor"):
        for (key, expected), actual in zip(nets[name].state_dict().items(), trained[name].state_dict().values()):
            torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7, msg=f"{name}.{key}")
    for name in ("vf", "qf", "qf_target", "actor"):  # the step moved every network
        assert not all(torch.equal(a, b) for a, b in zip(start[name].parameters(), nets[name].parameters())), name


def losses_of(algo: str, tmp_path, name: str, **flags) -> tuple[list[dict], dict]:
    """Four gradient steps of ``algo`` (losses logged every two), and its components after them."""
    module = {"iql": iql, "td3_bc": td3_bc, "bc": bc}[algo]
    cfg = module.CONFIG(dataset="pendulum/random-v0", seed=3, total_timesteps=4, run_dir=str(tmp_path / name),
                        **{**SMALL, "eval_every": 4, "hidden": (64, 64)}, **flags)
    seen = {}
    original = module.train_offline

    def keeping(cfg, name, run, data, evaluator, components, update, act):
        seen.update(components)
        return original(cfg, name, run, data, evaluator, components, update, act)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "train_offline", keeping)
        module.train(cfg)
    lines = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
    return [{k: v for k, v in line.items() if k.startswith("losses/")} for line in lines], seen


@pytest.mark.parametrize("algo", ["iql", "td3_bc", "bc"])
def test_bf16_takes_its_products_in_bf16_and_keeps_float32_weights(algo, tmp_path):
    """``--precision bf16``: the same steps as float32's to bf16's rounding (each loss within 5%
    after two and four steps from the same seed and batches), not the same numbers (the products
    did run in bf16), and the weights and optimizer state still float32."""
    fp32, _ = losses_of(algo, tmp_path, "fp32")
    bf16, components = losses_of(algo, tmp_path, "bf16", precision="bf16")
    assert [sorted(line) for line in bf16] == [sorted(line) for line in fp32] and len(fp32) == 2
    differs = False
    for ours, theirs in zip(bf16, fp32):
        for key, value in ours.items():
            assert value == pytest.approx(theirs[key], rel=0.05, abs=1e-3), key
            differs |= value != theirs[key]
    assert differs
    for part in components.values():
        if isinstance(part, torch.nn.Module):
            assert {p.dtype for p in part.parameters()} == {torch.float32}
        elif isinstance(part, torch.optim.Optimizer):
            assert {t.dtype for state in part.state.values() for t in state.values() if t.dim()} == {torch.float32}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["iql", "td3_bc"])
def test_compile_gives_eagers_steps(algo, tmp_path):
    """``--compile``: the update's forward and losses compiled (TD3+BC's two: the critics' and,
    every other step, the actor's) give eager's losses to float rounding (fused kernels sum in
    another order), and train the same networks."""
    eager, eager_parts = losses_of(algo, tmp_path, "eager")
    compiled, compiled_parts = losses_of(algo, tmp_path, "compiled", compile=True)
    assert [sorted(line) for line in compiled] == [sorted(line) for line in eager]
    for ours, theirs in zip(compiled, eager):
        for key, value in ours.items():
            assert value == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    for name, network in eager_parts.items():
        if isinstance(network, torch.nn.Module):
            for ours, theirs in zip(compiled_parts[name].parameters(), network.parameters()):
                torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_a_compiler_that_does_not_build_is_one_line_and_leaves_no_run(tmp_path, datasets):
    """check_compiler finds CXX on PATH; when it cannot build (here /bin/false), the first compiled
    step says so in one line and the run directory goes."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "CXX": "/bin/false", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "MINARI_DATASETS_PATH": str(datasets), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "omnigym", "train", "bc", "--dataset", "pendulum/random-v0",
                           "--total-timesteps", "4", "--hidden", "8", "--compile", "--run-dir", str(tmp_path / "run"),
                           "--no-progress"], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith(("omnigym:", "Traceback"))]
    assert len(errors) == 1 and errors[0].startswith("omnigym: error: --compile could not build the update (")
    assert errors[0].endswith("fix the C++ compiler or leave --compile off (--no-compile on a resume)")
    assert not (tmp_path / "run").exists()
