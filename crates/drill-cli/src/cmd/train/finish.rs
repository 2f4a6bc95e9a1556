//! The end of a `drill train` run, for every way it runs: [`drill_algo::runner::finish`]
//! (`result.json` written, the outcome logged, after an interrupt with the command that
//! continues it), then the file's path printed.

use drill_algo::TrainResult;
use drill_exp::Experiment;

/// Close the folder and print `result.json`'s path (the last line of output). `flags` are
/// the ones the command that continues an interrupted run needs (how its processes were
/// started, ` --nproc-per-node 2`; ` --save-replay`).
pub(crate) fn finish_experiment(
    exp: Experiment,
    result: &TrainResult,
    flags: &str,
) -> anyhow::Result<()> {
    let path = drill_algo::runner::finish(exp, result, &|dir| {
        format!("drill train --resume {}{flags}", dir.display())
    })?;
    crate::exit_code_if_stdout_closes(if result.interrupted { 130 } else { 0 });
    println!("{}", path.display());
    Ok(())
}
