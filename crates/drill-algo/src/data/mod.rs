//! Data between the collector and the learner: the replay buffer, n-step transitions, the
//! on-policy rollout and a recurrent policy's state, GAE and V-trace; a replay buffer's file (`replay_file.rs`).

mod frame_store;
mod gae;
mod hidden;
mod nstep;
mod replay;
mod replay_file;
mod rollout;
mod sum_tree;
mod vtrace;

pub(crate) use gae::gae;
pub use hidden::Hidden;
pub(crate) use nstep::NStep;
pub use nstep::Transition;
pub use replay::{Batch, ReplayBuffer};
pub use replay_file::{Stamp, path_for as replay_path};
pub use rollout::Rollout;
pub(crate) use sum_tree::SumTree;
pub use vtrace::{Trajectory, VtraceClip, vtrace};
