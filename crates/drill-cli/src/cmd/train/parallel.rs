//! `drill train --parallel-workers N`: the training pipeline split over N worker processes
//! (DI-engine's `ditask`). `[task.roles]` says which roles each worker runs; the learner's
//! worker owns the experiment folder and decides when the run ends.

use std::path::PathBuf;

use anyhow::{Context, bail};
use drill_algo::compute::select_device;
use drill_algo::middleware::RolePlan;
use drill_algo::{NullReporter, Reporter, RunContext};
use drill_config::Config;
use drill_env::EnvSpec;
use drill_exp::Experiment;
use drill_task::parallel::{Mq, Parallel, Platform, Topology};
use drill_task::{OnlineRLContext, TaskError};

use super::finish::finish_experiment;
use super::{Args, PlatformArg, TopologyArg};

/// The experiment folder the parent claimed, for the learner's worker.
const EXP_DIR_ENV: &str = "DRILL_EXP_DIR";

/// Start (or, under Slurm, be) the workers; returns the exit code.
pub fn run(args: &Args, config: Config, env_spec: &EnvSpec, n: usize) -> anyhow::Result<i32> {
    let topology = match args.topology {
        Some(TopologyArg::Star) => Topology::Star,
        Some(TopologyArg::Mesh) => Topology::Mesh,
        Some(TopologyArg::Alone) => Topology::Alone,
        None => match config.task.topology.as_str() {
            "mesh" => Topology::Mesh,
            "alone" => Topology::Alone,
            _ => Topology::Star,
        },
    };
    drill_algo::check_splittable(&config)?;
    let plan = RolePlan::new(&config, &args.labels, n)?;
    let mq = match args.mq_type.as_deref().unwrap_or(&config.task.mq_type) {
        "tcp" => Mq::Tcp,
        "redis" => Mq::Redis {
            url: match &args.redis_url {
                Some(url) if drill_config::url_has_password(url) => {
                    bail!("--redis-url {}", drill_config::REDIS_PASSWORD_ADVICE)
                }
                Some(url) => url.clone(),
                None => config.task.redis_url.clone(),
            },
        },
        other => bail!("--mq-type {other:?}: expected tcp or redis"),
    };
    if matches!(mq, Mq::Redis { .. }) && !cfg!(feature = "redis") {
        return Err(config
            .error(
                "task.mq_type",
                "is \"redis\", but this drill was built without Redis: rebuild with `cargo build --release --features redis`",
            )
            .into());
    }
    let mut runner = Parallel::runner(n)
        .mq(mq)
        .topology(topology)
        .labels(args.labels.clone())
        .auto_recover(args.max_restarts)
        .platform(match args.platform {
            PlatformArg::Local => Platform::Local,
            PlatformArg::Slurm => Platform::Slurm,
        });
    for spec in &args.attach_to {
        let (node, peers) = parse_attach(spec, n)?;
        runner = runner.attach_to(node, &peers);
    }
    // A collector may leave or die and others may join, unless it holds a learner too or
    // is a star's hub (the others' events pass through it).
    let may_leave: Vec<usize> = plan
        .collectors()
        .iter()
        .copied()
        .filter(|c| !(plan.learners().contains(c) || (topology == Topology::Star && *c == 0)))
        .collect();
    runner = runner.may_leave(&may_leave);
    if args.join {
        if matches!(
            args.mq_type.as_deref().unwrap_or(&config.task.mq_type),
            "redis"
        ) {
            bail!(
                "--join: a collector joins over direct links, but this run's events go through Redis (`task.mq_type`)"
            );
        }
        return join(args, &config, env_spec, n, runner, &plan, topology);
    }
    if let Some(port) = args.master_port
        && args.node_ids.is_empty()
    {
        runner = runner.master_port(port);
    }
    let mut local: Vec<usize> = (0..n).collect();
    if !args.node_ids.is_empty() {
        let (first, last) = (args.node_ids[0], args.node_ids[args.node_ids.len() - 1]);
        if args.node_ids.iter().zip(first..).any(|(&a, b)| a != b) {
            bail!("--node-ids {:?}: must be consecutive", args.node_ids);
        }
        let port = args.master_port.unwrap_or(29500);
        runner = runner
            .node_ids(first..last + 1, &args.master_addr, port)
            .map_err(|e| anyhow::anyhow!("--node-ids: {e}"))?;
        local = args.node_ids.clone();
    }
    let learner_here = local.contains(&plan.learner());
    let mut claimed = None;
    if args.platform == PlatformArg::Local && !drill_task::parallel::in_worker() && learner_here {
        // The parent claims the folder so that a restarted group writes into the same one
        // (`--resume EXP_DIR`: that folder, which the learner continues in).
        let dir = match args.resume.as_deref().filter(|p| p.is_dir()) {
            Some(dir) => dir.to_path_buf(),
            None => {
                let dir = args.start_options().exp_dir(&config);
                Experiment::reserve(&dir)
                    .with_context(|| format!("cannot create experiment folder {}", dir.display()))?
            }
        };
        runner = runner.env(EXP_DIR_ENV, &dir.display().to_string());
        claimed = Some(dir);
    }
    let mut interrupted = false;
    let ran = runner.run::<OnlineRLContext>(|task| {
        interrupted =
            worker(args, &config, env_spec, task.handle().clone(), &plan, n).map_err(|e| {
                // The chain (e.g. which middleware, which peer) is the message.
                TaskError::msg(format!("{e:#}"))
            })?;
        Ok(())
    });
    match ran {
        // The workers stopped on a signal; the learner's said where and how to continue.
        Err(TaskError::Interrupted { .. }) => Ok(130),
        Err(TaskError::WorkersFailed { failure, restarts }) => {
            // The learner's worker says why in result.json; killed, it said nothing, and
            // the folder would keep an earlier attempt's word (or none).
            let error = format!("parallel runner: {failure}");
            if let Some(dir) = &claimed
                && let Err(w) = drill_exp::fail_after_workers(dir, &error, n, restarts as u32)
            {
                tracing::warn!("cannot write {}/result.json: {w}", dir.display());
            }
            Err(anyhow::anyhow!("{error}"))
        }
        Err(e) => Err(anyhow::anyhow!("{e}")),
        Ok(()) if interrupted => Ok(130),
        Ok(()) => Ok(0),
    }
}

/// `--join`: be one more collector of the split run at `--master-addr:--master-port`, linked
/// to the learner (to the hub under a star); returns the exit code.
fn join(
    args: &Args,
    config: &Config,
    env_spec: &EnvSpec,
    n: usize,
    runner: Parallel,
    plan: &RolePlan,
    topology: Topology,
) -> anyhow::Result<i32> {
    let Some(port) = args.master_port else {
        bail!("--join: give the run's --master-port (and --master-addr when it runs elsewhere)");
    };
    // Under a star through its hub; else to every learner (the one it feeds follows from the
    // node id it is given).
    let dial = match topology {
        Topology::Star => vec![0],
        Topology::Mesh | Topology::Alone => plan.learners().to_vec(),
    };
    let mut interrupted = false;
    runner
        .join::<OnlineRLContext>(&args.master_addr, port, &dial, |task| {
            let handle = task.handle().clone();
            let roles = plan.joined(config, &handle);
            interrupted = worker_with(args, config, env_spec, handle, roles, n)
                .map_err(|e| TaskError::msg(format!("{e:#}")))?;
            Ok(())
        })
        .map_err(|e| anyhow::anyhow!("--join: {e}"))?;
    Ok(if interrupted { 130 } else { 0 })
}

/// `NODE=PEER,PEER`, each one of the `n` workers, a node never its own peer.
pub(crate) fn parse_attach(spec: &str, n: usize) -> anyhow::Result<(usize, Vec<usize>)> {
    let bad = || anyhow::anyhow!("--attach-to {spec:?}: expected NODE=PEER[,PEER...], e.g. 0=1,2");
    let (node, peers) = spec.split_once('=').ok_or_else(bad)?;
    let node: usize = node.trim().parse().map_err(|_| bad())?;
    let peers: Vec<usize> = peers
        .split(',')
        .map(|p| p.trim().parse().map_err(|_| bad()))
        .collect::<anyhow::Result<_>>()?;
    if let Some(w) = std::iter::once(node)
        .chain(peers.iter().copied())
        .find(|&w| w >= n)
    {
        bail!("--attach-to {spec:?}: there is no worker {w} among the {n} (0..{n})");
    }
    if peers.contains(&node) {
        bail!("--attach-to {spec:?}: worker {node} cannot attach to itself");
    }
    Ok((node, peers))
}

/// One worker: take its roles as labels, and train them; the learner's worker writes the
/// experiment folder. Returns whether a signal stopped the run (the learner decides: after
/// Ctrl-C it finishes its step, saves `final`, and the other workers follow).
fn worker(
    args: &Args,
    config: &Config,
    env_spec: &EnvSpec,
    task: drill_task::TaskHandle,
    plan: &RolePlan,
    n: usize,
) -> anyhow::Result<bool> {
    let roles = plan.share(config, &task)?;
    worker_with(args, config, env_spec, task, roles, n)
}

/// A worker with its `roles`.
fn worker_with(
    args: &Args,
    config: &Config,
    env_spec: &EnvSpec,
    task: drill_task::TaskHandle,
    roles: drill_algo::middleware::Roles,
    n: usize,
) -> anyhow::Result<bool> {
    let device = select_device(config)?;
    drill_algo::interrupt::install().context("cannot install the Ctrl-C handler")?;
    let task_labels = task.labels();
    let names = roles.names();
    let restarts = drill_algo::runner::restart_count();
    let mut exp = None;
    let mut resume = None;
    if roles.lead_learner() {
        let previous = std::env::var_os(EXP_DIR_ENV).map(PathBuf::from);
        let (e, r) =
            drill_algo::runner::open(config, &args.start_options(), previous.as_deref(), restarts)?;
        (exp, resume) = (Some(e), r);
    }
    let labels: Vec<&str> = task_labels.iter().collect();
    tracing::info!(
        "worker [{}]: {} ({}; pid {})",
        labels.join(", "),
        names.join(", "),
        exp.as_ref()
            .map_or("no experiment folder".into(), |e| format!(
                "→ {}",
                e.dir().display()
            )),
        std::process::id()
    );
    let replay_dir = exp
        .as_ref()
        .filter(|_| args.save_replay)
        .map(|e: &Experiment| e.dir().join("ckpt"));
    let mut null = NullReporter;
    let reporter: &mut dyn Reporter = match &mut exp {
        Some(e) => e,
        None => &mut null,
    };
    let result = match drill_algo::train_roles(
        config,
        &mut RunContext {
            device,
            spec: env_spec.clone(),
            reporter,
            resume,
            dist: None,
            restarts,
            replay_dir,
        },
        task,
        &roles,
    ) {
        Ok(r) => r,
        Err(e) => {
            // The learner's worker holds the folder: its result.json says why the run failed
            // (a full disk lets this small file through once the failed checkpoint's temporary
            // file is gone).
            if let Some(exp) = &mut exp
                && let Err(w) = exp.fail(&e.to_string(), n, restarts)
            {
                tracing::warn!("cannot write {}/result.json: {w}", exp.dir().display());
            }
            return Err(e.into());
        }
    };
    let interrupted = result.as_ref().is_some_and(|r| r.interrupted);
    if let (Some(exp), Some(result)) = (exp, result) {
        let mut flags = format!(" --parallel-workers {n}");
        if args.save_replay {
            flags.push_str(" --save-replay");
        }
        finish_experiment(exp, &result, &flags)?;
    }
    Ok(interrupted)
}
