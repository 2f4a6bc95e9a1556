//! [`Roles`]: which parts of a pipeline this process runs (all of them, or its share under
//! `drill train --parallel-workers N`).

use std::time::Duration;

use drill_task::{TaskError, TaskHandle};

/// The parts of the pipeline this process runs. Built-in pipelines register only the
/// middlewares of these roles, plus the exchangers that reach the roles run elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct Roles {
    /// Steps the environments and produces transitions.
    pub collector: bool,
    /// Trains, owns checkpoints and the experiment folder, decides when the run ends.
    pub learner: bool,
    /// Evaluates the learner's weights.
    pub evaluator: bool,
    /// Under the Parallel runner: how the processes cooperate (`None`: one process).
    pub remote: Option<Remote>,
}

/// How processes of a parallel run cooperate.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    /// This worker's node id.
    pub node: usize,
    /// This worker's place among the collector workers (seeds its environments and
    /// generator as a DDP rank's would be).
    pub collector_index: usize,
    /// Collector workers in the run (the evaluator is seeded after all of them).
    pub collectors: usize,
    /// Steps a collector may run ahead of the weights it acts with (`task.model_staleness`).
    pub model_staleness: u64,
    /// The learner sends a remote collector weights every this many steps
    /// (`task.model_every`).
    pub model_every: u64,
    /// Give up waiting for another process after this long (a lost one ends waits at once).
    pub timeout: Duration,
}

impl Roles {
    /// Everything in this process.
    pub fn all() -> Self {
        Self {
            collector: true,
            learner: true,
            evaluator: true,
            remote: None,
        }
    }

    /// The roles among `task`'s labels (`collector`, `learner`, `evaluator`), for a process of
    /// a parallel run.
    pub fn from_labels(task: &TaskHandle, remote: Remote) -> Result<Self, TaskError> {
        let has = |r: &str| task.match_labels(&[r]);
        Ok(Self {
            collector: has("collector")?,
            learner: has("learner")?,
            evaluator: has("evaluator")?,
            remote: Some(remote),
        })
    }

    /// The roles taken, by name (`collector`, `learner`, `evaluator`).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.collector, "collector"),
            (self.learner, "learner"),
            (self.evaluator, "evaluator"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }

    /// The collector runs in another process.
    pub fn collector_elsewhere(&self) -> bool {
        self.remote.is_some() && !self.collector
    }

    /// The evaluator runs in another process.
    pub fn evaluator_elsewhere(&self) -> bool {
        self.remote.is_some() && !self.evaluator
    }

    /// The learner runs in another process.
    pub fn learner_elsewhere(&self) -> bool {
        self.remote.is_some() && !self.learner
    }
}
