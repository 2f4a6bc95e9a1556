#!/usr/bin/env python3
"""Record Gymnasium classic-control trajectories as fixtures for drill-env's parity test.

Run once by a developer (CI never needs Python):

    pip install gymnasium
    python3 scripts/record_gym_fixtures.py crates/drill-env/tests/fixtures/gym_classic.json

For each environment it records a few episodes: the state after reset, then per step the action,
observation, reward, terminated/truncated flags and the new physical state. The Rust test sets the
same initial state, replays the actions and compares everything to 1e-6. Actions come from a
seeded random policy and, so that long episodes and truncation are covered, a simple controller.
"""
import json
import sys

import gymnasium as gym
import numpy as np


def controller(env_id, obs, rng):
    """A hand-written policy that keeps episodes long, with some noise."""
    if rng.random() < 0.1:
        return None
    if env_id.startswith("CartPole"):
        return int(obs[2] + 0.5 * obs[3] > 0)
    if env_id == "Pendulum-v1":
        return np.array([np.clip(-2.0 * obs[1] - 0.5 * obs[2], -2.5, 2.5)], dtype=np.float32)
    if env_id == "MountainCar-v0":
        return 2 if obs[1] >= 0 else 0
    if env_id == "Acrobot-v1":
        return 2 if obs[4] >= 0 else 0
    return None


def record(env_id, episodes, max_steps):
    env = gym.make(env_id)
    env.action_space.seed(123)
    rng = np.random.default_rng(7)
    out = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=1000 + ep)
        record = {
            "policy": "random" if ep % 2 == 0 else "controller",
            "initial_state": np.asarray(env.unwrapped.state, dtype=np.float64).tolist(),
            "initial_obs": np.asarray(obs, dtype=np.float64).tolist(),
            "steps": [],
        }
        for _ in range(max_steps):
            action = None if ep % 2 == 0 else controller(env_id, obs, rng)
            if action is None:
                action = env.action_space.sample()
            obs, reward, terminated, truncated, _ = env.step(action)
            record["steps"].append(
                {
                    "action": np.asarray(action, dtype=np.float64).reshape(-1).tolist(),
                    "obs": np.asarray(obs, dtype=np.float64).tolist(),
                    "reward": float(reward),
                    "terminated": bool(terminated),
                    "truncated": bool(truncated),
                    "state": np.asarray(env.unwrapped.state, dtype=np.float64).tolist(),
                }
            )
            if terminated or truncated:
                break
        out.append(record)
    return out


def main():
    path = sys.argv[1]
    fixtures = {
        "gymnasium_version": gym.__version__,
        "numpy_version": np.__version__,
        "envs": {
            env_id: record(env_id, episodes, 600)
            for env_id, episodes in [
                ("CartPole-v0", 4),
                ("CartPole-v1", 4),
                ("Pendulum-v1", 4),
                ("MountainCar-v0", 4),
                ("Acrobot-v1", 4),
            ]
        },
    }
    with open(path, "w") as f:
        json.dump(fixtures, f, separators=(",", ":"))
    for env_id, eps in fixtures["envs"].items():
        print(env_id, [len(e["steps"]) for e in eps])


if __name__ == "__main__":
    main()
