//! Data-parallel training (DI-engine's `multi_gpu`, torch's DDP) on drill-comm.
//!
//! - The DDP wrapper lives with the optimiser (`optim/grad_sync.rs`, options
//!   [`DdpOptions`](crate::optim::DdpOptions)): a [`Trainer`](crate::optim::Trainer) made
//!   distributed with [`Trainer::distribute`](crate::optim::Trainer::distribute) starts equal
//!   on every rank (rank 0's parameters are broadcast) and averages gradients in buckets
//!   after every backward, before its optimizer step.
//! - [`DistributedSampler`]: disjoint dataset shards per rank.
//! - [`SyncBatchNorm`]: batch statistics over every rank's batch.
//! - [`DataParallel`]: one process, several devices (batch split, gradients combined).
//! - [`Ranks`]: the group as the pipeline sees it. Every collective the RL pipeline issues
//!   goes through it (summed env steps, rank 0's decisions and evaluation, averaged learner
//!   scalars, gathered generator states), from the middlewares in [`crate::middleware`];
//!   per-rank seeds are set in [`crate::envs`] and `resume`.
//! - `setup.rs`: joining the launcher's job (`join`), the ranks a pipeline starts with, the
//!   config's DDP options and per-rank batch split (`split`).

mod data_parallel;
mod ranks;
mod sampler;
mod setup;
mod sync_batch_norm;

pub use data_parallel::DataParallel;
pub use ranks::Ranks;
pub use sampler::DistributedSampler;
pub(crate) use setup::{check_data_parallel, options, setup};
pub(crate) use setup::{join, learner_group, split};
pub use sync_batch_norm::SyncBatchNorm;
