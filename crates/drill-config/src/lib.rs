//! drill's experiment configuration: a TOML tree shaped like DI-engine's
//! (`env` / `policy.model` / `policy.learn` / `policy.collect` / `policy.eval` / `policy.other`).
//!
//! [`Config::load`] reads a file, applies `--set key.path=value` overrides, rejects unknown keys
//! (naming the key path and the nearest valid key) and out-of-range values (naming the key path),
//! and fills every omitted key with its default. [`Config::to_toml`] writes the resolved tree.
//!
//! Each algorithm's hyper-parameters are one struct ([`DqnPolicy`], [`PpoPolicy`], [`SacPolicy`]); their field
//! docs are the reference for the config keys.

mod check;
mod error;
mod policy;
mod tree;

pub use error::ConfigError;
pub use policy::*;
pub use tree::{
    Config, EnvConfig, Policy, REDIS_PASSWORD_ADVICE, TASK_ROLES, TaskConfig, url_has_password,
};

#[cfg(test)]
mod fuzz;
