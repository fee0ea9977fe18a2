"""bench/doc_figures.py's table against the docs as they stand, without training (issue 40): each
figure's regex finds exactly one number in its page, each command is one the CLI reads (its config
builds and checks), and each metric it reads is a key omnigym's source writes."""

import importlib.util
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("doc_figures", ROOT / "bench" / "doc_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


doc_figures = load_bench()
ROWS = {row.name: row for row in doc_figures.ROWS}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_regex_finds_its_figure_once(name):
    row = ROWS[name]
    text = (ROOT / row.doc).read_text()
    for figure in row.figures:
        assert len(re.findall(figure.pattern, text)) == 1, (row.doc, figure.label)
        assert doc_figures.doc_value(figure, text) >= 0  # a number, read as the script reads it
        assert figure.which in ("first", "last") and figure.tolerance > 0


@pytest.mark.parametrize("name", sorted(ROWS))
def test_each_command_is_the_docs_and_parses(name):
    from omnigym.cli import train_config

    row = ROWS[name]
    words = shlex.split(row.command)
    assert words[:2] == ["omnigym", "train"] and "--seed" in words, row.command  # the seed written out
    module, cfg, given = train_config(words[2:] + ["--run-dir", "/tmp/never-made", *doc_figures.QUIET])
    cfg, _ = cfg.apply_preset(given)
    cfg.check()
    assert cfg.seed == int(words[words.index("--seed") + 1])


def test_each_metric_is_a_key_the_source_writes():
    source = "\n".join(path.read_text() for path in (ROOT / "src" / "omnigym").rglob("*.py"))
    for row in doc_figures.ROWS:
        for figure in row.figures:
            assert f'"{figure.metric}"' in source, (row.name, figure.metric)  # a renamed key fails here, not after a run


def test_a_regex_that_matches_twice_or_never_is_refused():
    figure = doc_figures.Figure("x", r"loss ([\d.]+)", "eval/loss", "last", 0.01)
    assert doc_figures.doc_value(figure, "held-out loss 4.62") == 4.62
    for text in ("no figure here", "loss 1.0 and loss 2.0"):
        with pytest.raises(ValueError, match="matches"):
            doc_figures.doc_value(figure, text)


def test_the_metric_reader_takes_the_first_or_last_row_with_the_key(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"global_step": 0, "eval/loss": 4.6}\n{"global_step": 1, "x": 1}\n'
                                            '{"global_step": 2, "eval/loss": 0.3}\n')
    first = doc_figures.Figure("a", "", "eval/loss", "first", 0.01)
    last = doc_figures.Figure("b", "", "eval/loss", "last", 0.01)
    assert doc_figures.metric(tmp_path, first) == 4.6 and doc_figures.metric(tmp_path, last) == 0.3
    with pytest.raises(ValueError, match="no eval/kl"):
        doc_figures.metric(tmp_path, doc_figures.Figure("c", "", "eval/kl", "last", 0.01))


def test_list_runs_nothing_and_an_unknown_row_is_one_line(capsys):
    assert doc_figures.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(row.command in listed for row in doc_figures.ROWS)
    with pytest.raises(SystemExit) as stop:
        doc_figures.main(["--only", "no_such_row"])
    assert stop.value.code == 2 and "no row no_such_row" in capsys.readouterr().err
