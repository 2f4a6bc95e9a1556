//! drill's reinforcement-learning algorithms and the data plumbing around them.
//!
//! - [`dqn`] and [`ppo`]: each algorithm in one file, read top to bottom.
//! - [`nets`]: the networks; [`optim`]: flat parameters and Adam.
//! - [`data`]: replay buffer, n-step returns, GAE; [`explore`]: epsilon schedules.

pub mod data;
pub mod explore;
pub mod nets;
pub mod optim;
