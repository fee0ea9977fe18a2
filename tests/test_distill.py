"""train distill (on-policy distillation): each generated token's advantage is the teacher's log-prob
of it less the student's, a few steps move the student and lower its reverse KL to the teacher on
fixed prompts, an interrupted run resumes to the same metrics, and bad input (no teacher, a missing
one, the student itself, another tokenizer) is one line with no run directory written."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402

from omnigym.algos import distill  # noqa: E402
from omnigym.algos.lm.distill import token_advantages  # noqa: E402
from omnigym.cli import main  # noqa: E402
from omnigym.models.lm import build_tiny_model  # noqa: E402
from omnigym.pipelines import distill_demo  # noqa: E402
from omnigym.track.run import Run  # noqa: E402

SMALL = dict(hidden=32, layers=1, heads=2, max_positions=64)
QUESTIONS = [("What is 12 + 34?", "46"), ("What is 7 + 58?", "65"), ("What is 90 + 9?", "99"),
             ("What is 41 + 41?", "82"), ("What is 3 + 76?", "79"), ("What is 55 + 20?", "75")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A small untrained student, and a teacher of another seed whose final norm is scaled by 4, so
    that its next-token distributions are far sharper than the student's (a reverse KL to close)."""
    import transformers

    root = tmp_path_factory.mktemp("models")
    student = build_tiny_model(root / "student", seed=0, **SMALL)
    teacher = build_tiny_model(root / "teacher", seed=1, **SMALL)
    model = transformers.AutoModelForCausalLM.from_pretrained(teacher)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    model.save_pretrained(teacher)
    other = build_tiny_model(root / "other_tokenizer", seed=1, **SMALL)  # one token more in its vocabulary
    tokenizer = transformers.AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<extra>"])
    tokenizer.save_pretrained(other)
    model = transformers.AutoModelForCausalLM.from_pretrained(other)
    model.resize_token_embeddings(len(tokenizer))  # a model whose table holds its tokenizer's every token
    model.save_pretrained(other)
    # the teacher's tokenizer, its output table padded past it (as Qwen2.5-7B's 152,064 rows hold 151,665 tokens)
    padded = root / "padded_teacher"
    model = transformers.AutoModelForCausalLM.from_pretrained(teacher)
    model.resize_token_embeddings(model.config.vocab_size + 16)
    model.save_pretrained(padded)
    transformers.AutoTokenizer.from_pretrained(teacher).save_pretrained(padded)
    return {"student": student, "teacher": teacher, "other": other, "padded": padded}


def config(run_dir, models, **kw):
    flags = dict(model=str(models["student"]), teacher=str(models["teacher"]), steps=4, prompts_per_step=4,
                 samples_per_prompt=2, max_new_tokens=6, eval_size=8, eval_every=2, checkpoint_every=2,
                 learning_rate=1e-2, run_dir=str(run_dir), progress=False, plot=False, tensorboard=False)
    return distill.DistillConfig(**{**flags, **kw})


def metrics(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


@torch.no_grad()
def reverse_kl(student_dir, teacher_dir) -> float:
    """KL(student || teacher) of the next token, over the whole vocabulary (exact, no sampling),
    averaged over the reply positions of fixed questions as the run asks them (the chat template's
    prompt), each followed by its answer: the positions where the student's replies start and go on."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(teacher_dir)
    student, teacher = (transformers.AutoModelForCausalLM.from_pretrained(d) for d in (student_dir, teacher_dir))
    total, count = 0.0, 0
    for question, answer in QUESTIONS:
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                             tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt + tokenizer(answer, add_special_tokens=False)["input_ids"]])
        log_p, log_q = (torch.log_softmax(m(input_ids=ids).logits[0, len(prompt) - 1:], -1) for m in (student, teacher))
        total += (log_p.exp() * (log_p - log_q)).sum().item()
        count += log_p.shape[0]
    return total / count


def test_each_generated_tokens_advantage_is_the_teachers_log_prob_less_the_students():
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.1, 0.0]])
    teacher = torch.tensor([[-0.5, -4.0, -0.5], [-1.0, -2.1, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # the second reply is 2 tokens long
    assert torch.allclose(token_advantages(student, teacher, mask),
                          torch.tensor([[0.5, -2.0, 0.0], [2.0, -2.0, 0.0]]))
    # --reward-weight 0.5 with rewards 1 and 0: + 0.5 x (r - 0.5) on every generated token
    with_reward = token_advantages(student, teacher, mask, torch.tensor([1.0, 0.0]), 0.5)
    assert torch.allclose(with_reward, torch.tensor([[0.75, -1.75, 0.25], [1.75, -2.25, 0.0]]))


def test_a_few_steps_move_the_student_and_lower_its_reverse_kl_to_the_teacher(tmp_path, models):
    before = reverse_kl(models["student"], models["teacher"])
    # 6 steps of 8 prompts x 4 replies: 0.152 -> 0.134 here (seed 2: 0.136; the advantage's sign
    # flipped: 0.192, the check fails)
    summary = distill.train(config(tmp_path / "run", models, steps=6, prompts_per_step=8, samples_per_prompt=4,
                                   learning_rate=3e-3))
    after = reverse_kl(tmp_path / "run" / "model", models["teacher"])
    start, trained = (load_file(str(d / "model.safetensors")) for d in (models["student"], tmp_path / "run" / "model"))
    assert any(not torch.equal(start[k], trained[k]) for k in start)
    assert after < before, (before, after)
    rows = metrics(tmp_path / "run")
    steps = [r for r in rows if "distill/reverse_kl" in r]
    assert len(steps) == 6 and all(r["distill/reverse_kl"] > 0 for r in steps)
    assert [r["global_step"] for r in rows if "eval/accuracy" in r] == [1, 3, 5, 6]
    assert summary["reverse_kl_first"] == steps[0]["distill/reverse_kl"]
    # a finished run's directory teaches as its model/ folder
    assert distill.teacher_folder(config(tmp_path / "unused", models, teacher=str(tmp_path / "run"))) == str(tmp_path / "run" / "model")


def test_ppo_clip_and_a_reward_term_train_too(tmp_path, models):
    distill.train(config(tmp_path / "run", models, steps=2, loss="ppo_clip", ppo_epochs=2, reward_weight=1.0))
    rows = [r for r in metrics(tmp_path / "run") if "losses/clip_fraction" in r]
    assert len(rows) == 2 and all(0.0 <= r["losses/clip_fraction"] <= 1.0 for r in rows)


def cut_at_step_3(monkeypatch, cfg) -> None:
    """Train ``cfg`` until a Ctrl-C at step 3's log, after the checkpoint at step 2."""
    original, calls = Run.log, {"n": 0}

    def interrupting_log(self, step, values):
        original(self, step, values)
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(Run, "log", interrupting_log)
    with pytest.raises(KeyboardInterrupt):
        distill.train(cfg)
    monkeypatch.setattr(Run, "log", original)


def test_an_interrupted_run_resumes_to_the_same_metrics(tmp_path, models, monkeypatch):
    distill.train(config(tmp_path / "whole", models))
    cut_at_step_3(monkeypatch, config(tmp_path / "cut", models))
    distill.train(config(tmp_path / "cut", models, resume=str(tmp_path / "cut")))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def test_a_teacher_retrained_in_place_is_refused_on_resume(tmp_path, models, monkeypatch, capsys):
    """The path was the same, so the resume went on in silence with another teacher under the run's
    numbers. Its weights are recorded when the run starts (a sampled fingerprint); the resume with the
    teacher put back goes on."""
    import shutil

    teacher = tmp_path / "teacher"
    shutil.copytree(models["teacher"], teacher)
    cut_at_step_3(monkeypatch, config(tmp_path / "cut", {**models, "teacher": teacher}))
    kept = teacher / "model.safetensors.kept"
    shutil.move(teacher / "model.safetensors", kept)
    shutil.copy(models["student"] / "model.safetensors", teacher / "model.safetensors")  # "retrained"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "cut").rglob("*")}
    assert main(["train", "distill", "--resume", str(tmp_path / "cut")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--teacher {teacher} holds other weights than when" in err[0], err
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cut").rglob("*")} == before
    shutil.move(kept, teacher / "model.safetensors")
    assert main(["train", "distill", "--resume", str(tmp_path / "cut")]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--model", "{other}"], "--model {other} does not share the demo teacher's tokenizer"),
    (["--teacher", "{tmp}/no_such_model"], "--teacher {tmp}/no_such_model: no such folder"),
    (["--teacher", "{student}"], "is the student (--model {student}) itself"),
    (["--teacher", "tiny"], "--teacher tiny is an untrained model"),
    (["--teacher", "{other}"], "does not share the student's tokenizer"),
    (["--teacher", "{teacher}", "--loss", "gkd"], "unknown --loss 'gkd'"),
])
def test_bad_input_is_one_line_and_no_run_dir(tmp_path, capsys, models, argv, message):
    """(with no --teacher, the demo: a student without the tiny model's tokenizer is refused before its
    teacher trains)"""
    run_dir = tmp_path / "run"
    names = {"tmp": tmp_path, **models}
    argv = [a.format(**names) for a in argv]
    assert main(["train", "distill", "--model", str(models["student"]), *argv, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(**names) in err[0], err
    assert not run_dir.exists()


def test_with_no_teacher_the_demo_trains_one_by_grpo_as_a_stage_and_reuses_it(tmp_path, models, monkeypatch, capsys):
    """The demo's wiring on a small schedule (the real one: docs/distillation.md): GRPO trains the tiny
    teacher in stages/teacher, the student is warmed up in stages/warmup and learns from it, both
    accuracies are printed; a second run over the same directory reuses both stages and logs the
    same metrics."""
    monkeypatch.setattr(distill_demo, "TEACHER_FLAGS", dict(steps=1, sft_steps=2, sft_batch_size=4,
                                                            prompts_per_step=4, group_size=2))
    monkeypatch.setattr(distill_demo, "STUDENT_WARMUP", dict(sft_steps=2, sft_batch_size=4))
    summary = distill.train(config(tmp_path / "run", models, teacher=None, steps=2))
    stage = tmp_path / "run" / "stages" / "teacher"
    assert (stage / "model" / "config.json").is_file()
    warm_up = [r["global_step"] for r in metrics(tmp_path / "run" / "stages" / "warmup")]
    assert warm_up == [1, 2] and (tmp_path / "run" / "stages" / "warmup" / "model" / "config.json").is_file()
    assert [r["global_step"] for r in metrics(stage) if "eval/accuracy" in r] == [0, 1]  # the teacher's GRPO step
    assert {"teacher_accuracy_before", "teacher_accuracy_after", "accuracy_before", "accuracy_after"} <= set(summary)
    err = capsys.readouterr().err
    assert "demo teacher: omnigym's GRPO demo" in err and "teacher (" in err and "before distillation" in err
    first = metrics(tmp_path / "run")
    distill.train(config(tmp_path / "run", models, teacher=None, steps=2, overwrite=True))
    err = capsys.readouterr().err
    assert "demo teacher: reusing" in err and "warm-up: reusing" in err
    assert metrics(tmp_path / "run") == first


def test_the_demo_student_tiny_small_is_a_quarter_of_tiny_with_its_tokenizer_and_prompts():
    from omnigym.generators.text_tasks import task_env, text_task
    from omnigym.models.lm import load_policy_and_tokenizer

    built = {name: load_policy_and_tokenizer(name, seed=0) for name in ("tiny", "tiny-small")}
    size = {name: sum(p.numel() for p in model.parameters()) for name, (model, _) in built.items()}
    assert size["tiny-small"] < 0.3 * size["tiny"], size
    assert built["tiny"][1].get_vocab() == built["tiny-small"][1].get_vocab()
    # the teacher (tiny) was trained on prompts without a system message: the student is shown the same
    cfg = distill.DistillConfig()
    assert cfg.model == "tiny-small" and task_env(cfg, text_task(cfg)[0])[0].system_prompt is None


def test_a_saved_tiny_folder_or_its_run_is_shown_no_system_prompt_and_other_models_are(tmp_path):
    """A warmed-up tiny model saved to a folder was trained with no system prompt. GRPO or
    distillation from that folder (--model runs/x/stages/warmup/model) showed it the answer-format
    system prompt all the same, and it wrote garbage: held-out accuracy 0.02 where its own run had 0.68."""
    import shutil

    from omnigym.algos import grpo
    from omnigym.generators.text_tasks import ANSWER_FORMAT, task_env, text_task

    folder = build_tiny_model(tmp_path / "tiny")
    run = tmp_path / "run"  # a run directory: its model/ is the model
    shutil.copytree(folder, run / "model")
    (run / "config.json").write_text(json.dumps({"algo": "grpo", "model": "tiny"}))
    in_config = shutil.copytree(folder, tmp_path / "in_config")  # the template in tokenizer_config.json only
    template = (in_config / "chat_template.jinja").read_text()
    (in_config / "chat_template.jinja").unlink()
    tokenizer_config = json.loads((in_config / "tokenizer_config.json").read_text())
    (in_config / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "chat_template": template}))
    other = shutil.copytree(folder, tmp_path / "other")  # another family's template: told the format
    (other / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    cases = {"tiny-small": None, str(folder): None, str(run): None, str(in_config): None, str(other): ANSWER_FORMAT,
             "HuggingFaceTB/SmolLM2-135M-Instruct": ANSWER_FORMAT, str(tmp_path / "absent"): ANSWER_FORMAT}
    for model, shown in cases.items():
        cfg = grpo.GRPOConfig(model=model, eval_size=5)
        assert task_env(cfg, text_task(cfg)[0])[0].system_prompt == shown, model
        cfg.system_prompt = "Be brief."  # a system prompt given is shown, to any model
        assert task_env(cfg, text_task(cfg)[0])[0].system_prompt == "Be brief.", model


def test_a_built_in_untrained_student_is_warmed_up_before_it_distills(tmp_path, models, monkeypatch):
    """(its random characters do not learn the answer format from the teacher's grades: docs/distillation.md)"""
    monkeypatch.setattr(distill_demo, "STUDENT_WARMUP", dict(sft_steps=2, sft_batch_size=4))
    distill.train(config(tmp_path / "run", models, model="tiny-small", steps=1))
    stages = tmp_path / "run" / "stages"
    assert (stages / "warmup" / "model" / "config.json").is_file() and not (stages / "teacher").exists()
    assert [r["global_step"] for r in metrics(stages / "warmup")] == [1, 2]


def test_a_teacher_whose_output_table_is_padded_past_the_tokenizer_teaches(tmp_path, models):
    """The same tokenizer with a wider output table was refused as 'does not share the student's tokenizer'
    (a 7B Qwen2.5 teaching its 0.5B: 152,064 outputs against 151,936); a token's log-prob is read at its id."""
    summary = distill.train(config(tmp_path / "run", models, teacher=str(models["padded"]), steps=2))
    assert [r["global_step"] for r in metrics(tmp_path / "run")][-1] == 2 and "accuracy_after" in summary
