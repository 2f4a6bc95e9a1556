"""Atari through drill.make_vec (a build with `--features atari`, ROMs in ALE_ROM_DIR): the
frames, rewards and flags of ale-py 0.12.1 + Gymnasium's AtariPreprocessing and
FrameStackObservation, replayed from the fixtures drill's own parity test uses; the options;
and a panic in the copies raised as drill.EnvError, not a hang."""

import os
import shutil

import numpy as np
import pytest

import drill
from conftest import REPO

pytestmark = pytest.mark.skipif(
    not drill.ATARI or not os.environ.get("ALE_ROM_DIR"),
    reason="needs a build with Atari (MATURIN_PEP517_ARGS='--features atari') and ALE_ROM_DIR",
)

FIXTURES = REPO / "crates/drill-env/tests/fixtures/atari"


@pytest.mark.parametrize(
    "env_id,file,seed",
    [
        ("PongNoFrameskip-v4", "Pong_seed0.npz", 0),
        ("BreakoutNoFrameskip-v4", "Breakout_seed2.npz", 2),
    ],
)
def test_frames_equal_ale_py(env_id, file, seed):
    f = np.load(FIXTURES / file)
    # Gymnasium's chain: no noops, no episodic life, no fire reset, raw rewards.
    env = drill.make_vec(env_id, 1, seed=seed, noop_max=0, episode_life=False, fire_reset=False, clip_rewards=False)
    assert env.single_observation_space.shape == (4, 84, 84)
    assert env.single_observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=seed)
    frames = f["obs"].reshape(-1, 4, 84, 84)
    one = int((obs[0] != frames[0]).sum())
    for t, a in enumerate(f["actions"]):
        obs, rew, term, trunc, _ = env.step(np.array([a]))
        assert rew[0] == f["rewards"][t], f"step {t}"
        assert term[0] == f["terminated"][t] and trunc[0] == f["truncated"][t], f"step {t}"
        d = np.abs(obs[0].astype(int) - frames[t + 1].astype(int))
        assert d.max() <= 1, f"step {t}: a pixel more than 1 grey level apart"
        one += int((d == 1).sum())
    assert one * 1000 <= frames.size


def test_training_chain_and_options():
    env = drill.make_vec("PongNoFrameskip-v4", 2, seed=0, num_threads=2)
    assert env.single_action_space.n == 6
    obs, _ = env.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    obs, rew, *_ = env.step(np.array([0, 1]))
    assert set(np.unique(rew)) <= {-1.0, 0.0, 1.0}
    small = drill.make_vec("PongNoFrameskip-v4", 1, seed=0, screen_size=42, frame_stack=2, full_action_space=True)
    assert small.single_observation_space.shape == (2, 42, 42)
    assert small.single_action_space.n == 18
    with pytest.raises(TypeError, match="frame_skp.*expected one of.*frame_skip"):
        drill.make_vec("PongNoFrameskip-v4", 1, frame_skp=2)
    # The same checks as a config's [env] (one definition, drill-env's AtariOptions).
    with pytest.raises(ValueError, match=r"option \"screen_size\" must be 1..=160"):
        drill.make_vec("PongNoFrameskip-v4", 1, screen_size=161)
    with pytest.raises(ValueError, match="\"noop_max\""):
        drill.make_vec("PongNoFrameskip-v4", 1, noop_max=-1)
    with pytest.raises(TypeError, match="\"fire_reset\" must be a bool or an int"):
        drill.make_vec("PongNoFrameskip-v4", 1, fire_reset="yes")


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_panic_in_the_copies_raises_instead_of_hanging(tmp_path, monkeypatch, asynchronous):
    # A ROM removed after make_vec: a copy loads its ROM at its first reset (ALE would exit
    # the process on the missing file), so drill panics there, naming it. reset and
    # async_reset + recv both raise drill.EnvError, and so does every later call.
    rom = tmp_path / "pong.bin"
    shutil.copy(os.path.join(os.environ["ALE_ROM_DIR"], "pong.bin"), rom)
    monkeypatch.setenv("ALE_ROM_DIR", str(tmp_path))
    env = drill.make_vec("PongNoFrameskip-v4", 2, seed=0, num_threads=2)
    rom.unlink()
    with pytest.raises(drill.EnvError, match="is no longer there"):
        if asynchronous:
            env.async_reset(seed=1)
            env.recv()
        else:
            env.reset(seed=1)
    with pytest.raises(drill.EnvError, match="panicked"):
        env.step(np.array([0, 0]))
