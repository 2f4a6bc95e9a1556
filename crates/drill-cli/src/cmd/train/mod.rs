//! `drill train`: its arguments and the dispatch to one process or one rank of a
//! data-parallel job ([`ranks`], also the `--nproc-per-node` launcher), or a pipeline split
//! over processes ([`parallel`]). Both start from drill-algo's [`drill_algo::resume`] (the
//! experiment folder and checkpoint) and end in [`finish`].

mod finish;
pub(crate) mod parallel;
mod ranks;

use std::path::PathBuf;

/// Arguments of `drill train`.
#[derive(clap::Args)]
pub struct Args {
    /// Experiment config (TOML, DI-engine's tree: env / policy.learn / policy.collect / …);
    /// omitted with `--resume EXP_DIR`, which continues with the config that folder holds.
    #[arg(required_unless_present = "resume")]
    pub config: Option<String>,
    /// Override the config's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override any config key, e.g. `--set policy.learn.batch_size=128` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Experiment folder (default: the config's exp_name). An existing one is never
    /// overwritten: a suffixed sibling is used instead.
    #[arg(long)]
    pub exp_dir: Option<PathBuf>,
    /// Continue a run: an experiment folder (its newest checkpoint, in that folder, with the
    /// config.toml it holds; `--set` still applies and is written there), or a checkpoint
    /// file (model, optimizer and counters) to start a new run from.
    #[arg(long, value_name = "EXP_DIR|CHECKPOINT")]
    pub resume: Option<PathBuf>,
    /// Save each rank's replay buffer (DQN, SAC) with the final checkpoint, as stored (u8
    /// frames once each, f32 vectors), as `ckpt/replay_rank{R}.safetensors`; `--resume` of
    /// that checkpoint restores it instead of starting from an empty buffer.
    #[arg(long)]
    pub save_replay: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Train data-parallel on N ranks of this machine (needs `policy.multi_gpu = true`):
    /// `drill train` launches them itself, as `drill launch --nproc-per-node N -- drill train`.
    #[arg(long, alias = "nproc_per_node", value_name = "N")]
    pub nproc_per_node: Option<usize>,
    /// With --nproc-per-node: after a rank fails, restart the group up to R times; it resumes
    /// from the run's newest checkpoint in the same folder.
    #[arg(long, alias = "max_restarts", value_name = "R", default_value_t = 0)]
    pub max_restarts: usize,
    /// Nodes of a multi-node data-parallel job, this machine being one (with
    /// --rdzv-endpoint; --nproc-per-node ranks here, 1 by default): N, or MIN:MAX for an
    /// elastic job whose nodes may leave (while MIN remain) and join (up to MAX), each change
    /// restarting the ranks from the newest checkpoint with the new world size. As `drill
    /// launch --nnodes`; the experiment folder must be one path every node reaches.
    #[arg(long, value_name = "N|MIN:MAX")]
    pub nnodes: Option<String>,
    /// With --nnodes: `HOST:PORT` of the store the nodes meet at (the node that can bind it
    /// hosts it and must stay for the whole job).
    #[arg(
        long,
        alias = "rdzv_endpoint",
        value_name = "HOST:PORT",
        requires = "nnodes"
    )]
    pub rdzv_endpoint: Option<String>,
    /// With --nnodes: the job's id (jobs sharing a store stay apart).
    #[arg(long, alias = "rdzv_id", default_value = "drill-train")]
    pub rdzv_id: String,
    /// With --nnodes MIN:MAX: KEY=VALUE,... as `drill launch --rdzv-conf`.
    #[arg(long, alias = "rdzv_conf", default_value = "")]
    pub rdzv_conf: String,
    /// Split the pipeline over N worker processes (DI-engine's ditask): which roles
    /// (collector, learner, evaluator) run where comes from the config's `[task.roles]`
    /// (default: `[task] workers`).
    #[arg(
        long,
        alias = "parallel_workers",
        value_name = "N",
        conflicts_with = "nproc_per_node"
    )]
    pub parallel_workers: Option<usize>,
    /// How the workers are linked (default: `[task] topology`, else star).
    #[arg(long, value_enum)]
    pub topology: Option<TopologyArg>,
    /// Extra labels for every worker, comma-separated (also `DRILL_LABELS`); `[task.roles]`
    /// patterns match them.
    #[arg(long, value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Under `--topology alone`: node NODE links to PEER,... (repeatable), e.g. `0=1,2`.
    #[arg(long = "attach-to", alias = "attach_to", value_name = "NODE=PEER,...")]
    pub attach_to: Vec<String>,
    /// Start only these workers here (contiguous, an equal share of --parallel-workers, e.g.
    /// `--node-ids 2,3` of 4); the same command with the other ids on other machines starts
    /// the rest. Needs a shared `DRILL_JOB_TOKEN`.
    #[arg(
        long = "node-ids",
        alias = "node_ids",
        value_delimiter = ',',
        value_name = "ID,..."
    )]
    pub node_ids: Vec<usize>,
    /// With --node-ids or --join: the host of the runner that starts node 0 (it hosts the
    /// rendezvous).
    #[arg(long, alias = "master_addr", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The rendezvous port on that host (with --node-ids, default 29500; a run started on one
    /// machine takes a free one unless given, and needs it given to be joined).
    #[arg(long, alias = "master_port")]
    pub master_port: Option<u16>,
    /// With --parallel-workers N: join the running split run at --master-addr:--master-port
    /// (its token in DRILL_JOB_TOKEN) as one more collector; the run goes on when it leaves.
    #[arg(long, requires = "parallel_workers", conflicts_with = "node_ids")]
    pub join: bool,
    /// What carries events between the workers: `tcp` or `redis` (default: `[task] mq_type`).
    #[arg(long = "mq-type", alias = "mq_type", value_name = "tcp|redis")]
    pub mq_type: Option<String>,
    /// The Redis server for `--mq-type redis` (default: `[task] redis_url`).
    #[arg(long = "redis-url", alias = "redis_url", value_name = "URL")]
    pub redis_url: Option<String>,
    /// Who starts the workers: `local` (this command, on this machine) or `slurm` (run the
    /// command under `srun -n N`; node ids and the store's host come from SLURM_*).
    #[arg(long, value_enum, default_value = "local")]
    pub platform: PlatformArg,
}

/// `--topology`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum TopologyArg {
    /// Workers connect to node 0, which relays every event.
    Star,
    /// Every worker connects to every other.
    Mesh,
    /// Only `--attach-to` links.
    Alone,
}

/// `--platform`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlatformArg {
    /// This command starts the workers.
    Local,
    /// Slurm started them.
    Slurm,
}

/// The run's config, checked, and its environment's spec (built here, once for the whole
/// run); sizes the tensor thread pool first (`threads`, else chosen from the environment,
/// shared among this machine's training processes): [`drill_algo::runner::prepare`].
pub(crate) fn load_config(
    args: &Args,
    threads: Option<usize>,
) -> anyhow::Result<drill_algo::runner::Prepared> {
    let mut overrides = args.set.clone();
    if let Some(seed) = args.seed {
        overrides.push(format!("seed={seed}"));
    }
    Ok(drill_algo::runner::prepare(
        &args.config_path()?,
        &overrides,
        args.nproc_per_node.or(args.parallel_workers),
        threads,
    )?)
}

impl Args {
    /// The config to load: CONFIG, or with `--resume EXP_DIR` the folder's config.toml. A
    /// `--resume` path that does not exist is refused here, before anything is written.
    fn config_path(&self) -> anyhow::Result<String> {
        let folder = match &self.resume {
            Some(p) if !p.exists() => anyhow::bail!(
                "--resume {}: no such experiment folder or checkpoint file",
                p.display()
            ),
            Some(p) if p.is_dir() => Some(p),
            _ => None,
        };
        if let (Some(dir), Some(other)) = (folder, &self.exp_dir) {
            anyhow::bail!(
                "--resume {} continues the run in that folder; drop --exp-dir {}",
                dir.display(),
                other.display()
            );
        }
        match (&self.config, folder) {
            (Some(c), None) => Ok(c.clone()),
            (None, Some(dir)) => {
                let path = dir.join("config.toml");
                if !path.is_file() {
                    anyhow::bail!(
                        "--resume {}: not an experiment folder (it has no config.toml)",
                        dir.display()
                    );
                }
                Ok(path.display().to_string())
            }
            (Some(c), Some(dir)) => anyhow::bail!(
                "--resume {} continues that folder's run with the config it holds: drop CONFIG ({c}), or give --resume a checkpoint file to start a new run from",
                dir.display()
            ),
            (None, None) => anyhow::bail!(
                "--resume {}: a checkpoint file needs a CONFIG for the new run (or give an experiment folder)",
                self.resume
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display()
            ),
        }
    }

    /// What the user asked of the experiment folder and the starting checkpoint.
    fn start_options(&self) -> drill_algo::runner::StartOptions {
        drill_algo::runner::StartOptions {
            exp_dir: self.exp_dir.clone(),
            resume: self.resume.clone(),
            quiet: self.quiet,
        }
    }
}

/// Train with `threads` intra-op threads (None: chosen from the config); returns the process
/// exit code.
pub fn run(args: Args, threads: Option<usize>) -> anyhow::Result<i32> {
    let prepared = load_config(&args, threads)?;
    let config = &prepared.config;
    if args.save_replay && config.policy.kind() == "ppo" {
        anyhow::bail!(
            "--save-replay: policy.type {:?} keeps no replay buffer (DQN and SAC do)",
            config.policy.kind()
        );
    }
    let workers = args.parallel_workers.unwrap_or(config.task.workers);
    if workers > 0 && args.nproc_per_node.is_some() {
        return Err(config
            .error(
                "task.workers",
                format!("is {workers}, which splits the pipeline over processes; --nproc-per-node trains data-parallel and does not combine with it (set `workers = 0` in [task])"),
            )
            .into());
    }
    if workers > 0 {
        let drill_algo::runner::Prepared { config, spec } = prepared;
        return parallel::run(&args, config, &spec, workers);
    }
    if let Some(n) = args.nproc_per_node.or(args.nnodes.as_ref().map(|_| 1)) {
        return ranks::launch_ranks(&args, config, n);
    }
    ranks::train_rank(&args, prepared)
}
