//! The experiment folder a training run writes:
//!
//! ```text
//! EXP_DIR/
//!   config.toml        resolved configuration (every default written out)
//!   tb/events.out.tfevents.*   TensorBoard scalars
//!   metrics.jsonl      the same scalars, one JSON object per line
//!   ckpt/{latest,best,final}.safetensors   checkpoints (temp file + rename)
//!   result.json        the run's outcome
//! ```
//!
//! [`Experiment`] implements [`Reporter`], so algorithms (drill-algo, which depends on this
//! crate) report into it without knowing about files. [`Checkpoint`] is the checkpoint file
//! format. No tensor library is needed to write or read any of it.

pub mod checkpoint;
mod experiment;
mod report;
mod tensorboard;

pub use checkpoint::{Checkpoint, CheckpointError};
pub use experiment::{Experiment, suspend_bar};
pub use report::{NullReporter, Progress, Reporter, TrainResult};
pub use tensorboard::{EventWriter, read_scalars};
