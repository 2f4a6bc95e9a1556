"""drill.make_vec as a Gymnasium VectorEnv: spaces, seeding, Gymnasium's own dynamics and
same-step auto-reset, buffer reuse, send/recv, errors."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import drill


def test_spaces_and_dtypes():
    env = drill.make_vec("CartPole-v1", 3, seed=0)
    assert isinstance(env, gym.vector.VectorEnv)
    assert env.num_envs == 3
    assert env.single_observation_space == gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    assert env.single_action_space == gym.spaces.Discrete(2)
    assert env.action_space == gym.spaces.MultiDiscrete([2, 2, 2])
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, info = env.reset(seed=1)
    assert obs.shape == (3, 4) and obs.dtype == np.float32 and info == {}
    assert env.observation_space.contains(obs)
    obs, rew, term, trunc, info = env.step(env.action_space.sample())
    assert obs.dtype == np.float32 and rew.dtype == np.float32
    assert term.dtype == np.bool_ and trunc.dtype == np.bool_
    assert rew.shape == term.shape == trunc.shape == (3,)

    pend = drill.make_vec("Pendulum-v1", 2, seed=0)
    assert pend.single_action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    pend.reset()
    obs, rew, *_ = pend.step(np.array([[0.5], [-3.0]], np.float32))
    assert obs.shape == (2, 3) and np.all(rew <= 0)


def rollout(env, seed, steps, actions):
    out = [env.reset(seed=seed)[0].copy()]
    for t in range(steps):
        obs, rew, term, trunc, info = env.step(actions[t])
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy()))
    return out


def test_same_seed_same_run_other_seed_another():
    acts = np.random.default_rng(0).integers(0, 2, size=(300, 4))
    a = rollout(drill.make_vec("CartPole-v1", 4), 7, 300, acts)
    b = rollout(drill.make_vec("CartPole-v1", 4), 7, 300, acts)
    c = rollout(drill.make_vec("CartPole-v1", 4), 8, 300, acts)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
    for x, y in zip(a[1:], b[1:]):
        assert all(np.array_equal(p, q) for p, q in zip(x, y))
    assert not np.array_equal(a[0], c[0])


def test_gymnasiums_dynamics_and_same_step_autoreset():
    """The same seeds and actions give Gymnasium's own SyncVectorEnv (SAME_STEP) run: every
    observation, reward and flag, the final observations of ended episodes, and the resets
    drawn after them."""
    n, steps = 4, 600
    acts = np.random.default_rng(1).integers(0, 2, size=(steps, n))
    ours = drill.make_vec("CartPole-v1", n)
    ref = gym.make_vec(
        "CartPole-v1", n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}
    )
    o1, _ = ours.reset(seed=3)
    o2, _ = ref.reset(seed=3)
    np.testing.assert_allclose(o1, o2, atol=1e-6)
    ends = 0
    for t in range(steps):
        o1, r1, te1, tr1, i1 = ours.step(acts[t])
        o2, r2, te2, tr2, i2 = ref.step(acts[t])
        np.testing.assert_allclose(o1, o2, atol=1e-5, err_msg=f"step {t}")
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(te1, te2)
        np.testing.assert_array_equal(tr1, tr2)
        done = te1 | tr1
        if done.any():
            ends += int(done.sum())
            np.testing.assert_array_equal(i1["_final_obs"], i2["_final_obs"])
            for i in np.flatnonzero(done):
                np.testing.assert_allclose(i1["final_obs"][i], i2["final_obs"][i], atol=1e-5)
                # The new episode's first observation is a fresh reset, in place already.
                assert np.all(np.abs(o1[i]) <= 0.05)
            assert i1["final_obs"][~done].tolist() == [None] * int((~done).sum())
            assert np.all(i1["episode"]["l"][done] >= 1)
        else:
            assert i1 == {}
    assert ends > 10


def test_episode_statistics_add_up():
    env = drill.make_vec("CartPole-v1", 2, seed=0)
    env.reset(seed=0)
    running = np.zeros(2)
    length = np.zeros(2, int)
    seen = 0
    for _ in range(400):
        _, r, te, tr, info = env.step(np.zeros(2, np.int64))
        running += r
        length += 1
        for i in np.flatnonzero(te | tr):
            assert info["episode"]["r"][i] == running[i] and info["episode"]["l"][i] == length[i]
            running[i] = 0
            length[i] = 0
            seen += 1
    assert seen >= 4


def test_buffer_reuse_policy():
    fresh = drill.make_vec("CartPole-v1", 2, seed=0)
    fresh.reset()
    a = fresh.step(np.zeros(2, np.int64))
    b = fresh.step(np.zeros(2, np.int64))
    assert all(x is not y for x, y in zip(a[:4], b[:4]))
    reuse = drill.make_vec("CartPole-v1", 2, seed=0, reuse_buffers=True)
    first = reuse.reset()[0]
    a = reuse.step(np.zeros(2, np.int64))
    b = reuse.step(np.zeros(2, np.int64))
    assert all(x is y for x, y in zip(a[:4], b[:4])) and first is a[0]
    np.testing.assert_array_equal(b[0], a[0])  # the same array, overwritten


def test_send_recv_equals_step():
    acts = np.random.default_rng(2).integers(0, 2, size=(200, 3))
    sync = drill.make_vec("CartPole-v1", 3, seed=5)
    asyn = drill.make_vec("CartPole-v1", 3, seed=5)
    o1, _ = sync.reset(seed=5)
    asyn.async_reset(seed=5)
    o2, _, _, _, info = asyn.recv()
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(info["env_id"], [0, 1, 2])
    for t in range(200):
        a = sync.step(acts[t])
        asyn.send(acts[t])
        b = asyn.recv()
        for x, y in zip(a[:4], b[:4]):
            np.testing.assert_array_equal(x, y)
    # A reset's results carry no step's rewards or flags, even right after episodes ended.
    while not asyn.step(np.zeros(3, np.int64))[2].any():
        pass
    asyn.async_reset(seed=9)
    o, r, te, tr, _ = asyn.recv()
    assert not r.any() and not te.any() and not tr.any()
    np.testing.assert_array_equal(o, sync.reset(seed=9)[0])
    asyn.send(acts[0])
    with pytest.raises(RuntimeError, match="recv"):
        asyn.step(acts[0])
    asyn.recv()
    with pytest.raises(RuntimeError, match="nothing was sent"):
        asyn.recv()
    asyn.close()


def test_errors_name_the_culprit():
    with pytest.raises(drill.EnvError, match="CartPole-v9"):
        drill.make_vec("CartPole-v9", 2)
    with pytest.raises(TypeError, match="frame_skip"):
        drill.make_vec("CartPole-v1", 2, frame_skip=3)
    env = drill.make_vec("CartPole-v1", 2, seed=0)
    env.reset()
    with pytest.raises(ValueError, match=r"actions\[1\] = 2"):
        env.step(np.array([0, 2]))
    with pytest.raises(ValueError, match="one per copy"):
        env.step(np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="num_envs"):
        drill.make_vec("CartPole-v1", 0)
    if not drill.ATARI:
        with pytest.raises(drill.EnvError, match="PongNoFrameskip-v4"):
            drill.make_vec("PongNoFrameskip-v4", 2)


def test_help_is_useful():
    doc = drill.make_vec.__doc__
    for word in ("num_envs", "seed", "num_threads", "reuse_buffers", "frame_stack", "EnvError"):
        assert word in doc


def test_gymnasiums_checks_that_take_a_vector_env():
    """Gymnasium's env_checker functions that do not assume one environment (the others
    test a truth value of `terminated`, an array here)."""
    from gymnasium.utils import env_checker

    env = drill.make_vec("CartPole-v1", 3, seed=0)
    env_checker.check_reset_seed_determinism(env)
    env_checker.check_reset_return_type(env)
    assert env.np_random is not None
