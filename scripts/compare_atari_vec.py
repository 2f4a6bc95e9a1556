"""drill.make_vec against ale-py's AtariVectorEnv, stepped side by side with the same random
actions (1 copy, no noops, no sticky actions): how far apart the newest frame of each
observation is at the reset and at every step, what fills a reset's older stack slots, and,
with ``--games N``, each env's first N whole games (length and return), through the auto-resets.
With both fire resets off the frames agree pixel for pixel; with them on they do not (see
docs/python.md, "CleanRL's ppo_atari on drill.make_vec").

drill auto-resets in the step that ends a game (Gymnasium's SAME_STEP: that step returns the
next game's first observation), ale-py in the step after (NEXT_STEP: that step ignores its
action and returns the first observation). The script gives ale-py that extra step, so the
two are compared at the same moments of the same games.

    pip install ./python ale-py==0.12.1 numpy   (a wheel with Atari, ROMs in ALE_ROM_DIR)
    python scripts/compare_atari_vec.py [--game pong] [--fire-reset] [--steps 300] [--games N] [--seed 3]
"""

import argparse

import ale_py.vector_env
import drill
import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--game", default="pong")
    p.add_argument("--fire-reset", action="store_true", help="both envs' fire reset on (their default)")
    p.add_argument("--steps", type=int, default=300, help="steps to compare when --games is 0")
    p.add_argument("--games", type=int, default=0, help="step until both envs have ended N games")
    p.add_argument("--seed", type=int, default=3)
    a = p.parse_args()
    name = "".join(w.capitalize() for w in a.game.split("_"))
    ours = drill.make_vec(f"{name}NoFrameskip-v4", 1, seed=a.seed, noop_max=0, fire_reset=a.fire_reset,
                          episode_life=False)
    theirs = ale_py.vector_env.AtariVectorEnv(game=a.game, num_envs=1, noop_max=0, repeat_action_probability=0.0,
                                              episodic_life=False, reward_clipping=True,
                                              use_fire_reset=a.fire_reset)
    o, _ = ours.reset(seed=a.seed)
    t, _ = theirs.reset(seed=a.seed)
    newest = lambda x, y: int(np.abs(x[0, -1].astype(int) - y[0, -1].astype(int)).max())
    diffs = [newest(o, t)]
    print("reset: older slots all zero: drill", [bool((o[0, k] == 0).all()) for k in range(o.shape[1] - 1)],
          "ale-py", [bool((t[0, k] == 0).all()) for k in range(t.shape[1] - 1)])
    rng = np.random.default_rng(0)
    n = ours.single_action_space.n
    games = ([], [])  # each env's finished games: (length, return)
    runs = [[0, 0.0], [0, 0.0]]
    while min(map(len, games)) < a.games if a.games else len(diffs) <= a.steps:
        act = rng.integers(0, n, 1)
        o, r1, te1, tr1, _ = ours.step(act)
        t, r2, te2, tr2, _ = theirs.step(act)
        ends = (bool(te1[0] or tr1[0]), bool(te2[0] or tr2[0]))
        if ends[1]:
            t, *_ = theirs.step(act)  # NEXT_STEP: this step only resets
        diffs.append(newest(o, t))
        for run, done, reward, finished in zip(runs, ends, (r1, r2), games):
            run[0], run[1] = run[0] + 1, run[1] + float(reward[0])
            if done:
                finished.append(tuple(run))
                run[:] = [0, 0.0]
        if any(ends) and not a.games:
            break
    print(f"fire reset {'on' if a.fire_reset else 'off'}: newest frame's largest difference at the reset "
          f"{diffs[0]}, then steps 1-12 {diffs[1:13]}; over {len(diffs) - 1} steps at most {max(diffs)}, "
          f"{sum(d > 0 for d in diffs)} of {len(diffs)} observations differ")
    for who, finished in zip(("drill", "ale-py"), games):
        if finished:
            print(f"{who}'s games (steps, return):", ", ".join(f"({k}, {r:+.0f})" for k, r in finished))


if __name__ == "__main__":
    main()
