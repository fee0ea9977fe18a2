"""The ``[serve]`` extra: what it pins, what set-up installs, and ``omnigym serve`` without it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ ;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_serve_extra_pins_the_sdk_and_is_in_dev_and_constraints():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    serve = project["optional-dependencies"]["serve"]
    # the server speaks one SDK version's wire format: exactly that one
    assert "tinker==0.38.0" in serve
    assert {"fastapi", "uvicorn", "chz", "blobfile", "termcolor", "pyrage", "tiktoken", "cloudpickle", "pylatexenc", "sympy"} <= {_name(r) for r in serve}
    assert any("serve" in r for r in project["optional-dependencies"]["dev"])
    pinned = {_name(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert {_name(r) for r in serve} <= pinned


def test_setup_installs_the_cookbook_without_its_dependencies():
    # tinker-cookbook requires tml-renderers>=0.4.1, which the index may lack: --no-deps, after
    # the extras have brought what it imports
    setup = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=ROOT, capture_output=True, text=True)
    assert setup.returncode == 0, setup.stderr
    lines = setup.stdout.splitlines()
    extras = next(i for i, line in enumerate(lines) if '-e ".[dev]"' in line)
    cookbook = next(i for i, line in enumerate(lines) if "--no-deps" in line and "tinker-cookbook==0.6.1" in line)
    assert cookbook > extras


def test_serve_without_the_extra_is_one_line_naming_it(tmp_path):
    from omnigym import cli

    if "serve" not in Path(cli.__file__).read_text():
        pytest.skip("the `omnigym serve` command is not on this branch yet")
    # fastapi, uvicorn and tinker made unimportable, as in an environment without [serve]
    code = ("import sys\n"
            "for name in ('fastapi', 'uvicorn', 'tinker'):\n"
            "    sys.modules[name] = None\n"
            "from omnigym.cli import main\n"
            f"sys.argv = ['omnigym', 'serve', '--base-model', {str(tmp_path / 'model')!r}, '--store', {str(tmp_path / 'store')!r}]\n"
            "raise SystemExit(main())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "omnigym[serve]" in err[0], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
