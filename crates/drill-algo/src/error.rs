//! [`TrainError`] (why a run stopped): the error every layer of the crate returns, at the
//! bottom of its module graph. [`CheckpointError`] is drill-exp's (the checkpoint file).

pub(crate) use drill_exp::CheckpointError;

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The configuration does not fit the environment or build.
    #[error(transparent)]
    Config(#[from] drill_config::ConfigError),
    /// The environment could not be built.
    #[error(transparent)]
    Env(#[from] drill_env::EnvError),
    /// The loss became NaN or infinite.
    #[error(
        "non-finite loss ({value}) at train iteration {iter}; the last good checkpoint is kept"
    )]
    NonFinite {
        /// Train iteration where it happened.
        iter: u64,
        /// The loss value.
        value: f64,
    },
    /// A file or folder of the run (its experiment folder) could not be written or read.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the path.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A collective failed (a rank died, timed out or disagreed).
    #[error(transparent)]
    Comm(#[from] drill_comm::CommError),
    /// A middleware of the training pipeline failed (its name and step are in the message).
    #[error(transparent)]
    Task(#[from] drill_task::TaskError),
    /// A data-parallel job's ranks could not be started.
    #[error(transparent)]
    Launch(#[from] drill_launch::LaunchError),
    /// A rank of a data-parallel job failed.
    #[error("rank {rank} of {world}: {source}")]
    InRank {
        /// The rank.
        rank: usize,
        /// Ranks in the job.
        world: usize,
        /// What failed.
        source: Box<TrainError>,
    },
    /// A middleware asked a policy for something it does not have.
    #[error("policy {policy} has no {what}")]
    Unsupported {
        /// The policy's name.
        policy: &'static str,
        /// What was asked for.
        what: &'static str,
    },
    /// A parameter got another gradient after its bucket's all-reduce started during the
    /// backward pass (`optim/overlap.rs`): the model's backward pass changed between steps.
    #[error(
        "DDP: parameter {tensor} got another gradient after its bucket's all-reduce started during the backward pass (the backward pass differs from the first step's); train with DdpOptions {{ overlap: false }}"
    )]
    LateGradient {
        /// The parameter, in visit order's name.
        tensor: String,
    },
    /// Parameters are no longer identical across ranks.
    #[error(
        "DDP: parameter {tensor} differs between rank 0 and rank {rank} after optimizer step {step} (ranks ran different updates or a nondeterministic op)"
    )]
    Diverged {
        /// First differing tensor, in visit order.
        tensor: String,
        /// First rank that differs from rank 0.
        rank: usize,
        /// Steps since the trainer was distributed.
        step: u64,
    },
}

impl TrainError {
    /// An I/O failure while doing `what` (which names the path).
    pub fn io(what: impl Into<String>, source: std::io::Error) -> TrainError {
        TrainError::Io {
            what: what.into(),
            source,
        }
    }

    /// The training error underneath: a failed middleware's typed error when this is a task
    /// failure wrapping one (e.g. [`TrainError::NonFinite`] from the learner), through a
    /// rank's [`TrainError::InRank`]; else itself.
    pub fn cause(&self) -> &TrainError {
        match self {
            TrainError::Task(t) => t.find::<TrainError>().map_or(self, TrainError::cause),
            TrainError::InRank { source, .. } => source.cause(),
            _ => self,
        }
    }

    /// The rank this error says was lost (gone, or silent past a deadline), if a collective
    /// failed that way. A rank that left in order (`PeerLeft`) was not lost: it stopped on an
    /// error of its own and reports that, the root cause, itself.
    pub(crate) fn lost_rank(&self) -> Option<usize> {
        match self.cause() {
            TrainError::Comm(
                drill_comm::CommError::PeerLost { rank, .. }
                | drill_comm::CommError::Timeout { rank, .. },
            ) => Some(*rank),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drill_comm::CommError;

    /// Only a rank that died or went silent is written up by the rank that noticed; one that
    /// left in order writes its own error (a full disk must not become "rank 0 is gone").
    #[test]
    fn a_rank_that_left_in_order_is_not_lost() {
        let (op, group) = ("all_reduce".to_string(), "world".to_string());
        let gone = TrainError::Comm(CommError::PeerLost {
            op: op.clone(),
            group: group.clone(),
            rank: 0,
            detail: "its connection closed".into(),
        });
        let left = TrainError::Comm(CommError::PeerLeft { op, group, rank: 0 });
        assert_eq!(gone.lost_rank(), Some(0));
        assert_eq!(left.lost_rank(), None);
    }
}
