//! `drill train --parallel-workers N`: the training pipeline split over N worker processes
//! (DI-engine's `ditask`). `[task.roles]` says which roles each worker runs; the learner's
//! worker owns the experiment folder and decides when the run ends.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use drill_algo::middleware::{Remote, Roles};
use drill_algo::{NullReporter, Reporter, RunContext, run::select_device};
use drill_config::Config;
use drill_exp::Experiment;
use drill_task::parallel::{Mq, Parallel, Platform, Topology};
use drill_task::{Labels, OnlineRLContext, TaskError};

use super::experiment::{exp_dir, finish_experiment, open_experiment, restart_count};
use super::{Args, PlatformArg, TopologyArg};

/// The experiment folder the parent claimed, for the learner's worker.
const EXP_DIR_ENV: &str = "DRILL_EXP_DIR";

/// Start (or, under Slurm, be) the workers; returns the exit code.
pub fn run(args: &Args, config: Config, n: usize) -> anyhow::Result<i32> {
    if args.nproc_per_node.is_some() || config.policy.multi_gpu() {
        bail!(
            "--parallel-workers splits the pipeline over processes; it does not combine with data-parallel training (--nproc-per-node, policy.multi_gpu)"
        );
    }
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
    let config_ref = &config;
    let collectors = check_roles(&config, &args.labels, n)?;
    let mq = match args.mq_type.as_deref().unwrap_or(&config.task.mq_type) {
        "tcp" => Mq::Tcp,
        "redis" => Mq::Redis {
            url: args
                .redis_url
                .clone()
                .unwrap_or_else(|| config.task.redis_url.clone()),
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
        let (node, peers) = parse_attach(spec)?;
        runner = runner.attach_to(node, &peers);
    }
    let mut local: Vec<usize> = (0..n).collect();
    if !args.node_ids.is_empty() {
        let (first, last) = (args.node_ids[0], args.node_ids[args.node_ids.len() - 1]);
        if args.node_ids.iter().zip(first..).any(|(&a, b)| a != b) {
            bail!("--node-ids {:?}: must be consecutive", args.node_ids);
        }
        runner = runner
            .node_ids(first..last + 1, &args.master_addr, args.master_port)
            .map_err(|e| anyhow::anyhow!("--node-ids: {e}"))?;
        local = args.node_ids.clone();
    }
    let learner_here = local.iter().any(|&node| {
        node_roles(config_ref, &node_labels(node, &args.labels))
            .is_ok_and(|r| r.iter().any(|r| r == "learner"))
    });
    if args.platform == PlatformArg::Local && !drill_task::parallel::in_worker() && learner_here {
        // The parent claims the folder so that a restarted group writes into the same one.
        let dir = exp_dir(args, &config);
        let dir = Experiment::reserve(&dir)
            .with_context(|| format!("cannot create experiment folder {}", dir.display()))?;
        runner = runner.env(EXP_DIR_ENV, &dir.display().to_string());
    }
    let timeout = Duration::from_secs_f64(config.task.timeout);
    runner
        .run::<OnlineRLContext>(|task| {
            worker(args, &config, task.handle().clone(), timeout, &collectors).map_err(|e| {
                // The chain (e.g. which middleware, which peer) is the message.
                TaskError::msg(format!("{e:#}"))
            })
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(0)
}

/// The learner and the evaluator on exactly one worker each, collectors on one or more (and
/// only on the learner's when it collects too): checked before anything starts, naming the
/// assignment. Returns the collector workers.
fn check_roles(config: &Config, extra: &[String], n: usize) -> anyhow::Result<Vec<usize>> {
    let mut owners: Vec<Vec<usize>> = vec![Vec::new(); drill_config::TASK_ROLES.len()];
    for node in 0..n {
        let roles = node_roles(config, &node_labels(node, extra))?;
        for (k, role) in drill_config::TASK_ROLES.iter().enumerate() {
            if roles.iter().any(|r| r == role) {
                owners[k].push(node);
            }
        }
    }
    let bad = |message: String| -> anyhow::Error { config.error("task.roles", message).into() };
    let on = |nodes: &[usize]| match nodes {
        [] => "no worker takes it".to_string(),
        _ => format!("nodes {nodes:?} take it"),
    };
    let [collectors, learner, evaluator] = [&owners[0], &owners[1], &owners[2]];
    for (role, nodes) in [("learner", learner), ("evaluator", evaluator)] {
        if nodes.len() != 1 {
            return Err(bad(format!(
                "the {role} role must run on exactly one of the {n} workers, but {} (e.g. \"node.0\" = [\"collector\", \"learner\"], \"node.1\" = [\"evaluator\"])",
                on(nodes)
            )));
        }
    }
    if collectors.is_empty() {
        return Err(bad(format!(
            "no worker of the {n} takes the collector role"
        )));
    }
    // A remote evaluator waits for the weights of every eval_freq-th iteration; a collector
    // beside it would wait with it and starve the learner.
    if evaluator[0] != learner[0] && collectors.contains(&evaluator[0]) {
        return Err(bad(format!(
            "the evaluator's worker (node {}) may also collect only if it is the learner's: give the evaluator a worker of its own or put it with the learner",
            evaluator[0]
        )));
    }
    if collectors.len() > 1 && collectors.contains(&learner[0]) {
        return Err(bad(format!(
            "the learner's worker (node {}) collects too, so no other may: nodes {collectors:?} take the collector role",
            learner[0]
        )));
    }
    Ok(collectors.clone())
}

/// The labels worker `node` will have (as the runner gives them).
fn node_labels(node: usize, extra: &[String]) -> Labels {
    let mut labels = Labels::new(["distributed".to_string(), format!("node.{node}")]);
    for l in extra {
        labels.insert(l.clone());
    }
    if let Ok(list) = std::env::var("DRILL_LABELS") {
        labels.extend_from_list(&list);
    }
    labels
}

/// The roles `[task.roles]` gives a worker with `labels`.
fn node_roles(config: &Config, labels: &Labels) -> anyhow::Result<Vec<String>> {
    let mut roles = Vec::new();
    for (pattern, rs) in &config.task.roles {
        if labels.matches(&[pattern]).map_err(anyhow::Error::msg)? {
            roles.extend(rs.iter().cloned());
        }
    }
    Ok(roles)
}

/// `NODE=PEER,PEER`.
fn parse_attach(spec: &str) -> anyhow::Result<(usize, Vec<usize>)> {
    let bad = || anyhow::anyhow!("--attach-to {spec:?}: expected NODE=PEER[,PEER...], e.g. 0=1,2");
    let (node, peers) = spec.split_once('=').ok_or_else(bad)?;
    let node = node.trim().parse().map_err(|_| bad())?;
    let peers = peers
        .split(',')
        .map(|p| p.trim().parse().map_err(|_| bad()))
        .collect::<anyhow::Result<_>>()?;
    Ok((node, peers))
}

/// One worker: take its roles as labels, and train them; the learner's worker writes the
/// experiment folder.
fn worker(
    args: &Args,
    config: &Config,
    task: drill_task::TaskHandle,
    timeout: Duration,
    collectors: &[usize],
) -> anyhow::Result<()> {
    for r in node_roles(config, &task.labels())? {
        task.insert_label(r);
    }
    let node: usize = task
        .labels()
        .iter()
        .find_map(|l| l.strip_prefix("node.")?.parse().ok())
        .context("a worker without a node.N label")?;
    let roles = Roles::from_labels(
        &task,
        Remote {
            node,
            collector_index: collectors.iter().position(|&c| c == node).unwrap_or(0),
            collectors: collectors.len(),
            model_staleness: config.task.model_staleness,
            model_every: config.task.model_every,
            timeout,
        },
    )?;
    let device = select_device(config)?;
    let task_labels = task.labels();
    let names = roles.names();
    let restarts = restart_count();
    let mut exp = None;
    let mut resume = None;
    if roles.learner {
        let previous = std::env::var_os(EXP_DIR_ENV).map(PathBuf::from);
        let (e, r) = open_experiment(args, config, previous.as_deref(), restarts)?;
        (exp, resume) = (Some(e), r);
    }
    let labels: Vec<&str> = task_labels.iter().collect();
    tracing::info!(
        "worker [{}]: {} ({})",
        labels.join(", "),
        names.join(", "),
        exp.as_ref()
            .map_or("no experiment folder".into(), |e| format!(
                "→ {}",
                e.dir().display()
            ))
    );
    let mut null = NullReporter;
    let reporter: &mut dyn Reporter = match &mut exp {
        Some(e) => e,
        None => &mut null,
    };
    let result = drill_algo::train_roles(
        config,
        &mut RunContext {
            device,
            reporter,
            resume,
            dist: None,
            restarts,
        },
        task,
        &roles,
    )?;
    if let (Some(exp), Some(result)) = (exp, result) {
        finish_experiment(exp, &result)?;
    }
    Ok(())
}
