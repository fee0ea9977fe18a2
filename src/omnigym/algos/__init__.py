"""One algorithm per file. ``ALGORITHMS`` maps a CLI name to its module path."""

ALGORITHMS = {
    "reinforce": "omnigym.algos.reinforce",
    "ppo": "omnigym.algos.ppo",
    "dqn": "omnigym.algos.dqn",
    "grpo": "omnigym.algos.grpo",
    "text_reinforce": "omnigym.algos.text_reinforce",
}
