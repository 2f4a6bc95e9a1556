//! The experiment folder a training run writes:
//!
//! ```text
//! EXP_DIR/
//!   config.toml        resolved configuration (every default written out)
//!   tb/events.out.tfevents.*   TensorBoard scalars
//!   metrics.jsonl      the same scalars, one JSON object per line
//!   ckpt/{latest,best,final}.safetensors   checkpoints (durable: temp file, fsync, rename)
//!   result.json        the run's outcome (durable, as checkpoints; `error` when it failed)
//! ```
//!
//! [`Experiment`] implements [`Reporter`], so algorithms (drill-algo, which depends on this
//! crate) report into it without knowing about files. [`Checkpoint`] is the checkpoint file
//! format. No tensor library is needed to write or read any of it.

pub mod checkpoint;
pub mod durable;
mod experiment;
mod report;
mod tensorboard;

pub use checkpoint::{Checkpoint, CheckpointError, TRAIN_SECONDS};
pub use experiment::{
    Experiment, RESUMED_ITER_TAG, RESUMED_TAG, fail_after_workers, fail_in, suspend_bar,
};
pub use report::{NullReporter, Progress, Reporter, TrainResult};
pub use tensorboard::{EventWriter, read_scalars};

/// Notes the largest allocation of each fuzzed input (see `drill_fuzz`).
#[cfg(test)]
#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;
