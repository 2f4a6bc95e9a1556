"""drill's side of a Gymnasium environment (crates/drill-env/src/python/mod.rs).

One vector environment, stepped with one call per step; observations, rewards and flags
come back as contiguous numpy arrays of the element types drill stores, which Rust copies
through the buffer protocol. Auto-reset is Gymnasium's SAME_STEP, drill's own.
"""

import json

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode


def _register(name, entry_point):
    if entry_point and name not in gym.registry:
        gym.register(id=name, entry_point=entry_point)


def _space(space):
    """(kind, shape, dtype, low, high or n) of a space drill can hold; refuses the others."""
    if isinstance(space, gym.spaces.Discrete):
        return ("discrete", [], "int", [], [], int(space.n), int(space.start))
    if isinstance(space, gym.spaces.Box):
        dtype = "u8" if space.dtype == np.uint8 else "f32"
        low = np.broadcast_to(space.low, space.shape).astype(np.float32).ravel()
        high = np.broadcast_to(space.high, space.shape).astype(np.float32).ravel()
        return ("box", list(space.shape), dtype, low.tolist(), high.tolist(), 0, 0)
    return ("other", [], type(space).__name__, [], [], 0, 0)


def _describe(env_spec, obs_space, act_space):
    """(observation space, action space, step limit, reward threshold), as drill reads them."""
    return (
        _space(obs_space),
        _space(act_space),
        env_spec.max_episode_steps if env_spec is not None else None,
        env_spec.reward_threshold if env_spec is not None else None,
    )


def spec(name, kwargs_json, entry_point):
    """`_describe` of one copy of `name`, made for the purpose and closed."""
    _register(name, entry_point)
    env = gym.make(name, **json.loads(kwargs_json or "{}"))
    try:
        return _describe(env.spec, env.observation_space, env.action_space)
    finally:
        env.close()


F64 = np.dtype(np.float64)
BOOL = np.dtype(np.bool_)


def _flags(x):
    """Booleans as uint8 (the buffer protocol's bool is not a type drill reads)."""
    if type(x) is np.ndarray and x.dtype is BOOL and x.flags.c_contiguous:
        return x.view(np.uint8)
    return np.ascontiguousarray(x, dtype=np.bool_).view(np.uint8)


class Vec:
    """`n` copies of `name` in Gymnasium's vector env (`sync` or `async` subprocesses)."""

    def __init__(self, name, n, mode, kwargs_json, entry_point):
        _register(name, entry_point)
        self.env = gym.make_vec(
            name,
            num_envs=n,
            vectorization_mode=mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False},
            **json.loads(kwargs_json or "{}"),
        )
        obs = self.env.single_observation_space
        act = self.env.single_action_space
        # What drill builds its buffers from; spaces it cannot hold are refused there.
        self.description = _describe(self.env.spec, obs, act)
        if self.description[0][0] != "box" or self.description[1][0] == "other":
            return
        self.obs_dtype = np.uint8 if obs.dtype == np.uint8 else np.float32
        self.obs_dtype_obj = np.dtype(self.obs_dtype)
        self.obs_shape = (n,) + tuple(obs.shape)
        self.row = int(np.prod(obs.shape, dtype=np.int64))
        self.discrete = isinstance(act, gym.spaces.Discrete)
        self.start = int(act.start) if self.discrete else 0
        # drill writes each step's actions here (buffer protocol), then calls step().
        if self.discrete:
            self.actions = np.zeros(n, np.int64)
        else:
            self.actions = np.zeros((n,) + tuple(act.shape), np.float32)
        self.cast = None if self.actions.dtype == act.dtype else act.dtype

    def _obs(self, obs, what):
        obs = np.asarray(obs)
        if obs.shape != self.obs_shape:
            raise ValueError(
                f"{what} has shape {obs.shape}, but the observation space says {self.obs_shape}"
            )
        return np.ascontiguousarray(obs, dtype=self.obs_dtype)

    def reset(self, seed):
        obs, _ = self.env.reset(seed=seed)
        return self._obs(obs, "reset's observation")

    def step(self):
        """Step with `self.actions`: (obs, None or (ended copies, their final obs), rewards,
        terminated, truncated), each a contiguous array (flags as uint8)."""
        a = self.actions if self.cast is None else self.actions.astype(self.cast)
        if self.start:
            a = a + self.start
        obs, rewards, terminated, truncated, info = self.env.step(a)
        finals = None
        ended = info.get("_final_obs") if info else None
        if ended is not None and ended.any():
            at = np.flatnonzero(ended)
            rows = [np.asarray(info["final_obs"][i], dtype=self.obs_dtype) for i in at]
            finals = (at.astype(np.uint32), np.ascontiguousarray(np.stack(rows)))
        # Arrays already as drill stores them (the common case) pass through untouched.
        if not (
            type(obs) is np.ndarray
            and obs.dtype is self.obs_dtype_obj
            and obs.shape == self.obs_shape
            and obs.flags.c_contiguous
        ):
            obs = self._obs(obs, "step's observation")
        if not (type(rewards) is np.ndarray and rewards.dtype is F64 and rewards.flags.c_contiguous):
            rewards = np.ascontiguousarray(rewards, dtype=np.float64)
        return obs, finals, rewards, _flags(terminated), _flags(truncated)

    def close(self):
        self.env.close()
