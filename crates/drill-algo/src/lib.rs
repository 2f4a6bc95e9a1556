//! drill's reinforcement-learning algorithms and the data plumbing around them.
//!
//! - [`dqn`], [`ppo`], [`appo`], `sac.rs`: each algorithm in one file, read top to bottom: its
//!   networks' use, exploration, update and pipeline. Each implements [`policy::Policy`].
//! - [`policy`]: the one abstraction every middleware takes (collect, eval, learn, state).
//! - [`middleware`]: the built-in, generic middlewares the pipelines are composed of.
//! - [`nets`]: the networks; [`optim`]: flat parameters and Adam; [`compute`]: the device a
//!   run uses and drill-kernels' layers as burn operations.
//! - [`data`]: replay buffer, n-step returns, rollouts, GAE, V-trace; `explore.rs`: epsilon schedules.
//! - [`eval`]: the evaluator; [`checkpoint`]: safetensors checkpoints.
//! - A run's parts, in the order a run meets them: [`runner`] (a whole run from a config
//!   file, as `drill train` and Python's `drill.train` start it: load and check, train here
//!   or launch ranks, close the folder); `resume` (the experiment folder and checkpoint a
//!   run or restarted rank starts from, and the state restored from it); [`envs`] (the run's
//!   environments and evaluator, each rank seeded apart); [`ddp`]'s `setup.rs` (joining the
//!   job, the ranks); `context.rs` (what a run runs in, reports ([`Reporter`]) and returns
//!   ([`TrainResult`])); `dispatch.rs` ([`validate`], [`train()`], [`evaluate()`]: the
//!   algorithm the config names).
//! - [`ddp`]: data-parallel training (gradient averaging, the ranks as the pipeline sees
//!   them, distributed sampler).
//! - [`TrainError`] (`error.rs`) and [`checkpoint::CheckpointError`], below everything else;
//!   [`interrupt`]: Ctrl-C / SIGTERM asking a run to stop after its step; `memory.rs`: what a
//!   config will allocate, checked against the machine before anything is built.
//! - [`inference`]: a trained policy loaded for inference (Python's `drill.load`).
//!
//! Modules call down only, in the layers ARCHITECTURE.md lists (a test in drill-cli checks
//! them against the sources).

#![warn(unreachable_pub)]

pub mod appo;
pub mod checkpoint;
pub mod compute;
mod context;
pub mod data;
pub mod ddp;
mod dispatch;
pub mod dqn;
pub mod envs;
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
mod resume;
pub mod runner;
mod sac;

pub use context::RunContext;
pub use dispatch::{check_splittable, evaluate, train, train_roles, validate};
pub use drill_exp::{NullReporter, Progress, Reporter, TrainResult};
pub use error::TrainError;

/// Notes the largest allocation of each fuzzed input (see `drill_fuzz`).
#[cfg(test)]
#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;
