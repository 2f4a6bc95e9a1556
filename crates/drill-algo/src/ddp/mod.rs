//! Data-parallel training (DI-engine's `multi_gpu`, torch's DDP) on drill-comm.
//!
//! - [`GradSync`]: the DDP wrapper. A [`Trainer`](crate::optim::Trainer) made distributed
//!   with [`Trainer::distribute`](crate::optim::Trainer::distribute) starts equal on every
//!   rank (rank 0's parameters are broadcast) and averages gradients in buckets after every
//!   backward, before its optimizer step.
//! - [`DistributedSampler`]: disjoint dataset shards per rank.
//! - [`SyncBatchNorm`]: batch statistics over every rank's batch.
//! - [`DataParallel`]: one process, several devices (batch split, gradients combined).
//!
//! The rank-aware parts of the RL loop (per-rank seeds, global counters, evaluation on rank 0)
//! live in [`crate::session`].

mod data_parallel;
mod grad_sync;
mod sampler;
mod sync_batch_norm;

pub use data_parallel::DataParallel;
pub use grad_sync::{DdpOptions, GradSync};
pub use sampler::DistributedSampler;
pub use sync_batch_norm::SyncBatchNorm;
