//! What a training run reports and returns: [`Reporter`], [`Progress`], [`TrainResult`],
//! [`TrainError`], and the context an algorithm runs in ([`RunContext`]).

use crate::checkpoint::Checkpoint;
pub use crate::error::TrainError;
use burn::tensor::Device;
pub use drill_exp::{NullReporter, Progress, Reporter, TrainResult};

/// Where and how an algorithm runs.
pub struct RunContext<'a> {
    /// Compute device (CPU flex, or CUDA when built with it).
    pub device: Device,
    /// Receives scalars, progress and checkpoints.
    pub reporter: &'a mut dyn Reporter,
    /// Continue from this checkpoint (parameters, optimizer, counters).
    pub resume: Option<Checkpoint>,
    /// The process group for data-parallel training (`policy.multi_gpu`); `None` or a group
    /// of one trains alone.
    pub dist: Option<drill_comm::ProcessGroup>,
    /// Times the group was restarted (`DRILL_RESTART_COUNT`), for `result.json`.
    pub restarts: u32,
}

/// The device for `policy.cuda`: flex on CPU, or CUDA device 0 when built with `--features cuda`.
pub fn select_device(config: &drill_config::Config) -> Result<Device, TrainError> {
    if config.policy.cuda() {
        #[cfg(feature = "cuda")]
        return Ok(Device::cuda(0));
        #[cfg(not(feature = "cuda"))]
        return Err(config
            .error("policy.cuda", "this drill binary was built without CUDA; rebuild with `cargo build --release --features cuda`")
            .into());
    }
    Ok(Device::flex())
}
