"""Which models are shown the answer-format system prompt (models.lm.tiny_family): what a run
trains with must be what ``omnigym eval RUN`` and ``--model RUN`` show it later, which they read
from the chat template saved in the run's model/."""

import shutil

import pytest

pytest.importorskip("transformers")

from omnigym.algos import grpo  # noqa: E402
from omnigym.generators.text_tasks import ANSWER_FORMAT, task_env, text_task  # noqa: E402
from omnigym.models.lm import CHAT_TEMPLATE, build_tiny_model, tiny_family  # noqa: E402

OTHER = "{%- for m in messages -%}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{%- endfor -%}"


def shown(model, **flags):
    cfg = grpo.GRPOConfig(model=model, eval_size=5, **flags)
    return task_env(cfg, text_task(cfg)[0])[0].system_prompt


def test_a_tiny_template_ending_with_a_newline_is_the_tiny_family(tmp_path):
    """Jinja drops one trailing newline: the copy renders the very same prompts, and was told the
    format in a system prompt it never saw (held-out accuracy 0.000 where the folder had 0.100)."""
    folder = build_tiny_model(tmp_path / "tiny")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
    assert shown(str(folder)) is None
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE + "  \n")  # spaces render: another template
    assert shown(str(folder)) == ANSWER_FORMAT


def test_a_chat_template_given_decides_the_family_as_the_saved_model_will(tmp_path):
    """GRPO from a tiny folder with --chat-template OTHER trained with no system prompt, but its
    model/ carries OTHER, so its own eval showed the format: pass@1 0.000 where it trained at 0.150."""
    folder = build_tiny_model(tmp_path / "tiny")
    template_file = tmp_path / "other.jinja"
    template_file.write_text(OTHER)
    assert shown(str(folder), chat_template=str(template_file)) == ANSWER_FORMAT
    assert shown("tiny", chat_template=OTHER) == ANSWER_FORMAT
    assert shown(str(folder), chat_template=CHAT_TEMPLATE) is None
    other = shutil.copytree(folder, tmp_path / "other")
    (other / "chat_template.jinja").write_text(OTHER)
    assert shown(str(other)) == ANSWER_FORMAT and shown(str(other), chat_template=CHAT_TEMPLATE) is None
    run = tmp_path / "run"  # what eval reads back: the model saved with the template given
    shutil.copytree(other, run / "model")
    (run / "config.json").write_text('{"algo": "grpo", "model": "tiny"}')
    assert tiny_family(str(run)) is tiny_family(str(folder), str(template_file)) is False


def test_a_model_name_longer_than_a_file_name_can_be_is_one_line():
    """(ENAMETOOLONG from the run-directory check was a traceback, from task_env and from loading)"""
    from omnigym.errors import OmnigymError
    from omnigym.models.lm import resolve_model

    for name in ("x" * 300, "/tmp/" + "y" * 300 + "/model"):
        assert shown(name) == ANSWER_FORMAT
        with pytest.raises(OmnigymError, match="no such folder"):
            resolve_model(name)


def test_eval_and_sample_show_a_loaded_tiny_model_what_its_training_showed():
    """``omnigym eval RUN`` and ``sample`` decide from the loaded tokenizer's template (the run's
    starting folder may be gone). A task of questions: no system prompt, as task_env gives the tiny
    family. A registered text env keeps its own prompt, as GRPO trains with it; eval dropped it."""
    from omnigym.envs.text import TEXT_ENVS, TextEnv, register_text_env
    from omnigym.generators.text_tasks import shown_as_trained

    examples = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(8)]
    register_text_env("tiny-family-test-env", lambda: TextEnv(examples, lambda *a: 0.0, "Answer with a number."))
    try:
        for task_name, template, expected in (("tiny-family-test-env", CHAT_TEMPLATE, "Answer with a number."),
                                              ("arithmetic", CHAT_TEMPLATE, None),
                                              ("arithmetic", OTHER, ANSWER_FORMAT),
                                              ("tiny-family-test-env", OTHER, "Answer with a number.")):
            cfg = grpo.GRPOConfig(model="some/hub-id", task=task_name, eval_size=5)
            task = text_task(cfg)[0]
            shown_as_trained(cfg, task, template)
            assert task_env(cfg, task)[0].system_prompt == expected, (task_name, template)
        cfg = grpo.GRPOConfig(model="some/hub-id", eval_size=5, system_prompt="mine")
        shown_as_trained(cfg, text_task(cfg)[0], CHAT_TEMPLATE)
        assert task_env(cfg, text_task(cfg)[0])[0].system_prompt == "mine"
    finally:
        TEXT_ENVS.pop("tiny-family-test-env")
