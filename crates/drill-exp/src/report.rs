//! What a training run reports ([`Reporter`], [`Progress`]) and returns ([`TrainResult`]):
//! the interface between the algorithms (drill-algo) and the experiment folder.

use crate::checkpoint::{Checkpoint, CheckpointError};
use serde::{Deserialize, Serialize};

/// Receives what a run measures. The `drill` binary writes TensorBoard events, the metrics log,
/// checkpoints and the progress bar from these calls; tests can ignore them ([`NullReporter`]).
pub trait Reporter {
    /// A scalar under a CleanRL-style tag (`charts/episodic_return`, `losses/td_error`, …)
    /// at env step `step`.
    fn scalar(&mut self, tag: &str, value: f64, step: u64);
    /// Counters for the progress display; called often, keep it cheap.
    fn progress(&mut self, progress: &Progress);
    /// Persist the checkpoint `build` makes under `name` (`latest`, `best` or `final`). A
    /// reporter may skip `latest` when it wrote one recently; `build` runs only if it writes.
    fn checkpoint(
        &mut self,
        name: &str,
        build: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<(), CheckpointError>;
}

/// A reporter that drops everything.
pub struct NullReporter;

impl Reporter for NullReporter {
    fn scalar(&mut self, _: &str, _: f64, _: u64) {}
    fn progress(&mut self, _: &Progress) {}
    fn checkpoint(
        &mut self,
        _: &str,
        _: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<(), CheckpointError> {
        Ok(())
    }
}

/// Counters shown while training.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Progress {
    /// Env steps collected.
    pub env_steps: u64,
    /// Gradient updates done.
    pub train_iters: u64,
    /// Mean return of the last evaluation.
    pub last_eval: Option<f64>,
    /// Env steps per second since the start.
    pub env_steps_per_sec: f64,
    /// `max_env_step`, for a bar length.
    pub max_env_step: Option<u64>,
}

/// The outcome of a run, written as `result.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainResult {
    /// An evaluation reached `env.stop_value`.
    pub stop_reached: bool,
    /// Env steps collected.
    pub env_steps: u64,
    /// Gradient updates done.
    pub train_iters: u64,
    /// Wall-clock seconds of this run (after a resume: since it continued).
    pub wall_seconds: f64,
    /// Seconds of training to this result: this run's and those of the runs it continues,
    /// each counted up to the checkpoint the next one started from (a checkpoint's
    /// `train_seconds`). `None` (`null`) when a checkpoint continued from predates the
    /// count, or when the run failed.
    #[serde(default)]
    pub total_wall_seconds: Option<f64>,
    /// Env steps collected by this run (after a resume: since its checkpoint) / `wall_seconds`.
    pub env_steps_per_sec: f64,
    /// Mean return of the last evaluation.
    pub eval_reward_mean: f64,
    /// Standard deviation of the last evaluation's returns.
    pub eval_reward_std: f64,
    /// Episodes in the last evaluation.
    pub eval_episodes: usize,
    /// Ranks that trained together.
    pub world_size: usize,
    /// Times the group was restarted.
    pub restarts: u32,
    /// The run stopped on SIGINT/SIGTERM (its `final` checkpoint continues it).
    #[serde(default)]
    pub interrupted: bool,
    /// Why the run failed (a full disk, a lost rank, …); absent when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
