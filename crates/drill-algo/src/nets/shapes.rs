//! Which observations a network here takes ([`ObsShape`]) and the shapes a config gives
//! (`policy.model.obs_shape`, `action_shape`) checked against the environment's.

use crate::error::TrainError;
use drill_config::Config;
use drill_env::EnvSpec;

/// The observations a network here encodes: vectors, or frames `[channels, height, width]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ObsShape {
    /// Vectors of this size.
    Vector(usize),
    /// Frames.
    Frames([usize; 3]),
}

impl ObsShape {
    /// The observations of the environment `spec` describes, or an error naming `env.id` for
    /// a shape no network here encodes (`algo`: the algorithm, for the message).
    pub(crate) fn of(cfg: &Config, spec: &EnvSpec, algo: &str) -> Result<Self, TrainError> {
        match spec.obs.shape[..] {
            [n] => Ok(Self::Vector(n)),
            [c, h, w] => Ok(Self::Frames([c, h, w])),
            ref shape => Err(cfg
                .error(
                    "env.id",
                    format!(
                        "{} observes shape {shape:?}; {algo} encodes vectors or [channels, height, width] frames",
                        spec.id
                    ),
                )
                .into()),
        }
    }
}

/// Check `policy.model.obs_shape` / `action_shape` (when given) against the environment's
/// (`env`: observation shape, action count or dimension).
pub(crate) fn check_shapes(
    cfg: &Config,
    given: (Option<&drill_config::Shape>, Option<usize>),
    env: (&[usize], usize),
) -> Result<(), TrainError> {
    let show = |d: &[usize]| match d {
        [n] => n.to_string(),
        d => format!("{d:?}"),
    };
    if let Some(g) = given.0.map(|s| s.dims()).filter(|g| g != env.0) {
        return Err(cfg
            .error(
                "policy.model.obs_shape",
                format!("is {} but {} has {}", show(&g), cfg.env.id, show(env.0)),
            )
            .into());
    }
    if let Some(g) = given.1.filter(|&g| g != env.1) {
        return Err(cfg
            .error(
                "policy.model.action_shape",
                format!("is {g} but {} has {}", cfg.env.id, env.1),
            )
            .into());
    }
    Ok(())
}
