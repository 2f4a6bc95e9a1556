//! `drill train` as one process or one rank of a data-parallel job, and (`--nproc-per-node`)
//! the launcher of such a job on this machine.

use anyhow::{Context, bail};
use drill_algo::checkpoint::Checkpoint;
use drill_algo::{NullReporter, Reporter, RunContext, run::select_device};
use drill_comm::ProcessGroup;
use drill_config::Config;
use drill_launch::{LaunchConfig, launch};
use std::path::PathBuf;
use std::time::Duration;

use super::Args;
use super::experiment::{finish_experiment, open_experiment, restart_count};

/// Store key (shared by every attempt of a launched job) holding the experiment folder.
const EXP_DIR_KEY: &str = "drill-train/exp_dir";

/// `--nproc-per-node N`: start N copies of this command (without the flag) as ranks.
pub(super) fn launch_ranks(args: &Args, config: &Config, n: usize) -> anyhow::Result<i32> {
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

/// Train as one process or one rank; rank 0 owns the experiment folder.
pub(super) fn train_rank(args: &Args, config: Config) -> anyhow::Result<()> {
    let device = select_device(&config)?;
    let dist = drill_algo::session::join(&config).context("cannot join the data-parallel job")?;
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
