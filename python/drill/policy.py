"""``drill.load``: a trained policy for inference (see :func:`load`, :class:`Policy`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _drill


class Policy:
    """A policy drill trained, loaded for inference (from :func:`load`).

    ``policy(obs)`` gives the actions ``drill eval`` takes (greedy, most likely, or the mean)
    for one observation or a batch ``[n, *obs_shape]``; :meth:`q_values` (DQN) and
    :meth:`values` (PPO) the networks' outputs; :meth:`state_dict` its tensors in PyTorch's
    layout under DI-engine's names, :meth:`to_torch` DI-engine's model holding them.

    A recurrent policy (``policy.model.lstm_hidden_size``; :attr:`recurrent`) keeps a state
    per row of the batch (one env copy each) from call to call: after each step, call
    :meth:`reset` with the episodes that ended (``terminated | truncated``).
    """

    def __init__(self, core: Any) -> None:
        self._core = core
        self.obs_shape: tuple[int, ...] = tuple(core.obs_shape)
        self.obs_dtype = np.dtype(core.obs_dtype)

    @property
    def kind(self) -> str:
        """The algorithm: ``"dqn"``, ``"ppo"`` or ``"sac"``."""
        return self._core.kind

    @property
    def env_id(self) -> str:
        """The environment it was trained on."""
        return self._core.env_id

    @property
    def checkpoint(self) -> str:
        """The checkpoint file loaded."""
        return os.fspath(self._core.checkpoint)

    @property
    def config(self) -> str:
        """The config it was trained with (TOML)."""
        return self._core.config

    @property
    def recurrent(self) -> bool:
        """Whether it keeps a state per env copy between calls (an LSTM policy)."""
        return self._core.recurrent

    def reset(self, done: Any = None) -> None:
        """Zero a recurrent policy's state where ``done`` (a boolean mask over the batch's
        rows, e.g. ``terminated | truncated``) is true, or everywhere without it; nothing for
        a feed-forward policy."""
        if done is None:
            self._core.reset(None)
        else:
            self._core.reset(np.flatnonzero(np.asarray(done)).tolist())

    def _batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        x = np.ascontiguousarray(obs, dtype=self.obs_dtype)
        single = x.shape == self.obs_shape
        return (x[None] if single else x), single

    def __call__(self, obs: Any) -> Any:
        """Deterministic actions: int64 ``[n]`` (discrete) or float32 ``[n, dim]``; for one
        observation, one action."""
        x, single = self._batch(obs)
        a = self._core.act(x)
        return a[0] if single else a

    def q_values(self, obs: Any) -> np.ndarray:
        """DQN's Q-values, float32 ``[n, actions]`` (``[actions]`` for one observation)."""
        x, single = self._batch(obs)
        q = self._core.q_values(x)
        return q[0] if single else q

    def values(self, obs: Any) -> np.ndarray:
        """PPO's state values, float32 ``[n]`` (a scalar for one observation)."""
        x, single = self._batch(obs)
        v = self._core.values(x)
        return v[0] if single else v

    def state_dict(self) -> dict[str, np.ndarray]:
        """The tensors in PyTorch's layout under DI-engine's names (``drill export``)."""
        return dict(self._core.state_dict())

    def to_torch(self) -> Any:
        """DI-engine's model for this policy (``ding.model.DQN``, or ``VAC`` for PPO) with
        the weights loaded (``strict=True``); needs torch and DI-engine."""
        try:
            import ding.model  # noqa: F401
            import torch
        except ImportError as e:
            raise ImportError(
                "to_torch() builds DI-engine's model: pip install torch DI-engine "
                "(state_dict() gives the tensors without them)"
            ) from e
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            import tomli as tomllib

        cfg = tomllib.loads(self.config)
        model_cfg = cfg["policy"]["model"]
        hidden = model_cfg.get("encoder_hidden_size_list")
        if hidden is None or model_cfg.get("encoder") == "nature":
            raise NotImplementedError(
                f"to_torch(): DI-engine has no model for {self.env_id}'s {self.kind} network "
                "(drill's Nature trunk); use state_dict()"
            )
        state = {k: torch.from_numpy(v.copy()) for k, v in self.state_dict().items()}
        model = ding_model(
            self.kind,
            model_cfg,
            self.obs_shape,
            self._core.action_dim,
            continuous=self._core.n_actions is None,
        )
        model.load_state_dict(state, strict=True)
        return model.eval()


def ding_model(kind: str, model_cfg: dict, obs_shape: Any, action_dim: int, continuous: bool) -> Any:
    """DI-engine's model for a drill MLP policy (``[policy.model]`` of its config): ``DQN``
    for ``kind == "dqn"``; for PPO, drill's layers ``[h1 .. hk]`` as ``VAC`` with encoder
    ``[h1 .. h(k-1)]`` and heads of one hidden layer ``hk``. Needs torch and DI-engine."""
    import torch
    from ding.model import DQN, VAC

    obs = obs_shape[0] if len(obs_shape) == 1 else list(obs_shape)
    hidden = model_cfg["encoder_hidden_size_list"]
    if kind == "dqn":
        return DQN(
            obs_shape=obs,
            action_shape=action_dim,
            encoder_hidden_size_list=hidden,
            dueling=model_cfg.get("dueling", True),
        )
    if kind == "ppo":
        return VAC(
            obs_shape=obs,
            action_shape=action_dim,
            action_space="continuous" if continuous else "discrete",
            share_encoder=False,
            encoder_hidden_size_list=hidden[:-1],
            actor_head_hidden_size=hidden[-1],
            actor_head_layer_num=1,
            critic_head_hidden_size=hidden[-1],
            critic_head_layer_num=1,
            activation=torch.nn.Tanh() if model_cfg.get("activation") == "tanh" else torch.nn.ReLU(),
            sigma_type=model_cfg.get("sigma_type", "independent"),
        )
    raise NotImplementedError("DI-engine models for drill's DQN and PPO policies only")


def load(path: str | os.PathLike[str], *, config: str | os.PathLike[str] | None = None) -> Policy:
    """Load a trained policy.

    Args:
        path: an experiment folder (its newest checkpoint among final/latest/best) or a
            checkpoint file (``EXP/ckpt/*.safetensors``).
        config: the config it was trained with (default: the experiment folder's
            ``config.toml``).

    Raises:
        Error: no checkpoint or config there, or one that does not fit.
        ConfigError: the config is invalid.
    """
    core = _drill.Policy(os.fspath(path), None if config is None else os.fspath(config))
    return Policy(core)
