//! `drill train` as one process or one rank of a data-parallel job, and (`--nproc-per-node`)
//! the launcher of such a job on this machine.

use anyhow::{Context, bail};
use drill_algo::compute::select_device;
use drill_algo::start::{self, RankStart};
use drill_algo::{NullReporter, Reporter, RunContext};
use drill_comm::ProcessGroup;
use drill_config::Config;
use drill_env::EnvSpec;
use drill_launch::{LaunchConfig, launch};
use std::time::Duration;

use super::Args;
use super::finish::finish_experiment;

/// `--nproc-per-node N`: start N copies of this command (without the flag) as ranks.
pub(super) fn launch_ranks(args: &Args, config: &Config, n: usize) -> anyhow::Result<i32> {
    if n == 0 {
        bail!("--nproc-per-node must be at least 1");
    }
    drill_algo::session::check_data_parallel(config, "--nproc-per-node")?;
    let mut child = vec!["train".to_string()];
    child.extend(args.config.clone());
    // Each rank's share of the cores (or what --threads said), as sized by load_config.
    child.extend(["--threads".into(), rayon::current_num_threads().to_string()]);
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
    if args.save_replay {
        child.push("--save-replay".into());
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
pub(super) fn train_rank(args: &Args, config: Config, spec: EnvSpec) -> anyhow::Result<i32> {
    let device = select_device(&config)?;
    drill_algo::interrupt::install().context("cannot install the Ctrl-C handler")?;
    let dist = drill_algo::session::join(&config).context("cannot join the data-parallel job")?;
    let rank = dist.as_ref().map_or(0, ProcessGroup::rank);
    let world = dist.as_ref().map_or(1, ProcessGroup::world_size);
    let whose = |e: drill_algo::TrainError| -> anyhow::Error {
        if world > 1 {
            anyhow::Error::new(e).context(format!("rank {rank} of {world}"))
        } else {
            e.into()
        }
    };
    let restarts = start::restart_count();
    let RankStart {
        mut exp,
        dir,
        resume,
    } = start::for_rank(&config, &args.start_options(), dist.as_ref(), restarts).map_err(whose)?;
    let log = dir.join("logs").join(format!("rank_{rank}.log"));
    if let Err(e) = crate::log::also_to(&log) {
        tracing::warn!("cannot write {}: {e}", log.display());
    }
    let threads = rayon::current_num_threads();
    let precision = if drill_algo::compute::bf16::enabled() {
        format!(
            ", bf16 products ({:?})",
            drill_algo::compute::bf16::Level::current()
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
    let mut null = NullReporter;
    let reporter: &mut dyn Reporter = match &mut exp {
        Some(e) => e,
        None => &mut null,
    };
    let trained = drill_algo::train(
        &config,
        &mut RunContext {
            device,
            spec,
            reporter,
            resume,
            dist,
            restarts,
            replay_dir: args.save_replay.then(|| dir.join("ckpt")),
        },
    );
    let result = match trained {
        Ok(result) => result,
        Err(e) => {
            let e = whose(e);
            // The failed run's folder says why (a full disk lets this small file through
            // once the checkpoint that failed removed its temporary file).
            if let Some(exp) = &mut exp
                && let Err(write) = exp.fail(&crate::message(&e), world, restarts)
            {
                tracing::warn!("cannot write {}/result.json: {write}", dir.display());
            }
            return Err(e);
        }
    };
    let code = if result.interrupted { 130 } else { 0 };
    let Some(exp) = exp else {
        return Ok(code);
    };
    let mut flags = match world {
        1 => String::new(),
        n => format!(" --nproc-per-node {n}"),
    };
    if args.save_replay {
        flags.push_str(" --save-replay");
    }
    finish_experiment(exp, &result, &flags)?;
    Ok(code)
}
