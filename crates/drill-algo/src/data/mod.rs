//! Data between the collector and the learner: the replay buffer, n-step transitions, the
//! on-policy rollout and GAE.

mod frames;
mod gae;
mod nstep;
mod replay;
mod rollout;
mod sum_tree;

pub use frames::FrameStore;
pub use gae::gae;
pub use nstep::{NStep, Transition};
pub use replay::{Batch, ReplayBuffer};
pub use rollout::Rollout;
pub use sum_tree::SumTree;
