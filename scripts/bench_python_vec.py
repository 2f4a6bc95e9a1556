"""drill's vector environments from Python (`drill.make_vec`) against envpool, ale-py's
AtariVectorEnv and Gymnasium's SyncVectorEnv, in one run, interleaved rounds, random actions
from a pre-drawn table (no sampling cost inside the loop); env steps per second, the median
of the rounds, and the time of one `step` call on one CartPole copy (the Python overhead).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install envpool ale-py==0.12.1
    MATURIN_PEP517_ARGS="--features atari" /tmp/v/bin/pip install ./python
    ALE_ROM_DIR=... /tmp/v/bin/python scripts/bench_python_vec.py [--rounds 5] [--seconds 2]

Atari: Pong, 8 copies, 2 threads each, the same chain for all three (noop 30, frame skip 4,
fire reset, 84x84 grayscale, stack 4, episodic life, reward clipping, no sticky actions).
"""

import argparse
import statistics
import time

import numpy as np


def rate(step, per_call, seconds):
    """Steps per second of `step(k)` over about `seconds`."""
    calls, t0 = 0, time.perf_counter()
    while True:
        for _ in range(64):
            step(calls)
            calls += 1
        el = time.perf_counter() - t0
        if el >= seconds:
            return calls * per_call / el


def atari_contenders(n, threads, table):
    out = {}
    import drill

    if drill.ATARI:
        for reuse in (False, True):
            env = drill.make_vec("PongNoFrameskip-v4", n, seed=0, num_threads=threads, reuse_buffers=reuse)
            env.reset()
            name = f"drill.make_vec{' reuse_buffers' if reuse else ''}"
            out[name] = (lambda e: lambda k: e.step(table[k % len(table)]))(env)
    try:
        import envpool

        env = envpool.make_gymnasium(
            "Pong-v5",
            num_envs=n,
            batch_size=n,
            num_threads=threads,
            seed=0,
            episodic_life=True,
            reward_clip=True,
            repeat_action_probability=0.0,
            noop_max=30,
            use_fire_reset=True,
        )
        env.reset()
        out["envpool"] = lambda k: env.step(table[k % len(table)])
    except ImportError:
        pass
    try:
        import ale_py

        venv = ale_py.vector_env.AtariVectorEnv(
            game="pong",
            num_envs=n,
            num_threads=threads,
            repeat_action_probability=0.0,
            episodic_life=True,
        )
        venv.reset(seed=0)
        out["ale-py AtariVectorEnv"] = lambda k: venv.step(table[k % len(table)])
    except ImportError:
        pass
    return out


def cartpole_contenders(n, table):
    import gymnasium as gym

    import drill

    out = {}
    for reuse in (False, True):
        env = drill.make_vec("CartPole-v1", n, seed=0, reuse_buffers=reuse)
        env.reset()
        out[f"drill.make_vec{' reuse_buffers' if reuse else ''}"] = (
            lambda e: lambda k: e.step(table[k % len(table)])
        )(env)
    try:
        import envpool

        for th in (1, 2):
            env = envpool.make_gymnasium("CartPole-v1", num_envs=n, batch_size=n, num_threads=th, seed=0)
            env.reset()
            out[f"envpool, {th} thread{'s' if th > 1 else ''}"] = (
                lambda e: lambda k: e.step(table[k % len(table)])
            )(env)
    except ImportError:
        pass
    g = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync")
    g.reset(seed=0)
    out["gymnasium SyncVectorEnv"] = lambda k: g.step(table[k % len(table)])
    return out


def compare(title, contenders, per_call, rounds, seconds, unit="env steps/s"):
    got = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, step in contenders.items():
            step(0)
            got[name].append(rate(step, per_call, seconds))
    print(f"\n{title}")
    base = None
    for name, rs in got.items():
        med = statistics.median(rs)
        base = base or med
        print(f"  {name:34s} {med:12,.0f} {unit}  (rounds {min(rs):,.0f}-{max(rs):,.0f})  drill/this {base / med:5.2f}x")
    return got


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--atari-envs", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cartpole-envs", type=int, default=16)
    a = p.parse_args()
    rng = np.random.default_rng(0)

    table = rng.integers(0, 6, size=(4096, a.atari_envs))
    compare(
        f"Pong, {a.atari_envs} copies, {a.threads} threads, random actions",
        atari_contenders(a.atari_envs, a.threads, table),
        a.atari_envs,
        a.rounds,
        a.seconds,
    )
    table = rng.integers(0, 2, size=(4096, a.cartpole_envs))
    compare(
        f"CartPole-v1, {a.cartpole_envs} copies, random actions",
        cartpole_contenders(a.cartpole_envs, table),
        a.cartpole_envs,
        a.rounds,
        a.seconds,
    )
    table = rng.integers(0, 2, size=(4096, 1))
    got = compare(
        "CartPole-v1, 1 copy: step calls per second (the Python overhead)",
        cartpole_contenders(1, table),
        1,
        a.rounds,
        a.seconds,
        unit="calls/s",
    )
    print("  time per step() call:")
    for name, rs in got.items():
        print(f"    {name:32s} {1e6 / statistics.median(rs):6.2f} us")


if __name__ == "__main__":
    main()
