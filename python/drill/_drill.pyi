"""Type stub of the native module ``drill._drill`` (crates/drill-py); the public API is the
package ``drill``, which wraps it."""

from os import PathLike
from typing import Any, Optional, Sequence, Union

import numpy as np

__version__: str
ATARI: bool

class Error(Exception): ...
class ConfigError(Error): ...
class EnvError(Error): ...

def env_ids() -> list[str]: ...
def train(
    config: str,
    overrides: Sequence[str],
    exp_dir: Optional[str] = None,
    resume: Optional[str] = None,
    threads: Optional[int] = None,
    quiet: bool = False,
    save_replay: bool = False,
    processes: Optional[int] = None,
) -> str: ...
def launch(
    config: str,
    overrides: Sequence[str],
    nproc_per_node: int,
    program: str,
    args: Sequence[str],
    max_restarts: int = 0,
) -> int: ...

class VecEnvCore:
    id: str
    num_envs: int
    obs_shape: list[int]
    obs_dtype: str
    n_actions: Optional[int]
    action_box: Optional[tuple[list[float], list[float]]]
    max_episode_steps: Optional[int]
    reward_threshold: Optional[float]
    def __init__(
        self, id: str, num_envs: int, seed: int, num_threads: int, options: Optional[dict[str, Any]] = None
    ) -> None: ...
    def reset(self, seed: Optional[int], obs: np.ndarray) -> None: ...
    def step(
        self, actions: np.ndarray, obs: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> int: ...
    def send(self, actions: np.ndarray) -> None: ...
    def send_reset(self, seed: Optional[int] = None) -> None: ...
    def recv(self, obs: np.ndarray, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> int: ...
    def finals(self, final_obs: np.ndarray, returns: np.ndarray, lengths: np.ndarray) -> None: ...
    def close(self) -> None: ...

class Policy:
    kind: str
    env_id: str
    obs_shape: list[int]
    obs_dtype: str
    n_actions: Optional[int]
    action_dim: int
    checkpoint: str
    config: str
    recurrent: bool
    def __init__(self, path: Union[str, PathLike[str]], config: Optional[str] = None) -> None: ...
    def act(self, obs: np.ndarray) -> np.ndarray: ...
    def reset(self, rows: Optional[list[int]] = None) -> None: ...
    def q_values(self, obs: np.ndarray) -> np.ndarray: ...
    def values(self, obs: np.ndarray) -> np.ndarray: ...
    def state_dict(self) -> dict[str, np.ndarray]: ...
