//! What a training run reports and returns: [`Reporter`], [`Progress`], [`TrainResult`]
//! (built by [`crate::middleware::run_result`]), and the context an algorithm runs in
//! ([`RunContext`]); its error type is [`crate::error::TrainError`].

use crate::checkpoint::Checkpoint;
use burn::tensor::Device;
pub use drill_exp::{NullReporter, Progress, Reporter, TrainResult};

/// Where and how an algorithm runs.
pub struct RunContext<'a> {
    /// Compute device ([`crate::compute::select_device`]: the CPU, or a GPU for `policy.cuda`).
    pub device: Device,
    /// The environment's spec, built once by the caller ([`crate::session::env_spec`]) and
    /// used by everything the run sets up.
    pub spec: drill_env::EnvSpec,
    /// Receives scalars, progress and checkpoints.
    pub reporter: &'a mut dyn Reporter,
    /// Continue from this checkpoint (parameters, optimizer, counters).
    pub resume: Option<Checkpoint>,
    /// The process group for data-parallel training (`policy.multi_gpu`); `None` or a group
    /// of one trains alone.
    pub dist: Option<drill_comm::ProcessGroup>,
    /// Times the group was restarted (`DRILL_RESTART_COUNT`), for `result.json`.
    pub restarts: u32,
    /// `--save-replay`: the checkpoint folder where each rank saves its replay buffer with
    /// the final checkpoint (off-policy algorithms).
    pub replay_dir: Option<std::path::PathBuf>,
}
