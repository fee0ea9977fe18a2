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


MUTABLE_CALLS = {"list", "dict", "set", "defaultdict", "Counter", "deque", "OrderedDict", "ContextVar"}
ENVIRON_WRITES = {"setdefault", "update", "pop", "clear", "__setitem__"}


def module_state() -> set[str]:
    """Every place in src/ that keeps state for the whole process: module-level mutable
    containers, ``global`` rebinding, memoizing decorators and writes to ``os.environ``, as
    ``module:name`` (or ``module:function:environ``)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) and node.value is not None else []
            value = getattr(node, "value", None)
            mutable = isinstance(value, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)) or (
                isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", None)) in MUTABLE_CALLS)
            if mutable:
                found |= {f"{module}:{t.id}" for t in targets if isinstance(t, ast.Name) and t.id != "__all__"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found |= {f"{module}:{name}" for name in node.names}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    target = decorator.func if isinstance(decorator, ast.Call) else decorator
                    if getattr(target, "attr", getattr(target, "id", None)) in ("cache", "lru_cache", "cached_property"):
                        found.add(f"{module}:{node.name}")
                for inner in ast.walk(node):
                    environ = None
                    if isinstance(inner, ast.Assign) and any(isinstance(t, ast.Subscript) and
                                                             ast.unparse(t.value) == "os.environ" for t in inner.targets):
                        environ = inner
                    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and \
                            ast.unparse(inner.func.value) == "os.environ" and inner.func.attr in ENVIRON_WRITES:
                        environ = inner
                    if environ is not None:
                        found.add(f"{module}:{node.name}:environ")
    return found


ALLOWED_PROCESS_STATE = {
    # registries: filled at import by the modules that define their entries, read-only afterwards
    "omnigym.algos.__init__:ALGORITHMS": "the algorithm registry (a name -> module table)",
    "omnigym.rewards.base:REWARDS": "the reward registry (register_reward at import)",
    "omnigym.envs.text:TEXT_ENVS": "the text-env registry (register_text_env at import)",
    "omnigym.rl.advantages:ADVANTAGE_ESTIMATORS": "the advantage registry, filled at import",
    "omnigym.rl.losses:POLICY_LOSSES": "the policy-loss registry, filled at import",
    # the command line's own process: the entry point sets it up once (quiet transformers, threads)
    "omnigym.cli:set_up_process:environ": "the omnigym command's process, never a library call's",
    # set for the time of a block and put back (vLLM reads VLLM_ENABLE_V1_MULTIPROCESSING while it is built)
    "omnigym.scoped_env:environment:environ": "scoped: restored when the block ends",
    # constants never written: the environment a Ray worker is started with
    "omnigym.runtime.ray_actors:THREAD_ENV": "Ray's runtime_env wants a dict; nothing writes it",
    # per train() call, not per process: a ContextVar that scoped_run sets and resets
    "omnigym.track.run:_current_call": "the train() call a thread is in (TrainCall), set and reset per call",
}
"""Process-wide state allowed in src/, each with the reason it is not per run. A server that
holds many runs in one process (issue 16) relies on nothing else being shared."""


def test_no_process_state_outside_the_allow_list():
    found = module_state()
    assert len(found) >= 5  # the walk sees the registries at least
    assert sorted(found - set(ALLOWED_PROCESS_STATE)) == []
    assert sorted(set(ALLOWED_PROCESS_STATE) - found) == []  # an entry whose state is gone leaves the list
