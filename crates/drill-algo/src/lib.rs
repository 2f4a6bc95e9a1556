//! drill's reinforcement-learning algorithms and the data plumbing around them.
//!
//! - [`dqn`], [`ppo`], `sac.rs`: each algorithm in one file, read top to bottom: its
//!   networks' use, exploration, update and pipeline. Each implements [`policy::Policy`].
//! - [`policy`]: the one abstraction every middleware takes (collect, eval, learn, state).
//! - [`middleware`]: the built-in, generic middlewares the pipelines are composed of.
//! - [`nets`]: the networks; [`optim`]: flat parameters and Adam; [`compute`]: the device a
//!   run uses and drill-kernels' layers as burn operations.
//! - [`data`]: replay buffer, n-step returns, rollouts, GAE; `explore.rs`: epsilon schedules.
//! - [`eval`]: the evaluator; [`checkpoint`]: safetensors checkpoints; [`session`]: the
//!   setup every pipeline shares; [`start`]: the experiment folder and checkpoint a run (or
//!   a restarted rank) starts from.
//! - [`ddp`]: data-parallel training (gradient averaging, the ranks as the pipeline sees
//!   them, distributed sampler).
//! - [`TrainError`] (`error.rs`) and [`checkpoint::CheckpointError`], below everything else;
//!   [`interrupt`]: Ctrl-C / SIGTERM asking a run to stop after its step; `memory.rs`: what a
//!   config will allocate, checked against the machine before anything is built.
//! - [`inference`]: a trained policy loaded for inference (Python's `drill.load`).
//! - [`entry`]: a whole run from a config file, as `drill train` and Python's `drill.train`
//!   start it (load and check, train here or launch ranks, close the folder).
//! - `run.rs`: what a run reports ([`Reporter`]) and returns ([`TrainResult`]);
//!   [`train()`], [`evaluate()`] and their siblings (`dispatch.rs`) pick the algorithm from
//!   the config.
//!
//! Modules call down only, in the layers ARCHITECTURE.md lists (a test in drill-cli checks
//! them against the sources).

pub mod checkpoint;
pub mod compute;
pub mod data;
pub mod ddp;
mod dispatch;
pub mod dqn;
pub mod entry;
mod error;
pub mod eval;
mod explore;
pub mod export;
pub mod inference;
pub mod interrupt;
mod memory;
pub mod middleware;
pub mod nets;
pub mod optim;
pub mod policy;
pub mod ppo;
mod run;
mod sac;
pub mod session;
pub mod start;

pub use dispatch::{check_splittable, evaluate, train, train_roles, validate};
pub use error::TrainError;
pub use run::{NullReporter, Progress, Reporter, RunContext, TrainResult};

/// Notes the largest allocation of each fuzzed input (see `drill_fuzz`).
#[cfg(test)]
#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;
