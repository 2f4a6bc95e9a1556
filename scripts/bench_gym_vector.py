"""Gymnasium's own vector env stepped from Python: the anchor for drill's bridge
(`drill bench env --env gymnasium:ID`). Same setup as drill's: sync copies, SAME_STEP
auto-reset, random actions drawn beforehand, 5 timed rounds, median steps/s.

    VIRTUAL_ENV=venv scripts/bench_gym_bridge.sh          # both, side by side
    python scripts/bench_gym_vector.py CartPole-v1 8 20000  # this side alone
"""

import sys
import time

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode


def main():
    env_id = sys.argv[1] if len(sys.argv) > 1 else "CartPole-v1"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 50_000
    env = gym.make_vec(
        env_id,
        num_envs=n,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False},
    )
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    space = env.single_action_space
    if isinstance(space, gym.spaces.Discrete):
        table = rng.integers(0, space.n, size=(4096, n))
    else:
        table = rng.uniform(-1, 1, size=(4096, n) + space.shape).astype(space.dtype)
    calls = max(steps // n // 5, 1)
    for k in range(min(calls, 100)):
        env.step(table[k % 4096])
    rates = []
    for _ in range(5):
        t = time.perf_counter()
        for k in range(calls):
            env.step(table[k % 4096])
        rates.append(calls * n / (time.perf_counter() - t))
    rates.sort()
    print(f"python-{env_id}-vec{n:<12} {rates[2]:>14.3f} steps/s    ({calls * n * 5} iters) gymnasium {gym.__version__}, sync, SAME_STEP")


if __name__ == "__main__":
    main()
