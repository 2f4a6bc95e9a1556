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
//! [`Experiment`] implements [`drill_algo::Reporter`], so algorithms report into it without
//! knowing about files.

mod experiment;
mod tensorboard;

pub use experiment::Experiment;
pub use tensorboard::{EventWriter, read_scalars};
