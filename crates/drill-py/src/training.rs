//! `train`: a whole `drill train` run in this process through [`drill_algo::runner`], the GIL
//! released while it runs, with drill's log lines and progress bar on stderr; `launch`: the
//! ranks of a data-parallel job on this machine, each a process running `train` (what
//! `drill.train(..., nproc_per_node=N)` starts). Ctrl-C stops a run after its step with the
//! `final` checkpoint written, then surfaces as `KeyboardInterrupt`.

use std::path::PathBuf;

use drill_algo::runner;
use drill_algo::runner::StartOptions;
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

use crate::errors;

/// drill's log lines on stderr, around the progress bar (`DRILL_LOG` filters them, as for
/// the command line); a host that set up its own subscriber keeps it.
pub(crate) fn init_logging() {
    struct Stderr;
    impl std::io::Write for Stderr {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            drill_exp::suspend_bar(|| std::io::stderr().write_all(buf))?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            std::io::stderr().flush()
        }
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DRILL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(|| Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Train `config` (a TOML file) with `overrides` (`KEY=VALUE`) in this process; returns the
/// result as JSON (`result.json`'s fields, plus `exp_dir` and `result_file`).
#[pyfunction]
#[pyo3(signature = (config, overrides, exp_dir=None, resume=None, threads=None, quiet=false, save_replay=false, processes=None))]
#[allow(clippy::too_many_arguments)]
pub fn train(
    py: Python<'_>,
    config: String,
    overrides: Vec<String>,
    exp_dir: Option<PathBuf>,
    resume: Option<PathBuf>,
    threads: Option<usize>,
    quiet: bool,
    save_replay: bool,
    processes: Option<usize>,
) -> PyResult<String> {
    drill_algo::compute::keep_freed_memory();
    let opts = StartOptions {
        exp_dir,
        resume,
        quiet,
    };
    let ran = py.detach(move || {
        let _signals = drill_algo::interrupt::scope()
            .map_err(|e| drill_algo::TrainError::io("cannot install the Ctrl-C handler", e))?;
        let prepared = runner::prepare(&config, &overrides, processes, threads)?;
        let trained = runner::train_here(prepared, &opts, save_replay, &mut |_| {})?;
        let file = match trained.exp {
            Some(exp) => Some(runner::finish(exp, &trained.result, &|dir| {
                format!("drill.train(resume={:?})", dir.display().to_string())
            })?),
            None => None,
        };
        Ok::<_, drill_algo::TrainError>((trained.result, file))
    });
    let (result, file) = ran.map_err(errors::train)?;
    if result.interrupted {
        // The interpreter's own handler saw the signal too: raise it as Python would.
        py.check_signals()?;
        return Err(PyKeyboardInterrupt::new_err(format!(
            "training stopped at env step {}; the final checkpoint is in {}",
            result.env_steps,
            file.as_ref()
                .and_then(|f| f.parent())
                .map(|d| d.display().to_string())
                .unwrap_or_default()
        )));
    }
    let mut json =
        serde_json::to_value(&result).map_err(|e| errors::Error::new_err(e.to_string()))?;
    if let (Some(f), Some(obj)) = (&file, json.as_object_mut()) {
        obj.insert(
            "exp_dir".into(),
            f.parent().map(|d| d.display().to_string()).into(),
        );
        obj.insert("result_file".into(), f.display().to_string().into());
    }
    Ok(json.to_string())
}

/// Start `nproc_per_node` ranks on this machine, each `program args` (a Python interpreter
/// running `drill.train` for one rank), for the data-parallel run `config` describes
/// (checked here first); returns the job's exit code.
#[pyfunction]
#[pyo3(signature = (config, overrides, nproc_per_node, program, args, max_restarts=0))]
pub fn launch(
    py: Python<'_>,
    config: String,
    overrides: Vec<String>,
    nproc_per_node: usize,
    program: String,
    args: Vec<String>,
    max_restarts: usize,
) -> PyResult<i32> {
    py.detach(move || {
        let prepared = runner::prepare(&config, &overrides, Some(nproc_per_node), None)?;
        runner::launch_ranks(
            &prepared.config,
            program,
            args,
            nproc_per_node,
            max_restarts,
            None,
        )
    })
    .map_err(errors::train)
}
