"""bench/same_seed.py, issue 39's proof that a refactor changed no numbers, without training: it
has small settings for every registered algorithm (it refuses to run otherwise, which it did for
four algorithms added after it), and each row's flags are ones that algorithm's CLI reads."""

import importlib.util
import sys
from pathlib import Path

import pytest

from omnigym.algos import ALGORITHMS
from omnigym.cli import train_config

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("same_seed", ROOT / "bench" / "same_seed.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


same_seed = load_bench()
FLAGS = same_seed.train_args(Path("/unused/out"))


def test_every_registered_algorithm_has_small_settings():
    assert sorted(set(ALGORITHMS) - set(FLAGS)) == []


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_each_rows_flags_are_read_by_its_cli(name):
    _, cfg, given = train_config([name, "--run-dir", "/unused/run", *same_seed.COMMON, *FLAGS[name]])
    typed = {arg[2:].replace("-", "_") for arg in FLAGS[name] if arg.startswith("--")}
    assert cfg.seed == same_seed.SEED and typed <= set(given), typed - set(given)


def test_a_row_runs_after_the_rows_it_reads():
    order = same_seed.plan(Path("/unused/out"), ["distill", "dpo", "iql"], sorted(ALGORITHMS))
    for name, needs in same_seed.NEEDS.items():
        for need in needs if name in order else ():
            assert order.index(need) < order.index(name), (need, name)
    assert {"grpo", "sft", "pairs", "dataset"} <= set(order)


def test_an_unknown_row_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(SystemExit, match="unknown row"):
        same_seed.run(tmp_path / "out", ["nosuch"])
    assert not (tmp_path / "out").exists()
