//! drill's reinforcement-learning algorithms and the data plumbing around them.
//!
//! - [`dqn`] and [`ppo`]: each algorithm in one file, read top to bottom.
//! - [`nets`]: the networks; [`optim`]: flat parameters and Adam.
//! - [`data`]: replay buffer, n-step returns, GAE; [`explore`]: epsilon schedules.
//! - [`eval`]: the evaluator; [`checkpoint`]: safetensors checkpoints.
//! - [`run`]: what a run reports ([`run::Reporter`]) and returns ([`run::TrainResult`]);
//!   [`train()`] picks the algorithm from the config.

pub mod checkpoint;
pub mod data;
pub mod dqn;
pub mod eval;
pub mod explore;
pub mod nets;
pub mod optim;
pub mod ppo;
pub mod run;

pub use run::{NullReporter, Progress, Reporter, RunContext, TrainError, TrainResult};

/// Train the algorithm `config.policy.type` names.
pub fn train(config: &drill_config::Config, ctx: &mut RunContext<'_>) -> Result<TrainResult, TrainError> {
    match &config.policy {
        drill_config::Policy::Dqn(p) => dqn::train(config, p, ctx),
        drill_config::Policy::Ppo(p) => ppo::train(config, p, ctx),
    }
}
