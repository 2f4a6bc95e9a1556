//! Data between the collector and the learner: the replay buffer, n-step transitions and GAE.

mod gae;
mod nstep;
mod replay;
mod sum_tree;

pub use gae::gae;
pub use nstep::{NStep, Transition};
pub use replay::{Batch, ReplayBuffer};
pub use sum_tree::SumTree;
