"""The anchor for `drill bench env --env PongNoFrameskip-v4`: ale-py's own vectorised Atari
(AtariVectorEnv, C++ threads) and one Gymnasium env with AtariPreprocessing + FrameStack,
random actions, env steps per second (median of 5 repeats).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install ale-py==0.12.1 gymnasium opencv-python-headless numpy
    /tmp/v/bin/python scripts/bench_ale_py.py [--game pong] [--num-envs 8] [--threads 2] [--steps 50000]
"""

import argparse
import time

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation


def median_rate(step, calls, per_call, reps=5):
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        for k in range(calls):
            step(k)
        rates.append(calls * per_call / (time.perf_counter() - t))
    return sorted(rates)[len(rates) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--game", default="pong")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=50000)
    a = p.parse_args()
    rng = np.random.default_rng(0)

    # The same chain as drill's training default: noop 30, frame skip 4 with max-pool,
    # fire reset, 84x84 grayscale, reward clipping, stack 4, no sticky actions.
    venv = ale_py.vector_env.AtariVectorEnv(
        game=a.game,
        num_envs=a.num_envs,
        num_threads=a.threads,
        repeat_action_probability=0.0,
        episodic_life=True,
    )
    venv.reset(seed=0)
    n_act = venv.single_action_space.n
    table = rng.integers(0, n_act, size=(4096, a.num_envs))
    calls = max(1, a.steps // a.num_envs // 5)
    for k in range(min(calls, 100)):
        venv.step(table[k % 4096])
    rate = median_rate(lambda k: venv.step(table[k % 4096]), calls, a.num_envs)
    print(f"ale-py AtariVectorEnv {a.game} x{a.num_envs}, {a.threads} threads: {rate:.0f} steps/s")
    venv.close()

    gym.register_envs(ale_py)
    name = "".join(w.capitalize() for w in a.game.split("_"))
    env = FrameStackObservation(
        AtariPreprocessing(gym.make(f"{name}NoFrameskip-v4"), frame_skip=4, noop_max=30), 4
    )
    env.reset(seed=0)
    acts = rng.integers(0, env.action_space.n, size=4096)

    def single(k):
        _, _, term, trunc, _ = env.step(int(acts[k % 4096]))
        if term or trunc:
            env.reset()

    rate = median_rate(single, max(1, a.steps // 25), 1)
    print(f"ale-py + Gymnasium AtariPreprocessing {name}NoFrameskip-v4 x1: {rate:.0f} steps/s")


if __name__ == "__main__":
    main()
