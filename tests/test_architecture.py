"""The shape of the package: packages in the layers docs/architecture.md declares, no import
cycles, no algorithm importing another, library calls that leave the caller's process as they
found it."""

import ast
import random
import re
from pathlib import Path

import numpy as np
import torch

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "omnigym"
ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def source_modules() -> dict[str, tuple[Path, str]]:
    """Every omnigym module's name, file and text."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = (path, path.read_text())
    return modules


def module_imports(modules: dict[str, tuple[Path, str]] | None = None, lines: bool = False):
    """Every omnigym module and the omnigym modules it imports, at any depth of the file
    (imports inside functions count: they cycle at run time just the same). With ``lines``,
    each target maps to the first line that imports it."""
    modules = source_modules() if modules is None else modules

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = {}
    for name, (path, text) in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = {}
        for node in ast.walk(ast.parse(text)):
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
                    targets[target] = min(targets.get(target, node.lineno), node.lineno)
        edges[name] = targets if lines else set(targets)
    return edges



def reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    """Whether ``goal`` can be reached from ``start`` along ``edges``."""
    seen, stack = set(), [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(edges.get(node, ()))
    return False


def test_no_import_cycles():
    edges = module_imports()
    assert len(edges) > 40  # the walk found the package

    cycles = sorted(f"{a} -> {b}" for a in edges for b in edges[a] if reaches(edges, b, a))
    assert cycles == []


def test_no_algorithm_imports_another():
    edges = module_imports()
    algorithms = {m for m in edges if m.startswith(("omnigym.algos.control.", "omnigym.algos.lm."))}
    assert {"omnigym.algos.control.ppo", "omnigym.algos.control.reinforce", "omnigym.algos.lm.grpo"} <= algorithms
    offenders = {a: sorted(edges[a] & algorithms) for a in algorithms if edges[a] & algorithms}
    assert offenders == {}


# --- layers -----------------------------------------------------------------------------------

def declared_layers() -> list[str]:
    """The packages of docs/architecture.md's layer table, bottom row first: the one place the
    order is written down."""
    text = ARCHITECTURE.read_text()
    table = text[text.index("## Layers"):text.index("\n## ", text.index("## Layers") + 1)]
    rows = re.findall(r"^\| [a-z][a-z ]* \| `([\w.]+)` \|", table, re.M)
    assert len(rows) == len(set(rows)), "a package is in the layer table twice"
    return rows


def package_of(module: str) -> str:
    """``omnigym.envs.goal`` -> ``envs``; ``omnigym.cli`` -> ``cli``; the root ``__init__`` -> ``omnigym``."""
    return module.split(".")[1] if "." in module else module


def package_edges(modules=None) -> dict[tuple[str, str], list[str]]:
    """Package -> package imports, each with the ``module:line`` sites that make it."""
    found = {}
    for source, targets in module_imports(modules, lines=True).items():
        for target, line in targets.items():
            edge = (package_of(source), package_of(target))
            if edge[0] != edge[1]:
                found.setdefault(edge, []).append(f"{source}:{line}")
    return found


def upward(edges: dict, order: list[str]) -> dict[tuple[str, str], list[str]]:
    rank = {name: i for i, name in enumerate(order)}
    return {edge: sorted(sites) for edge, sites in edges.items() if rank[edge[1]] > rank[edge[0]]}


PENDING_UPWARD: dict[tuple[str, str], str] = {}
"""Upward package edges that are known and not yet removed, each with what it is and the way
out. Any other upward edge fails the test, and so does an entry here that has gone."""


def test_every_package_is_in_the_layer_table_once():
    packages = {package_of(m) for m in source_modules()}
    assert len(packages) > 20  # the walk found the package
    assert sorted(packages - set(declared_layers())) == []  # a new package gets a row
    assert sorted(set(declared_layers()) - packages) == []  # a removed one loses it


def test_no_package_imports_one_above_it():
    """Every import in src/, lazy ones included, goes to a package on a lower row of the table."""
    found = upward(package_edges(), declared_layers())
    unexpected = {f"{a} -> {b}": sites for (a, b), sites in found.items() if (a, b) not in PENDING_UPWARD}
    assert unexpected == {}
    assert sorted(set(PENDING_UPWARD) - set(found)) == []  # a fixed edge leaves the pending list


def test_the_layer_check_sees_an_upward_import_inside_a_function():
    """The check fails for the right reason: a lazy import of algos from models is caught, with
    its line, and the same import at the right layer is not."""
    modules = source_modules()
    lazy = "def f():\n    x = 1\n    from omnigym.algos import get_algorithm\n    return get_algorithm\n"
    modules["omnigym.models.upward"] = (PACKAGE / "models" / "upward.py", lazy)
    modules["omnigym.export_too"] = (PACKAGE / "export_too.py", lazy)
    order = declared_layers() + ["export_too"]
    found = upward(package_edges(modules), order)
    assert found[("models", "algos")] == ["omnigym.models.upward:3"]
    assert ("export_too", "algos") not in found


def test_no_package_level_cycle():
    """Beyond the pending edges (which close the cycles they are pending for), packages form no
    cycle; the layer order rules one out, and this says which packages if the table is bypassed."""
    edges = {}
    for (a, b) in package_edges():
        if (a, b) not in PENDING_UPWARD:
            edges.setdefault(a, set()).add(b)

    assert sorted(f"{a} -> {b}" for a in edges for b in edges[a] if reaches(edges, b, a)) == []


def test_the_map_names_every_package_and_command():
    """docs/architecture.md names every package and top-level module, and every command the
    CLI dispatches."""
    from omnigym.cli import COMMANDS

    text = ARCHITECTURE.read_text()
    packages = {package_of(m) for m in source_modules()}
    assert sorted(p for p in packages if f"`{p}`" not in text) == []
    subpackages = {path.parent.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("__init__.py")
                   if path.parent != PACKAGE}
    assert "envs/locomotion" in subpackages
    assert sorted(p for p in subpackages if p.split("/")[-1] + "/" not in text and f"`{p}`" not in text) == []
    assert len(COMMANDS) >= 10
    assert sorted(c for c in COMMANDS if f"`{c}`" not in text and f"omnigym {c}" not in text) == []


def test_every_command_is_dispatched_and_in_the_help():
    from omnigym.cli import COMMANDS, USAGE, handlers

    assert list(handlers(None)) == list(COMMANDS)
    assert sorted(c for c in COMMANDS if f"omnigym {c} " not in USAGE) == []


def test_an_lm_run_directory_is_told_from_its_config_as_the_registry_would():
    """models/lm.py tells a run that writes ``model/`` from its config (``training_backend``)
    without the algorithm registry, which is above it: the two must agree for every algorithm."""
    import dataclasses

    from omnigym.algos import ALGORITHMS, get_algorithm

    disagree = [name for name in ALGORITHMS if get_algorithm(name).CONFIG.FINAL_MODEL !=
                ("training_backend" in {f.name for f in dataclasses.fields(get_algorithm(name).CONFIG)})]
    assert disagree == []
    # and the refusal of a run without a model/ names every algorithm whose runs have one
    from omnigym.models.lm import MODEL_RUNS

    named = set(MODEL_RUNS.replace(" or ", ", ").split(", "))
    assert named == {name for name in ALGORITHMS if get_algorithm(name).CONFIG.FINAL_MODEL}


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
    # a measurement of the machine, not of a run: the row count from which the CPU's BLAS rounds a row
    # alike, per weight shape (serve's batched sampling pads smaller products to it)
    "omnigym.serve.multilora:_THRESHOLDS": "the BLAS kernel's row threshold per shape, the same for every run",
    # MuJoCo's warning handler is one per process (mju_user_warning): the warnings it has printed once
    "omnigym.envs.vector:_MUJOCO_WARNED": "MuJoCo's own warnings already printed; its handler is process-wide",
    # a measurement of a game, not of a run: a deep search's probe is taken once per game and depth
    "omnigym.envs.games.turn_env:_DEPTHS_TRIED": "search depths already found fast enough for a game's settings",
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
