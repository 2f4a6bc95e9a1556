"""drill for Python: drill's vector environments, its trainer and its trained policies.

- :func:`make_vec` — N copies of a classic-control or Atari environment stepped together in
  native code, as a ``gymnasium.vector.VectorEnv`` (same-step auto-reset), with envpool's
  ``send``/``recv`` pair.
- :func:`train` — a whole ``drill train`` run from a TOML config, in this process (or
  data-parallel over ``nproc_per_node`` processes); returns ``result.json`` as a dict.
- :func:`load` — a trained policy (an experiment folder or a checkpoint) mapping numpy
  observations to actions, Q-values or values; ``.to_torch()`` gives DI-engine's model.
- :class:`Error` (and :class:`ConfigError`, :class:`EnvError`) carry drill's message, which
  names the config key path, the file or the id at fault.

Atari ids need a build with Atari (``ATARI`` says whether this one has it) and the ROMs
(``ALE_ROM_DIR``).
"""

from ._drill import ATARI, ConfigError, EnvError, Error, __version__
from .policy import Policy, load
from .train import train
from .vector import VecEnv, env_ids, make_vec

__all__ = [
    "ATARI",
    "ConfigError",
    "EnvError",
    "Error",
    "Policy",
    "VecEnv",
    "__version__",
    "env_ids",
    "load",
    "make_vec",
    "train",
]
