"""CQL, Cal-QL and offline -> online (``--resume-online``): CQL's logsumexp term, Cal-QL's lower
bound and returns-to-go against a hand computation; CQL and Cal-QL train, resume exactly and repeat
with the same seed; an online run starts from the offline run's networks, keeps the dataset and adds
its env steps, resumes to the same metrics and repeats with the same seed; bad input is one line."""

import json
import math

import numpy as np
import pytest
import torch

minari = pytest.importorskip("minari")

import test_bad_input  # noqa: E402
from omnigym.algos import bc, cql, iql, td3_bc  # noqa: E402
from omnigym.cli import main  # noqa: E402
from omnigym.offline.datasets import load_offline_data  # noqa: E402
from omnigym.offline.online import mixed_batch  # noqa: E402
from omnigym.rl.replay import ReplayBuffer  # noqa: E402
from omnigym.runs import evaluate_run  # noqa: E402
from omnigym.track.checkpoint import load_checkpoint  # noqa: E402
from interrupts import interrupt_at_log  # noqa: E402
from test_offline import SMALL, datasets, datasets_path  # noqa: E402,F401  (the tiny Minari datasets)
from test_reproducibility import metrics  # noqa: E402

def test_the_online_algorithms_are_those_whose_configs_take_the_online_flags():
    from omnigym.algos import ALGORITHMS, config_class, get_algorithm
    from omnigym.offline.online import ONLINE_ALGOS, OnlineFlags

    assert sorted(ONLINE_ALGOS) == sorted(name for name in ALGORITHMS
                                          if issubclass(config_class(get_algorithm(name)), OnlineFlags))


ALGOS = {"td3_bc": (td3_bc, {}), "iql": (iql, {}), "cql": (cql, {}), "cal_ql": (cql, {"calibrated": True})}


def train(name, run_dir, **extra):
    module, flags = ALGOS[name]
    cfg = module.CONFIG(**{"dataset": "pendulum/random-v0", "seed": 5, "total_timesteps": 60, "run_dir": str(run_dir),
                           **SMALL, **flags, **extra})
    return module.train(cfg)


def online(name, source, run_dir, **extra):
    module, _ = ALGOS[name]  # the dataset, the widths and --calibrated come from the offline run
    cfg = module.CONFIG(**{"resume_online": str(source), "online_steps": 100, "seed": 5, "run_dir": str(run_dir),
                           **SMALL, "eval_every": 50, **extra})
    return module.train(cfg)


def test_cql_gap_by_hand():
    """One Q-function, one state, one action of each kind; the gap is logsumexp minus Q(s, a_data)."""
    q_data = torch.tensor([[1.0]])
    q_random, q_current, q_next = torch.tensor([[[2.0]]]), torch.tensor([[[0.5]]]), torch.tensor([[[-1.0]]])
    log_pi_current, log_pi_next = torch.tensor([[-0.3]]), torch.tensor([[0.2]])
    density = math.log(0.25)  # uniform over a box of volume 4
    gap = cql.cql_gap(q_data, q_random, q_current, q_next, log_pi_current, log_pi_next, density, 1.0, True)
    expected = math.log(math.exp(2.0 - density) + math.exp(-1.0 - 0.2) + math.exp(0.5 + 0.3)) - 1.0
    assert gap.item() == pytest.approx(expected, rel=1e-6)
    plain = cql.cql_gap(q_data, q_random, q_current, q_next, log_pi_current, log_pi_next, density, 2.0, False)
    expected = 2.0 * math.log(sum(math.exp(v / 2.0) for v in (2.0, 1.0, -1.0, 0.5))) - 1.0  # the data's Q among them
    assert plain.item() == pytest.approx(expected, rel=1e-6)


def test_cal_ql_bounds_the_policys_values_by_the_return_to_go():
    q = torch.tensor([[[-5.0, 2.0], [0.0, -1.0]]])  # [n=1, batch 2, k=2]
    assert torch.equal(cql.calibrated(q, torch.tensor([-1.0, 0.5])), torch.tensor([[[-1.0, 2.0], [0.5, 0.5]]]))


def test_returns_to_go_by_hand():
    rewards, gamma = np.array([1.0, 2.0, 3.0]), 0.5
    assert cql.returns_to_go(rewards, np.zeros(3), gamma) == pytest.approx([1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3])
    terminated = np.array([0, 1, 0])  # no bootstrap past a termination
    assert cql.returns_to_go(rewards, terminated, gamma) == pytest.approx([1 + 0.5 * 2, 2, 3])
    failed = np.array([0.0, -1.0, -1.0])  # a sparse task's failure: valued as staying at -1 forever
    assert cql.returns_to_go(failed, np.zeros(3), 0.9, failure_reward=-1.0) == pytest.approx([-10.0] * 3)
    assert cql.returns_to_go(failed, np.zeros(3), 0.9, failure_reward=-2.0)[2] == pytest.approx(-1.0)


def test_reference_values_are_each_logged_episodes_returns_to_go():
    data = load_offline_data(cql.CONFIG(dataset="pendulum/random-v0"), "cql")
    references = cql.ReferenceValues(data.buffer, 0.99, sparse_reward=False, online_capacity=10)
    episodes = list(minari.load_dataset("pendulum/random-v0").iterate_episodes())
    expected = np.concatenate([cql.returns_to_go(e.rewards, e.terminations, 0.99) for e in episodes])
    assert references.offline.numpy() == pytest.approx(expected, rel=1e-5)
    index = torch.tensor([0, 199, 200, 799])  # the first and last steps of episodes
    assert references({"index": index}).numpy() == pytest.approx(expected[[0, 199, 200, 799]], rel=1e-5)
    online = ReplayBuffer(10, (3,), (1,), action_dtype=np.float32)  # online steps get theirs when the episode ends
    for t, reward in enumerate([1.0, 2.0]):
        online.add(np.full((1, 3), t, np.float32), np.zeros((1, 1)), np.array([reward]),
                   np.full((1, 3), t + 1, np.float32), np.array([False]))
        references.stepped(online, episode_over=t == 1)
        if t == 0:
            assert references.online[0] == -math.inf  # its episode is still running: no bound yet
    batch = {"index": torch.tensor([0, 1, 5]), "online": torch.tensor([True, True, False])}
    assert references(batch).numpy() == pytest.approx([1 + 0.99 * 2, 2, expected[5]], rel=1e-5)


def test_mixed_batch_takes_its_share_from_the_dataset():
    data = load_offline_data(cql.CONFIG(dataset="pendulum/random-v0"), "cql")
    live = ReplayBuffer(10, (3,), (1,), action_dtype=np.float32)
    for t in range(4):
        live.add(np.full((1, 3), 100.0 + t, np.float32), np.zeros((1, 1)), np.ones(1), np.full((1, 3), 101.0 + t,
                                                                                              np.float32), np.zeros(1))
    rng = np.random.default_rng(0)
    batch = mixed_batch(data.buffer, live, 8, 4, rng, "cpu")
    assert batch["online"].tolist() == [False] * 4 + [True] * 4
    assert (batch["obs"][4:, 0] >= 100).all() and (batch["obs"][:4].abs() < 50).all()  # standardized dataset steps
    assert (batch["index"][4:] < 4).all() and (batch["index"][:4] < 800).all()
    assert mixed_batch(data.buffer, live, 8, 0, rng, "cpu")["online"].all()


@pytest.mark.parametrize("name", ["cql", "cal_ql"])
def test_cql_training_moves_the_parameters_and_the_loss(name, tmp_path):
    train(name, tmp_path / "start", total_timesteps=1, eval_every=1)
    train(name, tmp_path / "run", total_timesteps=200, eval_every=100)
    start = load_checkpoint(tmp_path / "start")["components"]
    end = load_checkpoint(tmp_path / "run")["components"]
    for network in ("actor", "qf"):
        assert all(not torch.allclose(start[network][k], end[network][k]) for k in start[network]
                   if k.endswith("weight") or k.startswith("weights")), network
    rows = [r for r in metrics(tmp_path / "run") if "losses/qf_loss" in r]
    # the critic fits the targets: the TD loss of the last 5 logged steps is well under that of
    # the first 5 (95 -> 67 here; a single step's is noisy, 62 to 111); what the CQL term does to
    # the gap is the next test's
    td = [r["losses/td_loss"] for r in rows]
    assert len(rows) == 20 and np.mean(td[-5:]) < 0.8 * np.mean(td[:5]), td
    assert ("losses/bound_rate" in rows[-1]) == (name == "cal_ql")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["calibrated"] == (name == "cal_ql")


def test_the_cql_term_holds_the_gap_down(tmp_path):
    """CQL's term lowers the Q of actions the data did not take against those it did: with a
    weight that outweighs the TD loss, the gap of the last 5 logged steps ends below a run
    without the term (4.48 against 4.67 here; both start at 4.57, the same batches)."""
    def last_gaps(run_dir, alpha):
        train("cql", run_dir, total_timesteps=200, eval_every=100, cql_alpha=alpha)
        gaps = [r["losses/cql_gap"] for r in metrics(run_dir) if "losses/cql_gap" in r]
        assert len(gaps) == 20
        return gaps[0], np.mean(gaps[-5:])

    (held_start, held), (free_start, free) = last_gaps(tmp_path / "held", 1000.0), last_gaps(tmp_path / "free", 0.0)
    assert abs(held_start - free_start) < 0.01 and held < free - 0.1, (held, free)


def test_cql_lagrange_learns_its_weight(tmp_path):
    train("cql", tmp_path / "run", cql_lagrange=True, cql_target_action_gap=1.0)
    rows = [r for r in metrics(tmp_path / "run") if "losses/alpha_prime" in r]
    # the gap (4.4 to 4.6 here) stays above its 1.0 target, so the Lagrange weight climbs from
    # e^1 at every step (2.726, 2.734, ... 2.767 at the logged ones)
    gaps, weights = [r["losses/cql_gap"] for r in rows], [r["losses/alpha_prime"] for r in rows]
    assert len(rows) == 6 and min(gaps) > 1.0
    assert math.e < weights[0] and all(a < b for a, b in zip(weights, weights[1:])), weights


@pytest.mark.parametrize("name", ["cql", "cal_ql"])
def test_cql_same_seed_same_metrics_and_exact_resume(name, tmp_path, monkeypatch):
    train(name, tmp_path / "a")
    train(name, tmp_path / "b")
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")
    interrupt_at_log(monkeypatch, lambda: train(name, tmp_path / "cut"), n=5)
    train(name, tmp_path / "cut", resume=str(tmp_path / "cut"))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "a")




@pytest.mark.parametrize("name", list(ALGOS))
def test_online_run_starts_from_the_offline_run_and_adds_its_env_steps(name, tmp_path):
    train(name, tmp_path / "offline")
    before = test_bad_input.snapshot(tmp_path / "offline")
    result = online(name, tmp_path / "offline", tmp_path / "online")
    assert test_bad_input.snapshot(tmp_path / "offline") == before  # the offline run is never changed
    saved = json.loads((tmp_path / "online" / "config.json").read_text())
    assert saved["resume_online"] == str(tmp_path / "offline") and saved["dataset"] == "pendulum/random-v0"
    assert saved["total_timesteps"] == 100 and saved.get("calibrated", False) == (name == "cal_ql")
    state = load_checkpoint(tmp_path / "online")
    buffer = state["components"]["replay"]["buffer"]
    assert buffer["added"].tolist() == [100]  # its env steps (Pendulum: no episode ends in 100)
    rows = metrics(tmp_path / "online")
    assert [r["global_step"] for r in rows if "eval/normalized_score" in r] == [0, 50, 100]
    assert result["global_step"] == 100 and any("losses/actor_loss" in r for r in rows)
    assert len(evaluate_run(str(tmp_path / "online"), episodes=1)) == 1  # omnigym eval plays it as any run
    offline_actor, online_actor = (load_checkpoint(tmp_path / d)["components"]["actor"] for d in ("offline", "online"))
    assert all(not torch.equal(offline_actor[k], online_actor[k]) for k in offline_actor if k.endswith("weight"))
    # one online step from the offline weights stays next to them (a fresh start of another seed does not)
    online(name, tmp_path / "offline", tmp_path / "one", online_steps=1, seed=9, eval_every=1)
    train(name, tmp_path / "fresh", total_timesteps=1, seed=9, eval_every=1)
    one, fresh = (load_checkpoint(tmp_path / d)["components"]["actor"] for d in ("one", "fresh"))
    key = next(k for k in offline_actor if k.endswith("weight"))
    assert (one[key] - offline_actor[key]).abs().max() < 0.01 < (fresh[key] - offline_actor[key]).abs().max()


def test_online_run_keeps_the_dataset_in_its_batches(tmp_path, monkeypatch):
    import omnigym.offline.online as online_module

    seen = []
    original = online_module.mixed_batch

    def recording(*args, **kwargs):
        batch = original(*args, **kwargs)
        seen.append(batch["online"].float().mean().item())
        return batch

    monkeypatch.setattr(online_module, "mixed_batch", recording)
    train("cql", tmp_path / "offline")
    online("cql", tmp_path / "offline", tmp_path / "half", online_steps=5)
    online("cql", tmp_path / "offline", tmp_path / "quarter", online_steps=5, mixing_ratio=0.75)
    assert seen == [0.5] * 5 + [0.25] * 5


def test_warmup_steps_fill_the_online_buffer_before_the_first_update(tmp_path):
    """WSRL's warm-up: the first --warmup-steps env steps are played with the offline policy and
    stored, with no update (no loss logged, the networks as the offline run left them); then the
    updates start, from the online buffer only with --mixing-ratio 0."""
    train("td3_bc", tmp_path / "offline")
    online("td3_bc", tmp_path / "offline", tmp_path / "warm", online_steps=4, warmup_steps=4 - 1, log_every=1,
           mixing_ratio=0.0)
    rows = {r["global_step"]: r for r in metrics(tmp_path / "warm")}
    assert [s for s in (1, 2, 3, 4) if "losses/qf_loss" in rows[s]] == [4]
    state = load_checkpoint(tmp_path / "warm")
    assert state["components"]["replay"]["buffer"]["added"].tolist() == [4]
    online("td3_bc", tmp_path / "offline", tmp_path / "cold", online_steps=3, warmup_steps=3 - 1)
    offline_q, cold_q = (load_checkpoint(tmp_path / d)["components"]["qf"] for d in ("offline", "cold"))
    assert all(not torch.equal(offline_q[k], cold_q[k]) for k in offline_q)  # its one update moved every weight


def test_online_run_learns_at_the_rate_given_now(tmp_path):
    train("cql", tmp_path / "offline", policy_lr=2e-5)
    online("cql", tmp_path / "offline", tmp_path / "kept", online_steps=2)
    online("cql", tmp_path / "offline", tmp_path / "given", online_steps=2, policy_lr=1e-4)
    rates = {d: load_checkpoint(tmp_path / d)["components"]["actor_optimizer"]["param_groups"][0]["lr"]
             for d in ("kept", "given")}
    assert rates == {"kept": 2e-5, "given": 1e-4}  # the offline run's unless given now


@pytest.mark.parametrize("name, steps, cut_at", [("iql", 100, 5), ("cal_ql", 250, 23)])
def test_online_run_same_seed_same_metrics_and_exact_resume(name, steps, cut_at, tmp_path, monkeypatch):
    """Interrupted on a metrics line after a checkpoint (iql: mid-episode, at step 50 after the
    checkpoint at 40; Cal-QL: at 220, after the checkpoint at 200 where Pendulum's first episode
    ended and its returns-to-go were filled in), the resumed online run (its env, its online steps,
    the dataset read again) logs the same numbers."""
    train(name, tmp_path / "offline")
    online(name, tmp_path / "offline", tmp_path / "a", online_steps=steps)
    online(name, tmp_path / "offline", tmp_path / "b", online_steps=steps)
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")
    assert any("charts/episodic_return" in row for row in metrics(tmp_path / "a")) == (steps > 200)
    interrupt_at_log(monkeypatch, lambda: online(name, tmp_path / "offline", tmp_path / "cut", online_steps=steps),
                     cut_at)
    assert len(metrics(tmp_path / "cut")) == cut_at
    # from Python a resumed run is given its settings (the CLI reads them from its config.json)
    online(name, tmp_path / "offline", tmp_path / "cut", online_steps=steps, resume=str(tmp_path / "cut"),
           dataset="pendulum/random-v0", **ALGOS[name][1])
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "a")


@pytest.fixture(scope="module")
def sources(tmp_path_factory, datasets):
    """Offline runs to continue: a finished cql and td3_bc run, an unfinished cql run, a finished
    online run, and a SAC run (not offline)."""
    from omnigym.algos import sac

    root = tmp_path_factory.mktemp("sources")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINARI_DATASETS_PATH", str(datasets))
        train("cql", root / "cql")
        train("td3_bc", root / "td3_bc")
        online("cql", root / "cql", root / "cql-online", online_steps=10)
        interrupt_at_log(patch, lambda: train("cql", root / "unfinished"), n=5)
        sac.train(sac.CONFIG(env_id="Pendulum-v1", total_timesteps=50, learning_starts=10, hidden=(8,),
                             run_dir=str(root / "sac"), progress=False, plot=False, tensorboard=False))
        bc.train(bc.CONFIG(**{"dataset": "pendulum/random-v0", "seed": 5, "total_timesteps": 20,
                              "run_dir": str(root / "bc"), **SMALL}))
    return root


BAD = [
    (["--resume-online", "SRC/nowhere", "--online-steps", "10"], "--resume-online SRC/nowhere: SRC/nowhere is not a "
                                                                 "run directory"),
    (["--resume-online", "SRC/sac", "--online-steps", "10"],
     "--resume-online SRC/sac is a sac run, not an offline one"),
    (["--resume-online", "SRC/td3_bc", "--online-steps", "10"], "--resume-online SRC/td3_bc is a td3_bc run; continue "
                                                                "it online with: omnigym train td3_bc"),
    # it advised 'omnigym train bc --resume-online', which bc refuses
    (["--resume-online", "SRC/bc", "--online-steps", "10"], "--resume-online SRC/bc is a bc run, which has no online "
                                                            "phase; --resume-online continues cql, iql, td3_bc runs"),
    (["--resume-online", "SRC/unfinished", "--online-steps", "10"], "has not finished (gradient step 40 of 60)"),
    (["--resume-online", "SRC/cql-online", "--online-steps", "10"], "is an online run already; continue it with"),
    # --total-timesteps was dropped in silence, and the run went on for its --online-steps
    (["--resume", "SRC/cql-online", "--total-timesteps", "5"], "--total-timesteps 5 does not apply to an online run: its "
                                                               "length is its --online-steps (10), fixed for the run; "
                                                               "to train online for longer, start another online run "
                                                               "from the offline one: omnigym train cql --resume-online "
                                                               "SRC/cql --online-steps N"),
    # "made with --online-steps 0", which did not say that --resume-online is the way online
    (["--resume", "SRC/cql", "--online-steps", "5"], "--resume continues SRC/cql as it was made; an offline run goes "
                                                     "online as a new run: give --resume-online SRC/cql --online-steps 5 "
                                                     "in place of --resume"),
    # "give a larger --total-timesteps", which the line above refuses
    (["--resume", "SRC/cql-online"], "SRC/cql-online has run all its --online-steps (10), which are fixed for an online "
                                     "run; to train online for longer, start another online run from the offline one"),
    (["--resume-online", "SRC/cql", "--online-steps", "10", "--env-id", "MountainCarContinuous-v0"],
     "was trained with --env-id Pendulum-v1, not MountainCarContinuous-v0"),
    (["--resume-online", "SRC/cql", "--online-steps", "10", "--hidden", "64", "64"],
     "was trained with --hidden 32 32, not 64 64"),
    (["--resume-online", "SRC/cql", "--online-steps", "10", "--run-dir", "SRC/cql"], "the online run is a new run"),
    (["--resume-online", "SRC/cql"], "--resume-online needs --online-steps N"),
    # it was dropped in silence
    (["--resume-online", "SRC/cql", "--online-steps", "10", "--total-timesteps", "100"],
     "--total-timesteps 100 does not apply to an online run: its length is its --online-steps (10); leave it out"),
    (["--dataset", "pendulum/random-v0", "--online-steps", "10"], "--online-steps is for --resume-online RUN_DIR"),
    (["--dataset", "pendulum/random-v0", "--warmup-steps", "10"], "--warmup-steps is for --resume-online RUN_DIR"),
    (["--resume-online", "SRC/cql", "--online-steps", "10", "--warmup-steps", "10"],
     "--warmup-steps must be in [0, --online-steps)"),
    (["--resume-online", "SRC/cql", "--online-steps", "10", "--mixing-ratio", "1"], "--mixing-ratio must be in [0, 1)"),
    (["--dataset", "pendulum/random-v0", "--sparse-reward"], "--sparse-reward is Cal-QL's rule"),
    (["--dataset", "cartpole/random-v0"], "CQL needs a continuous (Box) action space"),
]


@pytest.mark.parametrize("flags, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gets_one_line_and_writes_nothing(sources, datasets, tmp_path, monkeypatch, capsys, flags, message):
    before = test_bad_input.snapshot(sources), test_bad_input.snapshot(datasets)
    argv = ["train", "cql", *(a.replace("SRC", str(sources)) for a in flags)]
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv,
                                                                   message.replace("SRC", str(sources)))
    assert (test_bad_input.snapshot(sources), test_bad_input.snapshot(datasets)) == before


def test_going_online_from_a_run_that_is_training_says_so(sources, tmp_path, monkeypatch, capsys):
    """It advised --resume, which the training run's lock refuses."""
    import os

    from omnigym.track.lock import RunLock

    before = test_bad_input.snapshot(sources)
    held = RunLock(sources / "unfinished")
    assert held.acquire()
    try:
        assert main(["train", "cql", "--resume-online", str(sources / "unfinished"), "--online-steps", "10",
                     "--run-dir", str(tmp_path / "on")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "has not finished (gradient step 40 of 60) and is training now (pid " \
            f"{os.getpid()}" in err[0] and err[0].endswith("wait for it to end, then run this again"), err
    finally:
        held.release()
    assert test_bad_input.snapshot(sources) == before and not (tmp_path / "on").exists()


def test_collect_from_replay_writes_an_online_runs_own_steps(sources, tmp_path, monkeypatch):
    """An offline run gone online keeps its online steps in a buffer of its own: collect --from-replay read the
    buffer size from the config as a SAC run's (AttributeError: 'CQLConfig' object has no attribute 'buffer_size')."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    assert main(["collect", str(sources / "cql-online"), "--from-replay", "--dataset", "pendulum/online-steps-v0"]) == 0
    dataset = minari.load_dataset("pendulum/online-steps-v0")
    assert dataset.total_steps == 10 and dataset.storage.metadata["algorithm_name"] == "omnigym/cql replay buffer"


@pytest.mark.slow
def test_cal_ql_learns_from_a_sac_runs_episodes(tmp_path, monkeypatch):
    """D4RL's "medium" recipe on Pendulum (bench/offline_to_online.py's dataset: 20 episodes of a
    3000-step SAC run, about 27 in normalized score): 3000 gradient steps of Cal-QL take the policy
    from random (0) to 16.1 (-1.4 at 1500 steps; 23.6 at 2500 and 12.9 at 4000, the test's length
    before)."""
    from omnigym.algos import sac
    from omnigym.runs import collect

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    sac.train(sac.CONFIG(env_id="Pendulum-v1", total_timesteps=3000, learning_starts=1000, seed=0,
                         run_dir=str(tmp_path / "sac"), progress=False, plot=False, tensorboard=False))
    collect([str(tmp_path / "sac")], 20, "pendulum/medium-v0", ref_max_score=-150.0, reference_episodes=20)
    result = cql.train(cql.CONFIG(dataset="pendulum/medium-v0", calibrated=True, hidden=(64, 64), seed=1,
                                  total_timesteps=3000, eval_every=1500, run_dir=str(tmp_path / "calql"),
                                  progress=False, plot=False, tensorboard=False))
    scores = [r["eval/normalized_score"] for r in metrics(tmp_path / "calql") if "eval/normalized_score" in r]
    print(f"Cal-QL normalized score at 1500 and 3000 steps: {scores}")
    assert result["eval/normalized_score"] > 5 and scores[-1] > scores[0]
