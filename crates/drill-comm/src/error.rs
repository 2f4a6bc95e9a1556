//! The one error type of drill-comm: every variant names who failed and where.

use std::io;
use std::time::Duration;

/// Result alias used across drill-comm.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

/// What went wrong in a rendezvous, a store request or a collective.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// A peer process is gone (its connection closed or reset).
    #[error("{op} on group '{group}': {} is gone ({detail})", peer_name(*.rank))]
    PeerLost {
        /// The operation that noticed it.
        op: String,
        /// The group's name.
        group: String,
        /// The global rank of the lost peer.
        rank: usize,
        /// What was observed (EOF, reset, abort notice from another rank).
        detail: String,
    },
    /// A peer left the group in order (it said goodbye) while this rank still waited on it:
    /// it stopped on a reason of its own, which it reports itself.
    #[error(
        "{op} on group '{group}': rank {rank} left the group while this rank still waits on it (it stopped on an error of its own, which it reports)"
    )]
    PeerLeft {
        /// The operation that noticed it.
        op: String,
        /// The group's name.
        group: String,
        /// The global rank that left.
        rank: usize,
    },
    /// A blocking call ran past its deadline.
    #[error(
        "{op} on group '{group}' timed out after {timeout:?} waiting for rank {rank} (set DRILL_TIMEOUT or the group's timeout to wait longer)"
    )]
    Timeout {
        /// The operation.
        op: String,
        /// The group's name.
        group: String,
        /// The peer that was waited on.
        rank: usize,
        /// The timeout in force.
        timeout: Duration,
    },
    /// A peer sent bytes that are not what the operation expects.
    #[error("{op} on group '{group}': protocol error from rank {rank}: {detail}")]
    Protocol {
        /// The operation.
        op: String,
        /// The group's name.
        group: String,
        /// The peer that sent the bad frame.
        rank: usize,
        /// What was wrong.
        detail: String,
    },
    /// Ranks issued different collectives at the same point (`DRILL_DEBUG_COLLECTIVES=1`).
    #[error("collectives out of step on group '{group}' at call {call}: {calls}")]
    Desync {
        /// The group's name.
        group: String,
        /// The group's collective counter (1 = its first collective).
        call: u64,
        /// Every rank's call, `rank N: op(...)`, comma separated.
        calls: String,
    },
    /// The caller passed arguments that cannot work (sizes, ranks, roots).
    #[error("{op}: {detail}")]
    Usage {
        /// The operation.
        op: String,
        /// What is wrong with the arguments.
        detail: String,
    },
    /// The process environment does not describe a job.
    #[error("environment: {0}")]
    Env(String),
    /// A connection could not be authenticated (wrong or missing DRILL_JOB_TOKEN).
    #[error("authentication with {peer} failed: {detail}")]
    Auth {
        /// Address or rank of the other side.
        peer: String,
        /// What failed.
        detail: String,
    },
    /// A store request failed.
    #[error("store at {addr}: {detail}")]
    Store {
        /// The store's address.
        addr: String,
        /// What failed.
        detail: String,
    },
    /// A backend is not compiled in or its libraries cannot be loaded.
    #[error("backend {backend}: {detail}")]
    Backend {
        /// Backend name (tcp, mpi, nccl).
        backend: &'static str,
        /// What is missing.
        detail: String,
    },
    /// An object could not be (de)serialised.
    #[error("{op}: object encoding: {detail}")]
    Object {
        /// The operation.
        op: String,
        /// The serde error.
        detail: String,
    },
    /// An operating-system error outside a collective (binding, mapping shared memory).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl CommError {
    /// Wrap an io error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        CommError::Io {
            context: context.into(),
            source,
        }
    }

    /// Build a usage error.
    pub fn usage(op: &str, detail: impl Into<String>) -> Self {
        CommError::Usage {
            op: op.to_string(),
            detail: detail.into(),
        }
    }

    /// The dead or misbehaving peer this error names, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            CommError::PeerLost { rank, .. }
            | CommError::PeerLeft { rank, .. }
            | CommError::Timeout { rank, .. }
            | CommError::Protocol { rank, .. } => Some(*rank),
            _ => None,
        }
    }
}

/// How an error names a peer: "rank N" (the campaign's planted bug says "a peer").
fn peer_name(rank: usize) -> String {
    if drill_plant::planted(drill_plant::Bug::ErrorNamesNoRank) {
        "a peer".into()
    } else {
        format!("rank {rank}")
    }
}
