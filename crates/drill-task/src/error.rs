//! [`TaskError`]: why a task, a middleware or an event wait failed.

use std::time::Duration;

/// Why a task stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A middleware failed.
    #[error("middleware '{middleware}' ({phase}) at step {step}: {source}")]
    Middleware {
        /// Its name.
        middleware: String,
        /// `forward`, `backward` or `stage`.
        phase: &'static str,
        /// The task step.
        step: u64,
        /// What it returned.
        source: Box<TaskError>,
    },
    /// `wait_for` saw no event in time.
    #[error("wait_for({event:?}) got nothing within {timeout:?}")]
    Timeout {
        /// The awaited event.
        event: String,
        /// The limit.
        timeout: Duration,
    },
    /// A peer process was lost while waiting for an event.
    #[error("wait_for({event:?}): {detail}")]
    PeerLost {
        /// The awaited event.
        event: String,
        /// Which peer and how.
        detail: String,
    },
    /// A payload could not be encoded or decoded.
    #[error("event {event:?}: payload {detail}")]
    Payload {
        /// The event.
        event: String,
        /// The serde error.
        detail: String,
    },
    /// The Parallel runner got a signal and its workers stopped (after an interrupt they
    /// save and exit on their own; a second signal stops them at once).
    #[error("interrupted by signal {signal}")]
    Interrupted {
        /// The signal number.
        signal: i32,
    },
    /// The Parallel runner's workers failed past its restart budget: the last attempt's
    /// first failure, after `restarts` restarts.
    #[error("parallel runner: {failure}")]
    WorkersFailed {
        /// Which worker failed and how.
        failure: String,
        /// Restarts used.
        restarts: usize,
    },
    /// A middleware's own error, as a message.
    #[error("{0}")]
    Msg(String),
    /// A middleware's own error, typed (a caller finds it with [`TaskError::find`]).
    #[error(transparent)]
    Source(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl TaskError {
    /// An error with a message, for middlewares.
    pub fn msg(s: impl Into<String>) -> Self {
        TaskError::Msg(s.into())
    }

    /// A middleware's typed error, kept as the source so callers can match on it.
    pub fn source(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        TaskError::Source(Box::new(e))
    }

    /// The first error of type `E` in this error's chain (through failed middlewares and
    /// typed sources), e.g. a training error a middleware returned.
    pub fn find<E: std::error::Error + 'static>(&self) -> Option<&E> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(hit) = e.downcast_ref::<E>() {
                return Some(hit);
            }
            cur = match e.downcast_ref::<TaskError>() {
                Some(TaskError::Middleware { source, .. }) => Some(source.as_ref()),
                Some(TaskError::Source(b)) => Some(b.as_ref()),
                _ => e.source(),
            };
        }
        None
    }
}
