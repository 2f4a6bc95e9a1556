//! `drill launch`: torchrun for any program. Starts this node's ranks with the env protocol
//! (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
//! DRILL_RESTART_COUNT, DRILL_MAX_RESTARTS, DRILL_JOB_TOKEN; DRILL_ELASTIC=MIN:MAX in an elastic
//! job), hosts the rendezvous store, prefixes and logs their
//! output, and on a failure stops the group and restarts it or exits with a summary. With
//! `--nnodes MIN:MAX` the job is elastic ([`Elastic`]): nodes may leave and join it.

mod elastic;
mod output;
mod rendezvous;
mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use elastic::{Elastic, parse_nnodes};
pub use rendezvous::Placement;
pub use workers::Failure;

/// What to launch and how (torchrun's flags).
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Ranks on this node.
    pub nproc_per_node: usize,
    /// Nodes in the job (the most, when elastic).
    pub nnodes: usize,
    /// This node's index (static rendezvous); `None` = assigned at rendezvous.
    pub node_rank: Option<usize>,
    /// Host of the store (static rendezvous).
    pub master_addr: String,
    /// Port of the store.
    pub master_port: u16,
    /// `HOST:PORT` of the rendezvous store (dynamic node ranks).
    pub rdzv_endpoint: Option<String>,
    /// Job id separating jobs that share a store.
    pub rdzv_id: String,
    /// Group restarts allowed after a failure.
    pub max_restarts: usize,
    /// How often workers are checked.
    pub monitor_interval: Duration,
    /// Time between SIGTERM and SIGKILL when stopping workers.
    pub grace: Duration,
    /// Per-rank stdout/stderr files go under `DIR/attempt_K/`.
    pub log_dir: Option<PathBuf>,
    /// Rendezvous timeout.
    pub timeout: Duration,
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables for every worker.
    pub env: Vec<(String, String)>,
    /// The address every listener of the job binds on this node (`--bind`); `None`: loopback
    /// for a loopback endpoint, else the interface that reaches the endpoint
    /// (`drill_comm::net::listen_ip`).
    pub bind: Option<std::net::IpAddr>,
    /// `--nnodes MIN:MAX`: nodes may leave and join (needs `rdzv_endpoint`).
    pub elastic: Option<Elastic>,
    /// Ranks that may exit with an error without ending the attempt (a split run's
    /// collectors): their exit is logged and the others go on.
    pub optional: Vec<usize>,
}

/// Errors that stop the launcher itself (not a worker's failure).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Bad flags or environment.
    #[error("{0}")]
    Usage(String),
    /// Rendezvous or store failure.
    #[error("rendezvous: {0}")]
    Comm(#[from] drill_comm::CommError),
    /// Could not start a worker or write a log.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// How the job ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank of every node exited 0.
    Success {
        /// Restarts used.
        restarts: usize,
    },
    /// Out of restarts: the first failure of the last attempt.
    Failed {
        /// Which rank failed and how.
        failure: Failure,
        /// Restarts used.
        restarts: usize,
    },
    /// The launcher got a signal and stopped every worker.
    Interrupted {
        /// The signal number.
        signal: i32,
        /// Every rank exited 0: they had finished when the signal reached them (a program
        /// that stops early on the signal, as `drill train` does, exits otherwise).
        finished: bool,
    },
}

impl Outcome {
    /// The exit code the launcher should end with (the failing worker's, 128+signal for a
    /// signal, as shells report them).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Success { .. } => 0,
            Outcome::Failed { failure, .. } => failure.exit_code(),
            Outcome::Interrupted { signal, .. } => 128 + signal,
        }
    }
}

/// Run the job to its end.
pub fn launch(cfg: &LaunchConfig) -> Result<Outcome, LaunchError> {
    if cfg.nproc_per_node == 0
        || cfg.nnodes == 0
        || cfg.elastic.as_ref().is_some_and(|e| e.min_nodes == 0)
    {
        return Err(LaunchError::Usage(
            "--nproc-per-node and --nnodes must be at least 1".into(),
        ));
    }
    if let Some(r) = cfg.node_rank
        && r >= cfg.nnodes
    {
        return Err(LaunchError::Usage(format!(
            "--node-rank {r} is not below --nnodes {}",
            cfg.nnodes
        )));
    }
    let token = match std::env::var("DRILL_JOB_TOKEN") {
        Ok(t) if !t.is_empty() => t,
        _ if cfg.nnodes > 1 => {
            return Err(LaunchError::Usage(
                "a multi-node job needs DRILL_JOB_TOKEN set to the same secret on every node"
                    .into(),
            ));
        }
        _ => drill_comm::Token::generate(),
    };
    let signal = Arc::new(workers::Signals::default());
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        let s = signal.clone();
        // Record the signal; the monitor loop forwards it to the workers.
        // SAFETY: the handler only stores into an atomic (`Signals::record`), which is
        // async-signal-safe: no allocation, no lock.
        unsafe {
            signal_hook::low_level::register(sig, move || s.record(sig)).map_err(|e| {
                LaunchError::Io {
                    context: "install signal handlers".into(),
                    source: e,
                }
            })?;
        }
    }
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        eprintln!(
            "drill launch: setting OMP_NUM_THREADS=1 for every rank (as torchrun does); set it yourself to change that"
        );
    }
    if let Some(el) = &cfg.elastic {
        if cfg.rdzv_endpoint.is_none() {
            return Err(LaunchError::Usage(format!(
                "--nnodes {}:{} needs --rdzv-endpoint HOST:PORT (the store every node meets at)",
                el.min_nodes, el.max_nodes
            )));
        }
        return elastic::run(cfg, el, &token, &signal);
    }
    let mut rdzv = rendezvous::Rendezvous::join(cfg, &token)?;
    let mut restarts = 0;
    loop {
        let placement = rdzv.next_round(restarts)?;
        let mut peers = workers::Attempt {
            rdzv: &rdzv,
            round: restarts,
        };
        let result = workers::run_round(cfg, &placement, &token, restarts, &mut peers, &signal)?;
        match result {
            // A static job's membership does not change; all ranks exiting 0 is success.
            workers::RoundEnd::Success | workers::RoundEnd::Changed(true) => {
                rdzv.finish(restarts);
                return Ok(Outcome::Success { restarts });
            }
            workers::RoundEnd::Interrupted(signal, finished) => {
                return Ok(Outcome::Interrupted { signal, finished });
            }
            workers::RoundEnd::Changed(false) => {
                return Err(LaunchError::Usage(
                    "a static rendezvous cannot change its membership".into(),
                ));
            }
            workers::RoundEnd::Failed(failure) => {
                eprintln!("drill launch: {failure}");
                if restarts >= cfg.max_restarts {
                    eprintln!(
                        "drill launch: giving up after {restarts} restart(s) (--max-restarts {})",
                        cfg.max_restarts
                    );
                    return Ok(Outcome::Failed { failure, restarts });
                }
                restarts += 1;
                eprintln!(
                    "drill launch: restarting the group (attempt {restarts} of {})",
                    cfg.max_restarts
                );
            }
        }
    }
}
