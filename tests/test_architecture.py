"""The shape of the package: no import cycles, no algorithm importing another, library
calls that leave the caller's process as they found it."""

import ast
import random
from pathlib import Path

import numpy as np
import torch

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "omnigym"


def module_imports() -> dict[str, set[str]]:
    """Every omnigym module and the omnigym modules it imports, at any depth of the file
    (imports inside functions count: they cycle at run time just the same)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                candidates = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for candidate in candidates:
                target = resolve(candidate)
                # a submodule importing its package's __init__ is an edge like any other: the
                # package importing that submodule back is a cycle (rewards <-> rewards.text was)
                if target and target != name:
                    targets.add(target)
        edges[name] = targets
    return edges


def test_no_import_cycles():
    edges = module_imports()
    assert len(edges) > 40  # the walk found the package

    def reaches(start: str, goal: str) -> bool:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                stack.extend(edges[node])
        return False

    cycles = sorted(f"{a} -> {b}" for a in edges for b in edges[a] if reaches(b, a))
    assert cycles == []


def test_no_algorithm_imports_another():
    edges = module_imports()
    algorithms = {m for m in edges if m.startswith(("omnigym.algos.control.", "omnigym.algos.lm."))}
    assert {"omnigym.algos.control.ppo", "omnigym.algos.control.reinforce", "omnigym.algos.lm.grpo"} <= algorithms
    offenders = {a: sorted(edges[a] & algorithms) for a in algorithms if edges[a] & algorithms}
    assert offenders == {}


def test_train_from_python_leaves_threads_rngs_and_plot_backend_alone(tmp_path):
    import matplotlib

    from omnigym.algos import ppo

    backend, threads = matplotlib.get_backend(), torch.get_num_threads()
    torch.set_num_threads(2)
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    try:
        ppo.train(ppo.PPOConfig(total_timesteps=512, run_dir=str(tmp_path / "run"), progress=False,
                                tensorboard=False, torch_threads=1))
        assert (tmp_path / "run" / "curve.png").exists()  # the plot was drawn ...
        assert matplotlib.get_backend() == backend  # ... without switching the process's backend
        assert torch.get_num_threads() == 2
        assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    finally:
        torch.set_num_threads(threads)  # the rest of the suite runs as conftest set it
