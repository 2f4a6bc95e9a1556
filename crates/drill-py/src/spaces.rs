//! What an environment's spec says, as the Python side reads it: the observations' numpy
//! dtype name and the discrete action count (the getters of `VecEnvCore` and `Policy`).

use drill_env::{ActionSpace, Dtype};

/// The numpy dtype name of observations of `dtype`: "uint8" (frames) or "float32".
pub(crate) fn dtype_name(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::U8 => "uint8",
        Dtype::F32 => "float32",
    }
}

/// Number of discrete actions (None for a continuous space).
pub(crate) fn n_actions(space: &ActionSpace) -> Option<usize> {
    match space {
        ActionSpace::Discrete(n) => Some(*n),
        ActionSpace::Continuous { .. } => None,
    }
}
