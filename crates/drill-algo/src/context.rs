//! What a training run runs in and gives back: the context an algorithm runs in
//! ([`RunContext`]), the task its pipeline runs on ([`task`]), what it reports and returns
//! (drill-exp's `Reporter`, `Progress`, `TrainResult`, built by `middleware::run_result`); its
//! error type is `TrainError`.

use crate::checkpoint::Checkpoint;
use burn::tensor::Device;
use drill_config::Config;
pub(crate) use drill_exp::{NullReporter, Progress, Reporter, TrainResult};
use drill_task::{OnlineRLContext, Task};

/// Where and how an algorithm runs.
pub struct RunContext<'a> {
    /// Compute device ([`crate::compute::select_device`]: the CPU, or a GPU for `policy.cuda`).
    pub device: Device,
    /// The environment's spec, built once by the caller ([`crate::envs::env_spec`]) and
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

/// A pipeline's task: `task` (a new one, or one on a Parallel runner's bus) with
/// `[task] step_timer` applied and the counters a run starts from (a resumed checkpoint's)
/// set.
pub(crate) fn task<'a>(
    cfg: &Config,
    mut task: Task<'a, OnlineRLContext>,
    env_step: u64,
    train_iter: u64,
) -> Task<'a, OnlineRLContext> {
    if cfg.task.step_timer > 0 {
        task.step_timer(cfg.task.step_timer);
    }
    task.ctx_mut().env_step = env_step;
    task.ctx_mut().train_iter = train_iter;
    task
}
