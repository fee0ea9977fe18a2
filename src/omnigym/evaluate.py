"""Evaluate a run's last checkpoint on fresh episodes."""

from __future__ import annotations

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import load_checkpoint
from omnigym.track.run import load_config_dict


def evaluate_run(run_dir: str, episodes: int = 10, greedy: bool = False, seed: int = 12345) -> list[float]:
    from omnigym.algos.common import config_from_dict
    from omnigym.cli import _algorithm, _config_class
    from omnigym.envs.vector import make_vec

    if episodes <= 0:
        raise OmnigymError(f"--episodes must be positive, got {episodes}")
    values = load_config_dict(run_dir)
    module = _algorithm(values.get("algo", "?"))
    if not hasattr(module, "load_policy"):
        raise OmnigymError(f"omnigym eval does not support {values['algo']} runs; their eval metrics are in metrics.jsonl")
    cfg = config_from_dict(_config_class(module), values)
    checkpoint = load_checkpoint(run_dir)
    envs = make_vec(cfg.env_id, 1, backend="sync", seed=seed)
    policy = module.load_policy(cfg, checkpoint, envs, greedy=greedy)
    returns: list[float] = []
    obs, _ = envs.reset(seed=seed)
    while len(returns) < episodes:
        obs, _, _, _, info = envs.step(policy(obs))
        if "episode" in info and info["_episode"][0]:
            returns.append(float(info["episode"]["r"][0]))
    envs.close()
    return returns
