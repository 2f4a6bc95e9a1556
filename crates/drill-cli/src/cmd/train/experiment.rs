//! The experiment folder of a `drill train` run, for every way it runs: opened (created, or
//! reopened after a restart and resumed from its newest checkpoint), and finished.

use anyhow::Context;
use drill_algo::TrainResult;
use drill_algo::checkpoint::Checkpoint;
use drill_config::Config;
use drill_exp::Experiment;
use std::path::{Path, PathBuf};

use super::Args;

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
    let resume = Checkpoint::newest_in(dir);
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
