"""Evaluating a language policy: held-out accuracy (greedy episodes of its env, scored by a
verifier), and sampled replies scored by rewards with their KL to a reference."""

from __future__ import annotations

import copy

import torch

from omnigym.inference.engine import SamplingParams
from omnigym.models.lm import stripped_special_tokens


def judged_env(env, reward):
    """A copy of ``env`` scored by ``reward`` (the correctness that accuracy counts)."""
    judged = copy.copy(env)
    judged.reward = reward
    return judged


@torch.no_grad()
def accuracy(judge, tokenizer, examples: list[dict], samples: list | None = None) -> float:
    """Fraction of ``examples`` whose episode, played by the generator ``judge`` (greedy, its env
    scored by the correctness reward), gets reward 1 (e.g. a correct answer). A list given as
    ``samples`` gets the first few episodes, to read (samples.jsonl)."""
    trajectories = judge.generate(examples, 1)
    if samples is not None:
        samples += [{**sample_row(t.example, tokenizer.decode(t.response_ids, skip_special_tokens=True), reward=t.reward),
                     **stripped_special_tokens(tokenizer, t.response_ids, t.loss_mask),
                     **turn_texts(tokenizer, t.response_ids, t.loss_mask), **episode_record(t.info)}
                    for t in trajectories.items[:SAMPLES_SHOWN]]
    # per episode, not per sequence: an agent episode of many requests is many sequences (one
    # that sent 1,000 made this 500.5); each example's episode counts once, so this stays in [0, 1]
    correct = {t.group_id for t in trajectories.items if t.reward >= 1.0 and not t.info.get("error")}
    return len(correct) / max(len(examples), 1)


SAMPLES_SHOWN = 4
"""replies written to samples.jsonl (and TensorBoard's text tab) at each evaluation"""


def episode_record(info: dict) -> dict:
    """What an agent episode adds to its row: each request's reply and tool calls, and why it failed."""
    return {key: info[key] for key in ("transcript", "error") if info.get(key)}


def turn_texts(tokenizer, response_ids: list[int], loss_mask: list[int]) -> dict:
    """A multi-turn episode's parts, in order, each ``{"model": text}`` (what the model wrote)
    or ``{"env": text}`` (what the env or the tool answered): in the plain completion a
    tool's output runs into the model's next reply once the template's markers are dropped.
    Nothing for a one-reply episode."""
    parts, start = [], 0
    for end in range(1, len(response_ids) + 1):
        if end == len(response_ids) or loss_mask[end] != loss_mask[start]:
            who = "model" if loss_mask[start] else "env"
            parts.append({who: tokenizer.decode(response_ids[start:end], skip_special_tokens=True).strip()})
            start = end
    return {"turns": parts} if len(parts) > 1 else {}


def sample_row(example: dict, completion: str, **scores) -> dict:
    prompt = example.get("prompt", example.get("question", ""))
    if isinstance(prompt, list):
        prompt = next((m.get("content", "") for m in reversed(prompt) if m.get("role") == "user"), "")
    return {"prompt": str(prompt), "completion": completion, **{k: round(float(v), 4) for k, v in scores.items()}}


@torch.no_grad()
def sampled_rewards(policy, reference, engine, tokenizer, examples: list[dict], prompt_ids: list[list[int]],
                    rewards: dict, params: SamplingParams, samples: list | None = None) -> dict[str, float]:
    """One sampled reply per prompt, scored by each reward (``eval/<name>``), with the mean
    sequence KL(policy || reference) of the replies (``eval/kl``: the sum over reply tokens of
    log pi - log ref, Monte-Carlo over the samples) and the mean reply length."""
    from omnigym.models.tokens import completion_logprobs, make_completion_batch

    replies = [group[0] for group in engine.generate(prompt_ids, 1, params)]
    texts = [tokenizer.decode(s.completion_ids, skip_special_tokens=True) for s in replies]
    scores = {name: torch.as_tensor(reward(texts, examples), dtype=torch.float64) for name, reward in rewards.items()}
    kept = [i for i, s in enumerate(replies) if s.completion_ids]
    kl = torch.zeros(len(replies), dtype=torch.float64)
    if kept:
        device = next(policy.parameters()).device
        batch = make_completion_batch([prompt_ids[i] for i in kept], [replies[i].completion_ids for i in kept],
                                      tokenizer.pad_token_id, device=device)
        was_training = policy.training
        policy.eval()
        log_ratio = completion_logprobs(policy, batch) - reference.run(completion_logprobs, batch)
        policy.train(was_training)
        kl[kept] = (log_ratio * batch.loss_mask).sum(1).double().cpu()
    if samples is not None:
        samples += [{**sample_row(examples[i], texts[i], **{name: v[i] for name, v in scores.items()}),
                     **stripped_special_tokens(tokenizer, replies[i].completion_ids)}
                    for i in range(min(SAMPLES_SHOWN, len(texts)))]
    return {**{f"eval/{name}": v.mean().item() for name, v in scores.items()}, "eval/kl": kl.mean().item(),
            "eval/reply_length": sum(len(s.completion_ids) for s in replies) / max(len(replies), 1)}


def heldout_rewards(cfg, run, policy, reference, engine, tokenizer, heldout: list, judges: dict, params: SamplingParams,
                    step: int) -> dict[str, float]:
    """``sampled_rewards`` on held-out ``(example, prompt ids)`` pairs, seeded by the step, with
    a few samples logged at ``step``. Training's random stream is left alone."""
    samples: list = []
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed + step)
        metrics = sampled_rewards(policy, reference, engine, tokenizer, [e for e, _ in heldout],
                                  [ids for _, ids in heldout], judges, params, samples)
    run.log_samples(step, samples)
    return metrics


def finish_sampled_run(run, cfg, policy, tokenizer, has_gold: bool, score: str, what: str) -> dict:
    """The end of a run evaluated by ``heldout_rewards``: its model folder, its curve, and the
    judge's ``eval/<score>`` (``what`` names it) and the gold reward before and after.
    ``policy``: the whole trained model (None in the other processes of a data-parallel run)."""
    from omnigym.track.files import read_metrics

    if not run.writer:
        run.close()
        return {"run_dir": str(run.dir)}
    evaluated = [r for r in read_metrics(run.dir) if f"eval/{score}" in r]
    run.export_model(policy, tokenizer)
    plot_path = run.close(plot=cfg.plot, metric="eval/gold_reward" if has_gold else f"eval/{score}")
    start, end = evaluated[0], evaluated[-1]
    lines = [f"run: {run.dir}  (the policy: {run.dir / 'model'})",
             f"{what} of sampled replies: {start[f'eval/{score}']:.3f} -> {end[f'eval/{score}']:.3f}  "
             f"at KL {end['eval/kl']:.2f} nats to the reference"]
    if has_gold:
        lines.append(f"gold reward (never trained on): {start['eval/gold_reward']:.3f} -> {end['eval/gold_reward']:.3f}")
    run.say(*lines)
    return {"run_dir": str(run.dir), "score_before": start[f"eval/{score}"], "score_after": end[f"eval/{score}"],
            "gold_before": start.get("eval/gold_reward"), "gold_after": end.get("eval/gold_reward"),
            "kl": end["eval/kl"], "plot": str(plot_path) if plot_path else None}
