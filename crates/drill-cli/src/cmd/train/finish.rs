//! The end of a `drill train` run, for every way it runs: `result.json` written, the outcome
//! logged (after an interrupt: where it stopped and the command that continues it), the
//! file's path printed.

use anyhow::Context;
use drill_algo::TrainResult;
use drill_exp::Experiment;

/// Write `result.json`, log the outcome and print the file's path (the last line of output).
/// `flags` are the ones the command that continues an interrupted run needs (how its
/// processes were started, ` --nproc-per-node 2`; ` --save-replay`).
pub(crate) fn finish_experiment(
    mut exp: Experiment,
    result: &TrainResult,
    flags: &str,
) -> anyhow::Result<()> {
    exp.finish(result)
        .with_context(|| format!("cannot write {}/result.json", exp.dir().display()))?;
    if result.interrupted {
        tracing::info!(
            "interrupted at env step {}, train iteration {} (last eval {:.1} ± {:.1}), `final` checkpoint written; continue with: drill train --resume {}{}",
            result.env_steps,
            result.train_iters,
            result.eval_reward_mean,
            result.eval_reward_std,
            exp.dir().display(),
            flags
        );
    } else {
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
    }
    println!("{}", exp.dir().join("result.json").display());
    Ok(())
}
