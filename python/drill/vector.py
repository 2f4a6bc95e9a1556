"""drill's vector environments as ``gymnasium.vector.VectorEnv``: :func:`make_vec`, :class:`VecEnv`.

Auto-reset is Gymnasium's ``AutoresetMode.SAME_STEP`` (``metadata["autoreset_mode"]``): a copy
whose episode ends in ``step`` is reset in that same call, so ``obs[i]`` is already the first
observation of its next episode; the finished episode's last observation is
``infos["final_obs"][i]`` (an object array, ``None`` where nothing ended, masked by
``infos["_final_obs"]``), and its return and length are ``infos["episode"]["r"][i]`` and
``["l"][i]`` (masked by ``infos["_episode"]``; with Atari's ``episode_life`` an episode is one
life, as training sees it).

Buffer reuse: by default every ``step``/``recv`` returns new arrays the caller owns (one
allocation each, filled by one copy). With ``reuse_buffers=True`` the same arrays are returned
every time and overwritten by the next ``reset``/``step``/``recv``: no allocation per step,
so copy what you keep (``obs.copy()``), as envpool asks of its buffers.
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from . import _drill

# Steps too short to share between threads (about 50 ns each).
_CLASSIC = ("CartPole-v0", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "Acrobot-v1")


def env_ids() -> list[str]:
    """Every id :func:`make_vec` can build here (classic control; Atari in a build with it)."""
    return _drill.env_ids()


def make_vec(
    id: str,
    num_envs: int,
    *,
    seed: int | None = None,
    num_threads: int | None = None,
    reuse_buffers: bool = False,
    **env_options: Any,
) -> VecEnv:
    """``num_envs`` copies of environment ``id`` stepped together by drill.

    Args:
        id: a Gymnasium id drill builds natively: ``CartPole-v0``/``-v1``, ``Pendulum-v1``,
            ``MountainCar-v0``, ``Acrobot-v1``, or an Atari id (``PongNoFrameskip-v4``,
            ``ALE/Pong-v5``, ...; :func:`env_ids` lists them).
        num_envs: copies.
        seed: copy ``i`` is seeded ``seed + i`` at the first reset (``None``: a random seed).
        num_threads: threads stepping the copies (default: one per copy up to the CPU count
            for Atari, 1 for classic control, whose steps are too short to share).
        reuse_buffers: return the same arrays every step (see the module docs).
        **env_options: Atari's wrapper chain (DI-engine's ``wrap_deepmind``, the ``[env]``
            keys of a drill config): ``noop_max=30``, ``frame_skip=4``, ``episode_life=True``,
            ``fire_reset=True``, ``clip_rewards=True``, ``screen_size=84``,
            ``full_action_space=False``, ``frame_stack=4``.

    Returns:
        A :class:`VecEnv` (a ``gymnasium.vector.VectorEnv``).

    Raises:
        EnvError: an unknown id, an Atari id in a build without Atari, a missing ROM.
        TypeError: an option the environment does not have.
    """
    return VecEnv(
        id,
        num_envs,
        seed=seed,
        num_threads=num_threads,
        reuse_buffers=reuse_buffers,
        **env_options,
    )


class VecEnv(gymnasium.vector.VectorEnv):
    """drill's vector environment (see :func:`make_vec` and the module docs).

    Besides Gymnasium's ``reset``/``step``/``close``: envpool's asynchronous pair,
    ``send(actions)`` (returns at once; the copies step on a worker thread) and ``recv()``
    (waits, then returns what ``step`` would), and ``async_reset()``. ``infos["env_id"]``
    from ``recv`` lists the copies in the batch (all of them, in order). A panic inside the
    copies (a bug, or a ROM removed after ``make_vec``) raises :class:`EnvError` from that
    call, and from every later one on this env.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        id: str,
        num_envs: int,
        *,
        seed: int | None = None,
        num_threads: int | None = None,
        reuse_buffers: bool = False,
        **env_options: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, not {num_envs}")
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        if num_threads is None:
            num_threads = 1 if id in _CLASSIC else min(num_envs, os.cpu_count() or 1)
        self._core = _drill.VecEnvCore(id, num_envs, seed, num_threads, env_options)
        core = self._core
        self.num_envs = num_envs
        self.render_mode = None
        self.spec = None
        self._obs_dtype = np.dtype(core.obs_dtype)
        self._obs_shape = (num_envs, *core.obs_shape)
        if self._obs_dtype == np.uint8:
            self.single_observation_space = gymnasium.spaces.Box(
                0, 255, tuple(core.obs_shape), np.uint8, seed=seed
            )
        else:
            self.single_observation_space = gymnasium.spaces.Box(
                -np.inf, np.inf, tuple(core.obs_shape), np.float32, seed=seed
            )
        if core.n_actions is not None:
            self.single_action_space = gymnasium.spaces.Discrete(core.n_actions, seed=seed)
            self._action_dtype = np.int64
        else:
            low, high = core.action_box
            self.single_action_space = gymnasium.spaces.Box(
                np.array(low, np.float32), np.array(high, np.float32), dtype=np.float32, seed=seed
            )
            self._action_dtype = np.float32
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = dict(self.metadata)
        self.metadata["max_episode_steps"] = core.max_episode_steps
        self.metadata["reward_threshold"] = core.reward_threshold
        self._reuse = reuse_buffers
        self._buffers = self._new_buffers()
        self._env_ids = np.arange(num_envs)

    def _new_buffers(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = self.num_envs
        return (
            np.empty(self._obs_shape, self._obs_dtype),
            np.empty(n, np.float32),
            np.empty(n, np.bool_),
            np.empty(n, np.bool_),
        )

    def _buffers_for_call(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self._buffers if self._reuse else self._new_buffers()

    def reset(
        self,
        *,
        seed: int | list[int] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy; ``seed`` seeds copy ``i`` with ``seed + i`` (a list must be
        those consecutive seeds). Returns ``(obs, infos)``."""
        if options:
            raise TypeError(f"reset takes no options here, got {sorted(options)}")
        if isinstance(seed, (list, tuple)):
            if list(seed) != list(range(seed[0], seed[0] + self.num_envs)):
                raise ValueError(
                    "drill seeds copy i with seed + i: give one int, or the list [s, s+1, ..., s+num_envs-1]"
                )
            seed = seed[0]
        # Gymnasium's convention: the env's own generator (np_random) follows the seed.
        super().reset(seed=seed)
        obs = self._buffers[0] if self._reuse else np.empty(self._obs_shape, self._obs_dtype)
        self._core.reset(seed, obs)
        return obs, {}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every copy with its action; returns ``(obs, rewards, terminations,
        truncations, infos)`` (rewards float32; auto-reset as in the module docs)."""
        bufs = self._buffers_for_call()
        done = self._core.step(np.asarray(actions, self._action_dtype), *bufs)
        return (*bufs, self._infos(done, bufs))

    def send(self, actions: Any, env_id: Any = None) -> None:
        """Start a step of every copy with ``actions`` and return at once (envpool's
        ``send``; ``env_id``, if given, must name every copy in order)."""
        if env_id is not None and not np.array_equal(np.asarray(env_id), self._env_ids):
            raise ValueError("drill steps every copy together: env_id must be all copies, in order")
        self._core.send(np.asarray(actions, self._action_dtype))

    def async_reset(self, seed: int | None = None) -> None:
        """Start a reset of every copy; ``recv`` returns its observations."""
        self._core.send_reset(seed)

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for what ``send``/``async_reset`` started; returns what ``step`` would, with
        ``infos["env_id"]``."""
        bufs = self._buffers_for_call()
        done = self._core.recv(*bufs)
        infos = self._infos(done, bufs)
        infos["env_id"] = self._env_ids
        return (*bufs, infos)

    def _infos(self, done: int, bufs: tuple[np.ndarray, ...]) -> dict[str, Any]:
        if not done:
            return {}
        n = self.num_envs
        final_obs = np.empty(self._obs_shape, self._obs_dtype)
        returns = np.empty(n, np.float64)
        lengths = np.empty(n, np.int64)
        self._core.finals(final_obs, returns, lengths)
        mask = bufs[2] | bufs[3]
        boxed = np.full(n, None, dtype=object)
        for i in np.flatnonzero(mask):
            boxed[i] = final_obs[i]
        return {
            "final_obs": boxed,
            "_final_obs": mask,
            "final_info": {},
            "_final_info": mask,
            "episode": {"r": np.where(mask, returns, 0.0), "l": np.where(mask, lengths, 0)},
            "_episode": mask,
        }

    def close_extras(self, **kwargs: Any) -> None:
        """Stop the worker thread ``send`` started."""
        self._core.close()

    def __repr__(self) -> str:
        return f"drill.VecEnv({self._core.id}, num_envs={self.num_envs})"
