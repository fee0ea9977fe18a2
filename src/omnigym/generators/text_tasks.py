"""What a language run plays, chosen from its flags: the task ``--task`` names, the text env
``--env`` names (with the task's examples, its reward, its system prompt, its turns), the reward
that decides correctness, and the generator that plays the env with a policy.

``omnigym train grpo`` trains on what this module selects and ``omnigym sample`` samples from
it, so a reply is sampled and scored alike in both; the flags are ``TextTaskConfig``'s, which
both commands' configs extend.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

from omnigym.config import require_positive
from omnigym.envs.task_spec import Task, load_task
from omnigym.envs.text import TextEnv, ToolEnv
from omnigym.errors import require
from omnigym.generators.text_env import TextEnvGenerator
from omnigym.inference.engine import SamplingParams
from omnigym.rewards import WeightedSum, leading_part, parse_weights
from omnigym.track.resume import reward_places

ENVS = ("single-turn", "tools", "python", "search", "guess", "tictactoe")
"""--env: python, search and guess are the registered tool envs python-v0, search-v0, guess-v0;
tictactoe the text game tictactoe-v0 (envs/text_games.py)"""
OWN_TASK = ("python", "search", "guess", "tictactoe")
"""--env values that bring their own task ({env}-v0)"""
GAMES = ("tictactoe",)
"""--env values that are two-player games (--opponent)"""
ECOSYSTEM = ("skyrl:", "vf:")
"""--env prefixes of envs written for another library (envs/skyrl.py, envs/vf.py)"""
DEFAULT_REWARDS = "math:1.0,format:0.1"
ANSWER_FORMAT = ("Solve the problem. Think briefly if you need to, then give only the final number inside answer "
                 "tags, like this: <answer>42</answer>")
"""A pretrained model is not told the answer format by anything else: without it an instruct
model answers in prose, every reward is 0 and every group is skipped."""


@dataclass
class TextTaskConfig:
    """The flags that choose the task, its env, its rewards and how replies are sampled."""

    engine: str = "auto"
    """sampler: auto (the lean KV-cache loop of kv_decode for Llama-family models, else HF generate), kv, hf,
    or vllm (the [vllm] extra, a CUDA GPU; docs/vllm.md)"""
    task: str = "arithmetic"
    """"arithmetic", "reasoning_gym:<task>" (use --rewards reasoning_gym:1.0,...), "gsm8k:<file.jsonl>",
    a registered text env id, a jsonl file with question and answer fields, module:name of your
    own task (docs/bring_your_own.md), or a HF dataset available offline"""
    digits: int = 2
    terms: int = 2
    operations: str = "+"
    system_prompt: str | None = None
    """the system message of every episode; default: none for the built-in tiny model, and for any
    other model one that states the answer format the math and format rewards read (give "" for none)"""
    env: str = "single-turn"
    """single-turn (one reply, scored); tools (the reply may call <tool name="python"> or
    <tool name="calculator"> and read the answer, up to --max-turns replies); python (a Python
    session kept across turns; its own computation task unless --task is given); search (BM25 over
    an invented world's facts), guess (a secret number, told higher or lower) or tictactoe (a game against
    --opponent, docs/text_games.md): each with its own task; skyrl:NAME (a skyrl-gym env; skyrl:MODULE:NAME for
    one MODULE registers) or vf:MODULE (a verifiers environment module): the ecosystem's envs, docs/agents.md"""
    env_args: str | None = None
    """JSON object for --env skyrl:NAME (the env's env_config, e.g. {"search_url": ...}) or --env vf:MODULE
    (load_environment's keyword arguments)"""
    max_turns: int | None = None
    """replies per episode in a multi-turn env; default 4, and 5 with --env tictactoe (a seat's moves in a game:
    fewer are refused)"""
    opponent: str | None = None
    """--env tictactoe: who plays the other seat: random (a random free cell; the default), search (minimax,
    perfect at tic-tac-toe), self (the policy: both seats sampled and trained) or snapshot (a frozen copy of the
    policy, never trained; --snapshot-every), docs/text_games.md"""
    snapshot_every: int | None = None
    """--opponent snapshot: GRPO steps between refreshes of the frozen copy from the policy (0, the default:
    the copy taken at the start plays every game)"""
    rewards: str | None = None
    """weighted rewards, name:weight,... (module:name:weight for your own); default: the task env's
    own reward, else math:1.0,format:0.1"""
    judge_rubric: str | None = None
    """the rubric file of a judge:MODEL_OR_URL reward (slots {question}, {reply}, {reference}; it asks for a
    last line 'Score: N'); default: rewards/judge.py's own (docs/judges.md)"""
    accuracy_reward: str | None = None
    """the reward that decides correctness for sft/val_accuracy and eval/accuracy (an episode is
    correct when it scores >= 1); default: the first of --rewards"""
    max_new_tokens: int = 24
    temperature: float = 1.0
    eval_size: int = 500
    """held-out problems for eval/accuracy"""

    def __post_init__(self) -> None:
        # the default follows --env: a game of tic-tac-toe needs 5 replies of a seat, and 4 refused a plain
        # `omnigym train grpo --env tictactoe`; resolved when the config is made, so what is saved, compared on
        # --resume and read by every env and generator is a number
        if self.max_turns is None:
            self.max_turns = 5 if self.env in GAMES else 4

    def check_task(self) -> None:
        require_positive(self, "max_new_tokens", "max_turns", "temperature", "eval_size")
        require(self.env in ENVS or self.env.startswith(ECOSYSTEM),
                f"--env must be one of {', '.join(ENVS)}, got {self.env!r} (or skyrl:NAME, vf:MODULE: "
                "docs/agents.md)")
        require(not (self.env.startswith(ECOSYSTEM) and self.rewards),
                f"--env {self.env} is scored by the env's own rewards; leave out --rewards")
        if self.judge_rubric is not None:  # read and checked before anything is written
            from omnigym.rewards.judge import read_rubric

            require(bool(self.rewards and "judge" in self.rewards), "--judge-rubric is for a judge:MODEL_OR_URL reward "
                    "in --rewards")
            read_rubric(self.judge_rubric)
        require(self.env_args is None or self.env.startswith(ECOSYSTEM),
                "--env-args is for --env skyrl:NAME or vf:MODULE")
        require(self.env not in OWN_TASK[1:] or self.task == "arithmetic",
                f"--env {self.env} brings its own task ({self.env}-v0); leave out --task {self.task}")
        if self.opponent is not None:
            from omnigym.envs.text_games import check_opponent

            require(self.env in GAMES, f"--opponent is for a game: --env {' or '.join(GAMES)}, not {self.env}")
            check_opponent(self.opponent)
        if self.snapshot_every is not None:
            require(self.opponent == "snapshot", "--snapshot-every is for --opponent snapshot (the frozen copy of the "
                    f"policy it refreshes), not --opponent {self.opponent or 'random'}")
            require(self.snapshot_every >= 0, "--snapshot-every must be 0 (never refresh the snapshot) or more, got "
                    f"{self.snapshot_every}")
        require(self.env not in GAMES or self.max_turns >= 5,
                f"--env {self.env}: a seat moves up to 5 times in a game; give --max-turns 5 or more "
                f"(got {self.max_turns}: a game cut short scores as a loss)")


def task_spec(cfg: TextTaskConfig) -> str:
    """What --task loads: with --env python, search or guess and no --task, that env's own task."""
    return f"{cfg.env}-v0" if cfg.env in OWN_TASK and cfg.task == "arithmetic" else cfg.task


def text_task(cfg: TextTaskConfig) -> tuple[Task, object]:
    """What --task loads, and the agent function that plays it, if any: with --env skyrl:NAME
    the task carries the skyrl env (envs/skyrl.py); --env vf:MODULE gives the env's dataset and
    its rollout as an agent function (envs/vf.py). ``cfg`` also gives the seed."""
    if cfg.env.startswith("skyrl:"):
        from omnigym.envs.skyrl import skyrl_task

        return skyrl_task(cfg, cfg.env.split(":", 1)[1]), None
    if cfg.env.startswith("vf:"):
        from omnigym.envs.vf import vf_task

        return vf_task(cfg, cfg.env.split(":", 1)[1])
    return load_task(task_spec(cfg), cfg.seed, cfg.eval_size, cfg.digits, cfg.terms, cfg.operations), None


def task_env(cfg: TextTaskConfig, task: Task):
    """The env the run plays and the reward that decides correctness for accuracy. ``cfg`` also
    gives the model (the built-in tiny one is shown no system prompt)."""
    if task.env is not None:  # a registered text env: its class, its reward unless --rewards is given
        env = copy.copy(task.env)
        env.examples = task.train
        if cfg.rewards:
            env.reward = parse_weights(cfg.rewards, cfg.judge_rubric, reward_places(cfg))
        if hasattr(env, "max_turns"):  # a multi-turn env plays the turns --max-turns gives
            env.max_turns = cfg.max_turns
        if cfg.system_prompt is not None:
            env.system_prompt = cfg.system_prompt or None
        if cfg.env in GAMES:  # self-play's and the snapshot's seats are the two-seat generator's: the env plays random
            env.opponent = cfg.opponent if cfg.opponent in ("random", "search") else "random"
    elif cfg.env == "python":  # the Python session over a task of your own, scored like the tools env
        from omnigym.envs.python_env import SYSTEM_PROMPT, PythonEnv

        system = cfg.system_prompt if cfg.system_prompt is not None else SYSTEM_PROMPT
        reward = parse_weights(cfg.rewards or DEFAULT_REWARDS, cfg.judge_rubric, reward_places(cfg))
        env = PythonEnv(task.train, reward, system or None, cfg.max_turns)
    else:
        reward = parse_weights(cfg.rewards or DEFAULT_REWARDS, cfg.judge_rubric, reward_places(cfg))
        from omnigym.models.lm import tiny_family  # the warm-up teaches them the format: no system prompt

        tiny = tiny_family(cfg.model, cfg.chat_template)  # a --chat-template given decides: the run saves it
        system = cfg.system_prompt if cfg.system_prompt is not None else None if tiny else ANSWER_FORMAT
        env = ToolEnv(task.train, reward, system or None, cfg.max_turns) if cfg.env == "tools" else \
            TextEnv(task.train, reward, system or None)
    accuracy_places = reward_places(cfg, "accuracy_reward")
    correct = WeightedSum({cfg.accuracy_reward: 1.0}, places=accuracy_places) if cfg.accuracy_reward else \
        leading_part(env.reward)
    return env, correct


def shown_as_trained(cfg: TextTaskConfig, task: Task, chat_template: str | None) -> None:
    """A loaded model (``omnigym eval RUN``, ``sample``) is shown the system prompt its training
    showed it: none for the tiny family on a task of questions, as ``task_env`` decides from the
    folder, here from the loaded tokenizer's template (the run's starting folder may be gone). A
    registered text env keeps its own prompt, as GRPO trains with it (eval dropped it)."""
    from omnigym.models.lm import tiny_template

    if cfg.system_prompt is None and task.env is None and tiny_template(chat_template or ""):
        cfg.system_prompt = ""


def make_generator(cfg: TextTaskConfig, env, engine, tokenizer, greedy: bool = False,
                   opponent=None) -> TextEnvGenerator:
    """The generator that plays ``env`` with ``engine``; ``cfg`` also gives the episode budgets
    (``runtime.episodes.EpisodeScheduleConfig``'s flags). A game's held-out judge (``greedy``)
    plays the random opponent whatever --opponent trains against, and samples its moves at
    --temperature as training does: its accuracy is the win rate ``eval/vs_random/win_rate`` of
    the policy that is trained. (A greedy player is another policy: one that imitated random
    moves plays the same cell every turn and loses every game.) --opponent self trains on both
    seats of the policy's own games; --opponent snapshot on the learner's seat of games against
    ``opponent``, the frozen snapshot's engine."""
    judge = greedy
    if cfg.env in GAMES and judge:
        env, greedy = copy.copy(env), False
        env.opponent = "random"
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, greedy=greedy)
    if cfg.env in GAMES and cfg.opponent in ("self", "snapshot") and not judge:
        from omnigym.generators.two_seat_episodes import TwoSeatGenerator

        # a run that trains nothing (omnigym sample) has no snapshot of its own: the policy is its own frozen copy
        frozen = (engine if opponent is None else opponent) if cfg.opponent == "snapshot" else None
        return TwoSeatGenerator(env, engine, tokenizer, params, frozen)
    # the held-out judge plays by the same budgets, but without the overlong penalty: it reads correctness
    return TextEnvGenerator(env, engine, tokenizer, params, max_turns=cfg.max_turns,
                            max_episode_tokens=cfg.max_episode_tokens or None,
                            overlong_buffer=0 if judge else cfg.overlong_buffer, overlap_scoring=cfg.overlap_scoring)


def remote_generator(cfg: TextTaskConfig, cwd: str) -> TextEnvGenerator:
    """What a Ray generator actor runs: the same env and a policy of the same shape, built in
    the actor (its weights come from the trainer before it samples). Paths in the flags are
    read from the trainer's working directory."""
    from omnigym.inference import make_engine
    from omnigym.models.lm import LoraSettings, load_policy_and_tokenizer

    os.chdir(cwd)
    task, _ = text_task(cfg)
    env, _ = task_env(cfg, task)
    policy, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device)
    return make_generator(cfg, env, make_engine(policy, tokenizer, cfg.engine), tokenizer)
