//! `drill launch`: torchrun's flags, for any program.

use std::path::PathBuf;
use std::time::Duration;

use drill_launch::{LaunchConfig, Outcome, launch};

/// Arguments of `drill launch` (torchrun's names; `_` spellings accepted too).
#[derive(clap::Args)]
pub struct Args {
    /// Ranks on this node: a number or `auto` (one per CPU core).
    #[arg(long, alias = "nproc_per_node", default_value = "1")]
    pub nproc_per_node: String,
    /// Nodes in the job: N, or MIN:MAX for an elastic job (needs --rdzv-endpoint): nodes may
    /// leave while MIN remain and join up to MAX; each change restarts the ranks from the
    /// newest checkpoint with the new world size.
    #[arg(long, default_value = "1")]
    pub nnodes: String,
    /// This node's index (static rendezvous; omit with --rdzv-endpoint to be assigned one).
    #[arg(long, alias = "node_rank")]
    pub node_rank: Option<usize>,
    /// Host of the rendezvous store (node 0).
    #[arg(long, alias = "master_addr", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Port of the rendezvous store.
    #[arg(long, alias = "master_port", default_value_t = 29500)]
    pub master_port: u16,
    /// HOST:PORT of the rendezvous store; node ranks are assigned in order of arrival.
    #[arg(long, alias = "rdzv_endpoint")]
    pub rdzv_endpoint: Option<String>,
    /// Job id (jobs sharing a store stay apart).
    #[arg(long, alias = "rdzv_id", default_value = "none")]
    pub rdzv_id: String,
    /// torchrun's rendezvous backend: `c10d` (drill's store at --rdzv-endpoint) or `static`
    /// (--node-rank and --master-addr); accepted so torchrun command lines run as written.
    #[arg(long, alias = "rdzv_backend", default_value = "c10d")]
    pub rdzv_backend: String,
    /// Elastic rendezvous settings, KEY=VALUE,... (torchrun's): join_timeout (600 s),
    /// last_call_timeout (30 s), keep_alive_interval (1 s), keep_alive_max_attempt (5).
    #[arg(long, alias = "rdzv_conf", default_value = "")]
    pub rdzv_conf: String,
    /// The address this node's listeners (the store, the ranks' connections) bind: by
    /// default loopback when the endpoint is loopback, else the interface that reaches it.
    #[arg(long)]
    pub bind: Option<std::net::IpAddr>,
    /// Single-node job on a free local port (ignores --master-addr/--master-port).
    #[arg(long)]
    pub standalone: bool,
    /// Restarts of the whole group after a rank fails (an elastic job's membership changes
    /// are not counted).
    #[arg(long, alias = "max_restarts", default_value_t = 0)]
    pub max_restarts: usize,
    /// Seconds between checks of the workers.
    #[arg(long, alias = "monitor_interval", default_value_t = 0.1)]
    pub monitor_interval: f64,
    /// Seconds between SIGTERM and SIGKILL when stopping workers.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// Rendezvous timeout in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub rdzv_timeout: f64,
    /// Write each rank's stdout and stderr to DIR/attempt_K/rank_N.{stdout,stderr}.
    #[arg(long, alias = "log_dir")]
    pub log_dir: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Run the job; returns the exit code the launcher ends with.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let nproc = match args.nproc_per_node.as_str() {
        "auto" | "cpu" => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        n => n
            .parse()
            .map_err(|_| anyhow::anyhow!("--nproc-per-node {n:?}: expected a number or `auto`"))?,
    };
    if !matches!(args.rdzv_backend.as_str(), "c10d" | "static") {
        anyhow::bail!(
            "--rdzv-backend {}: drill meets at its own store (torchrun's c10d shape, `c10d`) or by node rank (`static`); etcd is not supported",
            args.rdzv_backend
        );
    }
    let (nnodes, elastic) =
        drill_launch::parse_nnodes(&args.nnodes, &args.rdzv_conf).map_err(anyhow::Error::msg)?;
    let (master_addr, master_port, nnodes, elastic) = if args.standalone {
        (
            "127.0.0.1".to_string(),
            drill_comm::spawn::free_port(),
            1,
            None,
        )
    } else {
        (args.master_addr, args.master_port, nnodes, elastic)
    };
    let secs = |s: f64, flag: &str| {
        if s.is_finite() && s > 0.0 {
            Ok(Duration::from_secs_f64(s))
        } else {
            Err(anyhow::anyhow!("{flag} {s}: expected positive seconds"))
        }
    };
    let cfg = LaunchConfig {
        nproc_per_node: nproc,
        nnodes,
        node_rank: if args.rdzv_endpoint.is_some() {
            args.node_rank
        } else {
            Some(args.node_rank.unwrap_or(0))
        },
        master_addr,
        master_port,
        rdzv_endpoint: if args.standalone {
            None
        } else {
            args.rdzv_endpoint
        },
        rdzv_id: args.rdzv_id,
        max_restarts: args.max_restarts,
        monitor_interval: secs(args.monitor_interval, "--monitor-interval")?,
        grace: secs(args.grace, "--grace")?,
        log_dir: args.log_dir,
        timeout: secs(args.rdzv_timeout, "--rdzv-timeout")?,
        program: args.command[0].clone(),
        args: args.command[1..].to_vec(),
        env: Vec::new(),
        bind: args.bind,
        elastic,
        optional: Vec::new(),
    };
    let outcome = launch(&cfg)?;
    if let Outcome::Success { restarts } = &outcome
        && *restarts > 0
    {
        eprintln!("drill launch: succeeded after {restarts} restart(s)");
    }
    Ok(outcome.exit_code())
}
