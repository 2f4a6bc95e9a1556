//! The task runtime (DI-engine's `ding.framework`): a [`Task`] runs a pipeline of
//! [`Middleware`] once per step over a fresh [`Context`] (with the fields marked to keep carried
//! over), times each middleware ([`StepTimer`]), carries [`Labels`] that decide what runs where,
//! and an [`EventBus`] for `emit` / `on` / `once` / `off` / `wait_for`, which [`parallel`] links
//! across processes.
//!
//! This crate knows nothing of RL beyond the context's counters: the built-in middlewares
//! (collectors, learners, evaluator, exchangers, ...) live in `drill_algo::middleware`, and
//! `drill train` is their composition. [`Mailbox`] queues events for a middleware that takes
//! them at its own pace.
//!
//! A middleware's `forward` is the code before DI-engine's `yield` (run in registration order),
//! its `backward` the code after it (run in reverse order):
//!
//! ```
//! use drill_task::{Task, OnlineRLContext};
//! let mut task = Task::<OnlineRLContext>::new();
//! task.use_fn("collect", |ctx, _| { ctx.env_step += 8; Ok(()) });
//! task.use_fn("train", |ctx, _| { ctx.train_iter += 1; Ok(()) });
//! let ctx = task.run(Some(3)).unwrap();
//! assert_eq!((ctx.env_step, ctx.train_iter), (24, 3));
//! ```

mod ctx;
mod error;
mod events;
mod handle;
mod labels;
mod mailbox;
pub mod parallel;
mod stage;
mod task;
mod timer;

#[cfg(test)]
mod fuzz;

pub use ctx::{Context, Extensions, OnlineRLContext};
pub use error::TaskError;
pub use events::{Event, EventBus, HandlerId};
pub use handle::TaskHandle;
pub use labels::Labels;
pub use mailbox::Mailbox;
pub use stage::{Shared, Stage};
pub use task::{Middleware, Task};
pub use timer::{StepTimer, TimerStats};
