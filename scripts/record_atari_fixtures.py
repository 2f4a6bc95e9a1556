"""Record Atari parity fixtures for drill-env (run once by a developer; CI needs no Python).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install ale-py==0.12.1 gymnasium opencv-python-headless numpy
    /tmp/v/bin/python scripts/record_atari_fixtures.py crates/drill-env/tests/fixtures/atari

For each (id, seed, steps) below: ale-py's env with Gymnasium's
AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=0) and
FrameStackObservation(4), stepped with a fixed random action sequence; a finished episode is
reset without a seed (as drill's vector env auto-resets). Writes <Game>_seed<S>.npz holding
obs (steps+1, 4, 84, 84) u8 (obs[0] from reset, obs[t+1] after action t), actions (steps,) i64,
rewards (steps,) f64, terminated and truncated (steps,) bool, and the versions used.
"""

import os
import sys

import ale_py
import cv2
import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

RUNS = [
    ("PongNoFrameskip-v4", 0, 400),
    ("SpaceInvadersNoFrameskip-v4", 1, 900),
    ("BreakoutNoFrameskip-v4", 2, 400),
]


def record(env_id, seed, steps):
    env = gym.make(env_id)
    env = AtariPreprocessing(
        env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=0
    )
    env = FrameStackObservation(env, 4)
    rng = np.random.default_rng(1000 + seed)
    n = env.action_space.n
    actions = rng.integers(0, n, size=steps).astype(np.int64)
    obs, _ = env.reset(seed=seed)
    frames = [np.asarray(obs, dtype=np.uint8)]
    rewards, terminated, truncated = [], [], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(int(a))
        rewards.append(float(r))
        terminated.append(bool(term))
        truncated.append(bool(trunc))
        if term or trunc:
            obs, _ = env.reset()
        frames.append(np.asarray(obs, dtype=np.uint8))
    env.close()
    return dict(
        obs=np.stack(frames),
        actions=actions,
        rewards=np.array(rewards, dtype=np.float64),
        terminated=np.array(terminated),
        truncated=np.array(truncated),
        versions=np.array(
            [f"ale-py {ale_py.__version__}", f"gymnasium {gym.__version__}", f"opencv {cv2.__version__}"]
        ),
    )


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "crates/drill-env/tests/fixtures/atari"
    os.makedirs(out, exist_ok=True)
    gym.register_envs(ale_py)
    for env_id, seed, steps in RUNS:
        d = record(env_id, seed, steps)
        name = env_id.replace("NoFrameskip-v4", "")
        path = os.path.join(out, f"{name}_seed{seed}.npz")
        np.savez_compressed(path, **d)
        print(
            f"{path}: {steps} steps, {int(d['terminated'].sum())} episode ends, "
            f"return {d['rewards'].sum():.0f}, {os.path.getsize(path)} bytes"
        )


if __name__ == "__main__":
    main()
