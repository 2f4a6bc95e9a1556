//! `drill train` as one process or one rank of a data-parallel job, and (`--nproc-per-node`)
//! the launcher of such a job on this machine: the CLI's side of [`drill_algo::runner`].

use anyhow::Context;
use drill_algo::runner::{self, Prepared, Trained};
use drill_config::Config;

use super::Args;
use super::finish::finish_experiment;

/// `--nproc-per-node N`: start N copies of this command (without the flag) as ranks.
pub(super) fn launch_ranks(args: &Args, config: &Config, n: usize) -> anyhow::Result<i32> {
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
    Ok(runner::launch_ranks(
        config,
        program,
        child,
        n,
        args.max_restarts,
        nodes(args)?,
    )?)
}

/// `--nnodes`, `--rdzv-endpoint`, `--rdzv-id`, `--rdzv-conf`: the job's nodes, if several.
fn nodes(args: &Args) -> anyhow::Result<Option<runner::Nodes>> {
    let Some(nnodes) = &args.nnodes else {
        return Ok(None);
    };
    let (n, elastic) =
        drill_launch::parse_nnodes(nnodes, &args.rdzv_conf).map_err(anyhow::Error::msg)?;
    let endpoint = args.rdzv_endpoint.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the store every node meets at)"
        )
    })?;
    Ok(Some(runner::Nodes {
        nnodes: n,
        elastic,
        endpoint,
        id: args.rdzv_id.clone(),
    }))
}

/// Train as one process or one rank; rank 0 owns the experiment folder.
pub(super) fn train_rank(args: &Args, prepared: Prepared) -> anyhow::Result<i32> {
    drill_algo::interrupt::install().context("cannot install the Ctrl-C handler")?;
    let Trained {
        result, exp, world, ..
    } = runner::train_here(
        prepared,
        &args.start_options(),
        args.save_replay,
        &mut |log| {
            if let Err(e) = crate::log::also_to(log) {
                tracing::warn!("cannot write {}: {e}", log.display());
            }
        },
    )?;
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
