"""``--preset auto`` gives SAC on gymnasium-robotics' Fetch arms RL-Zoo's FetchReach settings, so
the README's ``omnigym train sac --env-id FetchReach-v4 --her`` trains with settings that learn
(SAC's own defaults, 1M steps and 5,000 random ones first, reached 0.05 success at 12k steps).
The learning itself is test_her.py's slow ``test_sac_with_her_learns_fetch_reach``, which runs
on exactly these settings."""

from omnigym.algos.control import sac

FETCH_SETTINGS = dict(total_timesteps=20_000, gamma=0.95, policy_lr=1e-3, q_lr=1e-3, batch_size=256,
                      learning_starts=1000, hidden=(64, 64), policy_frequency=1)


def test_fetch_runs_get_rl_zoos_settings_and_flags_given_win():
    resolved, line = sac.SACConfig(env_id="FetchReach-v4", her=True).apply_preset()
    assert resolved.preset == "fetch" and line.startswith("preset fetch (RL-Zoo's her.yml for FetchReach")
    assert {k: getattr(resolved, k) for k in FETCH_SETTINGS} == FETCH_SETTINGS
    given, _ = sac.SACConfig(env_id="FetchPush-v4", her=True, policy_lr=3e-4).apply_preset({"policy_lr"})
    assert given.policy_lr == 3e-4 and given.gamma == 0.95


def test_other_envs_and_preset_none_keep_sacs_defaults():
    for cfg in (sac.SACConfig(env_id="Pendulum-v1"), sac.SACConfig(env_id="omnigym/PointReach-v0", her=True),
                sac.SACConfig(env_id="FetchReach-v4", her=True, preset="none")):
        resolved, line = cfg.apply_preset()
        assert line is None and resolved.gamma == 0.99 and resolved.total_timesteps == 1_000_000
