//! A whole training run started from a config file, as `drill train` and Python's
//! `drill.train` start it: the config loaded with its overrides and checked against its
//! environment ([`prepare`]), one process or one rank of a data-parallel job trained into its
//! experiment folder ([`train_here`]), the folder closed with `result.json` ([`finish`]);
//! [`launch_ranks`] starts a data-parallel job's ranks on this machine.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drill_comm::ProcessGroup;
use drill_config::Config;
use drill_env::EnvSpec;
use drill_exp::Experiment;

use crate::compute::select_device;
use crate::context::{NullReporter, Reporter, RunContext, TrainResult};
use crate::error::TrainError;
use crate::resume::{self, RankStart};
pub use crate::resume::{StartOptions, open, restart_count};

/// A config ready to train: loaded, its environment's spec built once, checked.
pub struct Prepared {
    /// The resolved config.
    pub config: Config,
    /// Its environment's spec.
    pub spec: EnvSpec,
}

/// Size the process's tensor thread pool (rayon's global pool) to `n` threads; false when
/// it was already built (its size then stays; the pool can be sized once per process).
pub fn init_threads(n: usize) -> bool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .build_global()
        .is_ok()
}

/// Load `path` with `overrides` (`KEY=VALUE`, as `--set`), build its environment's spec,
/// size the tensor thread pool (`threads`, else chosen from the environment for `processes`
/// training processes on this machine: given, or a launcher's `LOCAL_WORLD_SIZE`, or 1),
/// then check that it fits in memory and fits its environment. Nothing is written.
pub fn prepare(
    path: &str,
    overrides: &[String],
    processes: Option<usize>,
    threads: Option<usize>,
) -> Result<Prepared, TrainError> {
    let config = Config::load(path, overrides)?;
    let spec = crate::envs::env_spec(&config)?;
    let local_ranks = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok());
    let processes = processes.or(local_ranks).unwrap_or(1);
    let n = threads.unwrap_or_else(|| crate::envs::default_threads(&spec, processes));
    if !init_threads(n) && rayon::current_num_threads() != n {
        tracing::warn!(
            "the tensor thread pool already has {} threads in this process; {n} were asked for",
            rayon::current_num_threads()
        );
    }
    // Before anything is built: a size that cannot fit is named, not hit.
    crate::memory::check(&config, &spec, processes)?;
    crate::dispatch::validate(&config, &spec)?;
    Ok(Prepared { config, spec })
}

/// What [`train_here`] leaves: the result and, on rank 0, the open experiment folder for
/// [`finish`].
pub struct Trained {
    /// The run's figures.
    pub result: TrainResult,
    /// The experiment folder (rank 0 only).
    pub exp: Option<Experiment>,
    /// This process's rank and the job's size (1 when training alone).
    pub rank: usize,
    /// Ranks in the job.
    pub world: usize,
}

/// Train `prepared` in this process: alone, or as one rank of the data-parallel job a
/// launcher started (`policy.multi_gpu`, the launcher's variables). With the caller's
/// [`crate::interrupt`] handlers, Ctrl-C and SIGTERM stop it after the current step with a
/// `final` checkpoint. `log_file` is
/// told this rank's log file once the folder is known. A failure is written to the folder's
/// `result.json` and returned, naming the rank in a job.
pub fn train_here(
    prepared: Prepared,
    opts: &StartOptions,
    save_replay: bool,
    log_file: &mut dyn FnMut(&Path),
) -> Result<Trained, TrainError> {
    let started = std::time::SystemTime::now();
    let Prepared { config, spec } = prepared;
    let device = select_device(&config)?;
    let dist = crate::ddp::join(&config)?;
    let rank = dist.as_ref().map_or(0, ProcessGroup::rank);
    let world = dist.as_ref().map_or(1, ProcessGroup::world_size);
    let whose = |e: TrainError| -> TrainError {
        if world > 1 {
            TrainError::InRank {
                rank,
                world,
                source: Box::new(e),
            }
        } else {
            e
        }
    };
    let restarts = resume::restart_count();
    let RankStart {
        mut exp,
        dir,
        resume,
    } = resume::for_rank(&config, opts, dist.as_ref(), restarts).map_err(whose)?;
    log_file(&dir.join("logs").join(format!("rank_{rank}.log")));
    let threads = rayon::current_num_threads();
    let precision = if drill_kernels::precision::enabled() {
        format!(
            ", bf16 products ({:?})",
            drill_kernels::precision::Level::current()
        )
    } else {
        String::new()
    };
    tracing::info!(
        "training {} on {} → {} (rank {rank} of {world}, {threads} thread{}{precision})",
        config.policy.kind(),
        config.env.id,
        dir.display(),
        if threads == 1 { "" } else { "s" }
    );
    if drill_kernels::precision::enabled()
        && rank == 0
        && let Some(why) = drill_kernels::precision::slow_here()
    {
        tracing::warn!("policy.precision = \"bf16\": {why}");
    }
    let mut null = NullReporter;
    let reporter: &mut dyn Reporter = match &mut exp {
        Some(e) => e,
        None => &mut null,
    };
    if rank == 1 && drill_plant::planted(drill_plant::Bug::RankExitsEarly) {
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(1500));
            std::process::exit(0)
        });
    }
    let trained = crate::dispatch::train(
        &config,
        &mut RunContext {
            device,
            spec,
            reporter,
            resume,
            dist,
            restarts,
            replay_dir: save_replay.then(|| dir.join("ckpt")),
        },
    );
    match trained {
        Ok(result) => Ok(Trained {
            result,
            exp,
            rank,
            world,
        }),
        Err(e) => {
            let e = whose(e);
            // The failed run's folder says why (a full disk lets this small file through
            // once the checkpoint that failed removed its temporary file): rank 0 writes it,
            // or, when rank 0 is the rank that was lost (killed, stopped, cut off), the rank
            // that noticed.
            let written = match &mut exp {
                Some(exp) => Some(exp.fail(&e.to_string(), world, restarts)),
                None if e.lost_rank() == Some(0) => Some(drill_exp::fail_in(
                    &dir,
                    &e.to_string(),
                    started,
                    world,
                    restarts,
                )),
                None => None,
            };
            if let Some(Err(write)) = written {
                tracing::warn!("cannot write {}/result.json: {write}", dir.display());
            }
            Err(e)
        }
    }
}

/// Close the folder: write `result.json`, log the outcome (after an interrupt, where it
/// stopped and `continue_with`, the way to continue it, given the folder); returns the
/// file's path.
pub fn finish(
    mut exp: Experiment,
    result: &TrainResult,
    continue_with: &dyn Fn(&Path) -> String,
) -> Result<PathBuf, TrainError> {
    exp.finish(result).map_err(|e| {
        TrainError::io(
            format!("cannot write {}/result.json", exp.dir().display()),
            e,
        )
    })?;
    if result.interrupted {
        // In an elastic job the launcher interrupts the ranks when a host joins, and starts
        // the next round from `final` itself.
        let next = match std::env::var("DRILL_ELASTIC") {
            Ok(range) => format!(
                "an elastic job (--nnodes {range}) goes on from it when its next round starts; after a Ctrl-C, continue with: {}",
                continue_with(exp.dir())
            ),
            Err(_) => format!("continue with: {}", continue_with(exp.dir())),
        };
        tracing::info!(
            "interrupted at env step {}, train iteration {} (last eval {:.1} ± {:.1}), `final` checkpoint written; {next}",
            result.env_steps,
            result.train_iters,
            result.eval_reward_mean,
            result.eval_reward_std,
        );
    } else {
        let stop = if result.stop_reached {
            "stop value reached"
        } else {
            "stopped at the step limit"
        };
        // A continued run also says its time with the runs before it.
        let total = match result.total_wall_seconds {
            Some(t) if t == result.wall_seconds => String::new(),
            Some(t) => format!(", {t:.0} s with the runs it continues"),
            None => ", the time before the resume unknown".into(),
        };
        tracing::info!(
            "{stop}: eval {:.1} ± {:.1} over {} episodes, {} env steps, {} iters, {:.2} s ({:.0} env steps/s){total}",
            result.eval_reward_mean,
            result.eval_reward_std,
            result.eval_episodes,
            result.env_steps,
            result.train_iters,
            result.wall_seconds,
            result.env_steps_per_sec
        );
    }
    Ok(exp.dir().join("result.json"))
}

/// The nodes of a multi-node job that `drill train --nnodes` launches this machine's share of.
#[derive(Clone, Debug)]
pub struct Nodes {
    /// Nodes in the job (the most, when elastic).
    pub nnodes: usize,
    /// `--nnodes MIN:MAX`: nodes may leave and join.
    pub elastic: Option<drill_launch::Elastic>,
    /// `HOST:PORT` of the store the nodes meet at (`--rdzv-endpoint`).
    pub endpoint: String,
    /// The job's id (`--rdzv-id`).
    pub id: String,
}

/// Start `n` ranks of a data-parallel job on this machine, each `program args` (a command
/// that trains one rank: `drill train ...`, or a Python interpreter running `drill.train`),
/// with the launcher's rendezvous on a free local port, or with `nodes` at their endpoint; a
/// failed rank stops the others, and the group restarts up to `max_restarts` times. Returns
/// the job's exit code.
pub fn launch_ranks(
    config: &Config,
    program: String,
    args: Vec<String>,
    n: usize,
    max_restarts: usize,
    nodes: Option<Nodes>,
) -> Result<i32, TrainError> {
    crate::ddp::check_data_parallel(config, "--nproc-per-node")?;
    let (nnodes, elastic, endpoint, id) = match nodes {
        Some(m) => (m.nnodes, m.elastic, Some(m.endpoint), m.id),
        None => (1, None, None, "drill-train".into()),
    };
    let outcome = drill_launch::launch(&drill_launch::LaunchConfig {
        nproc_per_node: n,
        nnodes,
        node_rank: endpoint.is_none().then_some(0),
        master_addr: "127.0.0.1".into(),
        master_port: drill_comm::spawn::free_port(),
        rdzv_endpoint: endpoint,
        rdzv_id: id,
        max_restarts,
        monitor_interval: Duration::from_millis(50),
        grace: Duration::from_secs(3),
        log_dir: None,
        timeout: Duration::from_secs(60),
        program,
        args,
        env: Vec::new(),
        bind: None,
        elastic,
        optional: Vec::new(),
    })?;
    match &outcome {
        drill_launch::Outcome::Success { restarts } if *restarts > 0 => {
            tracing::info!("training succeeded after {restarts} restart(s)")
        }
        // The ranks stop early on an interrupt (exit 130); all exiting 0 means the run had
        // finished when it came, as result.json says: the job succeeded.
        drill_launch::Outcome::Interrupted { finished: true, .. } => {
            tracing::info!("the run had finished when the interrupt came");
            return Ok(0);
        }
        _ => {}
    }
    Ok(outcome.exit_code())
}
