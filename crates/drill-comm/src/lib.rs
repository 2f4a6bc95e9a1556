//! drill-comm: torch.distributed for Rust.
//!
//! - [`Store`]: the TCP rendezvous key-value store (hosted by rank 0 or `drill launch`).
//! - [`ProcessGroup`]: typed collectives (broadcast, all_reduce, reduce, all_gather, gather,
//!   scatter, reduce_scatter, barrier, send/recv), serde object collectives, async [`Work`],
//!   sub-groups. [`DistContext`] is the scoped guard.
//! - [`backend`]: the engines. `embedded` (default: shared memory on one host, TCP between
//!   hosts), `mpi` (feature), `nccl` (feature).
//!
//! On the embedded and NCCL backends everything that blocks has a timeout, a dead peer fails
//! every rank's collectives within a moment naming it, and every connection is authenticated
//! with the job token. The MPI backend has none of that of its own: MPI calls block without a
//! timeout, and a rank that dies is handled by the launcher (OpenMPI's `mpirun` aborts the
//! whole job when any rank exits abnormally, naming it; `srun` likewise with `--kill-on-bad-exit`).
//! `DRILL_DEBUG_COLLECTIVES=1` checks, on every backend, that all ranks issue the same
//! collective at the same point ([`backend::checked`]).
//!
//! ```no_run
//! use drill_comm::{ProcessGroup, ReduceOp};
//! let pg = ProcessGroup::from_env()?;
//! let mut grads = vec![1.0f32; 1024];
//! pg.all_reduce(&mut grads, ReduceOp::Avg)?;
//! # Ok::<(), drill_comm::CommError>(())
//! ```

pub mod auth;
pub mod backend;
pub mod dtype;
pub mod env;
pub mod error;
pub mod group;
pub mod net;
pub mod spawn;
pub mod store;
pub mod work;

#[cfg(test)]
mod fuzz;

pub use auth::Token;
pub use backend::BackendKind;
pub use dtype::{DType, Element, ReduceOp};
pub use env::InitInfo;
pub use error::{CommError, Result};
pub use group::{DistContext, InitOptions, ProcessGroup};
pub use half::{bf16, f16};
pub use store::{Store, StoreServer};
pub use work::Work;
