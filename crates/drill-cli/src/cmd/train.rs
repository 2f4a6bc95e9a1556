//! `drill train`: one process, one rank of a data-parallel job, or (with `--nproc-per-node`)
//! the launcher of such a job on this machine.

use anyhow::{Context, bail};
use drill_algo::checkpoint::Checkpoint;
use drill_algo::{NullReporter, Reporter, RunContext, TrainResult, run::select_device};
use drill_comm::{BackendKind, InitInfo, InitOptions, ProcessGroup};
use drill_config::Config;
use drill_exp::Experiment;
use drill_launch::{LaunchConfig, launch};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `drill train`.
#[derive(clap::Args)]
pub struct Args {
    /// Experiment config (TOML, DI-engine's tree: env / policy.learn / policy.collect / …).
    pub config: String,
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
    /// Continue from a checkpoint (model, optimizer and counters).
    #[arg(long)]
    pub resume: Option<PathBuf>,
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
    /// Split the pipeline over N worker processes (DI-engine's ditask): which roles
    /// (collector, learner, evaluator) run where comes from the config's `[task.roles]`
    /// (default: `[task] workers`).
    #[arg(long, alias = "parallel_workers", value_name = "N")]
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
    /// With --node-ids: the host of the runner that starts node 0 (it hosts the rendezvous).
    #[arg(long, alias = "master_addr", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// With --node-ids: the rendezvous port on that host.
    #[arg(long, alias = "master_port", default_value_t = 29500)]
    pub master_port: u16,
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

/// Store key (shared by every attempt of a launched job) holding the experiment folder.
const EXP_DIR_KEY: &str = "drill-train/exp_dir";

pub(crate) fn load_config(args: &Args) -> anyhow::Result<Config> {
    let mut overrides = args.set.clone();
    if let Some(seed) = args.seed {
        overrides.push(format!("seed={seed}"));
    }
    let config = Config::load(&args.config, &overrides)?;
    drill_algo::validate(&config)?;
    Ok(config)
}

/// Train; returns the process exit code.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let config = load_config(&args)?;
    let workers = args.parallel_workers.unwrap_or(config.task.workers);
    if workers > 0 {
        return crate::cmd::parallel::run(&args, config, workers);
    }
    if let Some(n) = args.nproc_per_node {
        return launch_ranks(&args, &config, n);
    }
    train_rank(&args, config)?;
    Ok(0)
}

/// `--nproc-per-node N`: start N copies of this command (without the flag) as ranks.
fn launch_ranks(args: &Args, config: &Config, n: usize) -> anyhow::Result<i32> {
    if n == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    if !config.policy.multi_gpu() {
        return Err(config
            .error(
                "policy.multi_gpu",
                "is false, but --nproc-per-node trains data-parallel: set `multi_gpu = true` in [policy] (or --set policy.multi_gpu=true)",
            )
            .into());
    }
    let mut child = vec!["train".to_string(), args.config.clone()];
    if let Some(s) = args.seed {
        child.extend(["--seed".into(), s.to_string()]);
    }
    for s in &args.set {
        child.extend(["--set".into(), s.clone()]);
    }
    if let Some(d) = &args.exp_dir {
        child.extend(["--exp-dir".into(), d.display().to_string()]);
    }
    if let Some(r) = &args.resume {
        child.extend(["--resume".into(), r.display().to_string()]);
    }
    if args.quiet {
        child.push("--quiet".into());
    }
    let program = std::env::current_exe()
        .context("cannot find the drill executable to start ranks")?
        .display()
        .to_string();
    let outcome = launch(&LaunchConfig {
        nproc_per_node: n,
        nnodes: 1,
        node_rank: Some(0),
        master_addr: "127.0.0.1".into(),
        master_port: drill_comm::spawn::free_port(),
        rdzv_endpoint: None,
        rdzv_id: "drill-train".into(),
        max_restarts: args.max_restarts,
        monitor_interval: Duration::from_millis(50),
        grace: Duration::from_secs(3),
        log_dir: None,
        timeout: Duration::from_secs(60),
        program,
        args: child,
        env: Vec::new(),
    })?;
    if let drill_launch::Outcome::Success { restarts } = &outcome
        && *restarts > 0
    {
        tracing::info!("training succeeded after {restarts} restart(s)");
    }
    Ok(outcome.exit_code())
}

/// Join the job the environment describes when `policy.multi_gpu` is on.
fn join(config: &Config) -> anyhow::Result<Option<ProcessGroup>> {
    let info = InitInfo::from_env()?;
    if info.world_size == 1 {
        if config.policy.multi_gpu() {
            tracing::info!(
                "policy.multi_gpu = true without a launcher: training as world size 1 (start ranks with `drill train CONFIG --nproc-per-node N`)"
            );
        }
        return Ok(None);
    }
    if !config.policy.multi_gpu() {
        return Err(config
            .error(
                "policy.multi_gpu",
                format!(
                    "is false, but this process is rank {} of {} (from {}): every rank would train alone; set `multi_gpu = true` in [policy]",
                    info.rank, info.world_size, info.source
                ),
            )
            .into());
    }
    let backend = if config.policy.cuda() {
        Some(BackendKind::Nccl)
    } else if std::env::var_os("DRILL_BACKEND").is_none()
        && cfg!(feature = "mpi")
        && (info.source.starts_with("OpenMPI") || info.source.starts_with("PMI"))
    {
        Some(BackendKind::Mpi)
    } else {
        None
    };
    let pg = ProcessGroup::init(InitOptions {
        backend,
        ..InitOptions::default()
    })
    .with_context(|| format!("rank {} cannot join the job", info.rank))?;
    Ok(Some(pg))
}

/// The checkpoint with the most train iterations among `final`, `latest` and `best` in
/// `dir/ckpt` (each is complete: written to a temporary file and renamed).
fn newest_checkpoint(dir: &Path) -> Option<Checkpoint> {
    let mut best: Option<(u64, Checkpoint)> = None;
    for name in ["final", "latest", "best"] {
        let path = dir.join("ckpt").join(format!("{name}.safetensors"));
        if !path.is_file() {
            continue;
        }
        match Checkpoint::load(&path).and_then(|ck| Ok((ck.counter("train_iters")?, ck))) {
            Ok((iters, ck)) if best.as_ref().is_none_or(|(b, _)| iters > *b) => {
                best = Some((iters, ck))
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("skipping {}: {e}", path.display()),
        }
    }
    best.map(|(_, ck)| ck)
}

/// Times the launcher restarted this group (`DRILL_RESTART_COUNT`, 0 when not launched).
pub(crate) fn restart_count() -> u32 {
    std::env::var("DRILL_RESTART_COUNT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The run's experiment folder and the checkpoint to start from: `previous` (a folder this
/// run already owns) is reopened — after restart `restarts` > 0 resuming from its newest
/// checkpoint — else a new folder is made at `--exp-dir` (default: the config's exp_name);
/// without a checkpoint from a restart, `--resume`'s.
pub(crate) fn open_experiment(
    args: &Args,
    config: &Config,
    previous: Option<&Path>,
    restarts: u32,
) -> anyhow::Result<(Experiment, Option<Checkpoint>)> {
    let mut resume = None;
    let exp = match previous {
        Some(dir) => {
            if restarts > 0 {
                resume = resume_after_restart(dir, restarts)?;
            }
            Experiment::reopen(dir, config, args.quiet)
                .with_context(|| format!("cannot reopen {}", dir.display()))?
        }
        None => {
            let dir = exp_dir(args, config);
            Experiment::create(&dir, config, args.quiet)
                .with_context(|| format!("cannot create experiment folder {}", dir.display()))?
        }
    };
    if resume.is_none() {
        resume = args.resume.as_deref().map(Checkpoint::load).transpose()?;
    }
    Ok((exp, resume))
}

/// `--exp-dir`, or the config's exp_name.
pub(crate) fn exp_dir(args: &Args, config: &Config) -> PathBuf {
    args.exp_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&config.exp_name))
}

/// After restart `restarts` of a group: the newest checkpoint in `dir`, said in the log.
fn resume_after_restart(dir: &Path, restarts: u32) -> anyhow::Result<Option<Checkpoint>> {
    let resume = newest_checkpoint(dir);
    match &resume {
        Some(ck) => tracing::info!(
            "restart {restarts}: resuming from {} (train iteration {}, env step {})",
            ck.path.display(),
            ck.counter("train_iters")?,
            ck.counter("env_steps")?
        ),
        None => tracing::info!(
            "restart {restarts}: no checkpoint in {} yet, starting over",
            dir.display()
        ),
    }
    Ok(resume)
}

/// Train as one process or one rank; rank 0 owns the experiment folder.
fn train_rank(args: &Args, config: Config) -> anyhow::Result<()> {
    let device = select_device(&config)?;
    let dist = join(&config)?;
    let rank = dist.as_ref().map_or(0, ProcessGroup::rank);
    let restarts = restart_count();
    let store = dist
        .as_ref()
        .and_then(|pg| pg.store().map(|s| s.unprefixed()));

    // Rank 0 picks the folder (the previous attempt's after a restart) and the checkpoint to
    // start from; the others learn both from it.
    let mut exp = None;
    let mut resume = None;
    if rank == 0 {
        let previous = match &store {
            Some(s) if restarts > 0 && s.check(&[EXP_DIR_KEY])? => Some(PathBuf::from(
                String::from_utf8_lossy(&s.get(EXP_DIR_KEY)?).into_owned(),
            )),
            _ => None,
        };
        let (e, r) = open_experiment(args, &config, previous.as_deref(), restarts)?;
        resume = r;
        if let Some(s) = &store {
            s.set(EXP_DIR_KEY, e.dir().display().to_string().as_bytes())?;
        }
        exp = Some(e);
    }
    let dir = match &dist {
        Some(pg) => PathBuf::from(pg.broadcast_object(
            exp.as_ref().map(|e| e.dir().display().to_string()).as_ref(),
            0,
        )?),
        None => exp.as_ref().expect("rank 0").dir().to_path_buf(),
    };
    if let Some(pg) = &dist {
        let bytes = pg.broadcast_object(
            (rank == 0)
                .then(|| resume.as_ref().map(|ck| (ck.path.clone(), ck.to_bytes())))
                .as_ref(),
            0,
        )?;
        if rank != 0 {
            resume = bytes
                .map(|(path, b)| Checkpoint::from_bytes(&b, &path))
                .transpose()?;
        }
    }
    let log = dir.join("logs").join(format!("rank_{rank}.log"));
    if let Err(e) = crate::log::also_to(&log) {
        tracing::warn!("cannot write {}: {e}", log.display());
    }
    let world = dist.as_ref().map_or(1, ProcessGroup::world_size);
    let whose = |e: drill_algo::TrainError| -> anyhow::Error {
        if world > 1 {
            anyhow::Error::new(e).context(format!("rank {rank} of {world}"))
        } else {
            e.into()
        }
    };
    tracing::info!(
        "training {} on {} → {} (rank {rank} of {world})",
        config.policy.kind(),
        config.env.id,
        dir.display()
    );
    let mut null = NullReporter;
    let reporter: &mut dyn Reporter = match &mut exp {
        Some(e) => e,
        None => &mut null,
    };
    let result = drill_algo::train(
        &config,
        &mut RunContext {
            device,
            reporter,
            resume,
            dist,
            restarts,
        },
    )
    .map_err(whose)?;
    let Some(exp) = exp else {
        return Ok(());
    };
    finish_experiment(exp, &result)
}

/// Write `result.json`, log the outcome and print the file's path (the last line of output).
pub(crate) fn finish_experiment(mut exp: Experiment, result: &TrainResult) -> anyhow::Result<()> {
    exp.finish(result)
        .with_context(|| format!("cannot write {}/result.json", exp.dir().display()))?;
    let stop = if result.stop_reached {
        "stop value reached"
    } else {
        "stopped at the step limit"
    };
    tracing::info!(
        "{stop}: eval {:.1} ± {:.1} over {} episodes, {} env steps, {} iters, {:.2} s ({:.0} env steps/s)",
        result.eval_reward_mean,
        result.eval_reward_std,
        result.eval_episodes,
        result.env_steps,
        result.train_iters,
        result.wall_seconds,
        result.env_steps_per_sec
    );
    println!("{}", exp.dir().join("result.json").display());
    Ok(())
}
