//! `drill`: distributed data-parallel reinforcement learning. This binary only parses
//! arguments and calls the library crates; each subcommand lives in `cmd/`.

mod cmd;
#[cfg(test)]
mod fuzz;
mod log;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Reinforcement learning in Rust: train DQN, PPO and SAC on native and Atari environments, evaluate
/// checkpoints, plot learning curves and benchmark the pieces.
///
/// Exit codes: 0 success, 1 error (the message names the config key, file or iteration), 2 bad
/// command line.
#[derive(Parser)]
#[command(name = "drill", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Intra-op threads for tensor operations. Default: `drill train` and `drill eval` choose
    /// from the work (every core for convolutional nets, shared among the ranks of this
    /// machine; 1 for small MLPs, measured faster), the other commands 1. Also DRILL_THREADS.
    #[arg(long, global = true, env = "DRILL_THREADS")]
    threads: Option<usize>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a policy from a TOML config until its stop value or step limit.
    Train(cmd::train::Args),
    /// Evaluate a checkpoint: mean and std return over N episodes.
    Eval(cmd::eval::Args),
    /// Export a checkpoint's policy for PyTorch / DI-engine (safetensors, their names and
    /// layout).
    Export(cmd::export::Args),
    /// Plot evaluation return against env steps, one line per experiment folder.
    Plot(cmd::plot::Args),
    /// Environments: list their ids, record an episode segment (.npz), show what the agent
    /// sees (.png).
    Env(cmd::env::Args),
    /// Measure environment, learner and collective speed.
    Bench(cmd::bench::Args),
    /// Start N ranks of any program (torchrun's flags): env protocol, prefixed output,
    /// per-rank logs, restarts, signal forwarding. `drill launch --nproc-per-node 2 -- PROG ARGS`.
    Launch(cmd::launch::Args),
}

fn main() -> ExitCode {
    install_panic_hook();
    drill_algo::compute::keep_freed_memory();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DRILL_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(log::Tee)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    if !matches!(cli.command, Command::Train(_) | Command::Eval(_)) {
        init_threads(cli.threads.unwrap_or(1));
    }
    let result = match cli.command {
        Command::Train(args) => match cmd::train::run(args, cli.threads) {
            Ok(code) => return ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => Err(e),
        },
        Command::Eval(args) => cmd::eval::run(args, cli.threads),
        Command::Export(args) => cmd::export::run(args),
        Command::Plot(args) => cmd::plot::run(args),
        Command::Env(args) => cmd::env::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Launch(args) => match cmd::launch::run(args) {
            Ok(code) => return ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// What a panic prints. Output to a pipe its reader closed (`drill env list | head -1`) ends
/// the command quietly with exit code 0, as command-line tools do (ripgrep); SIGPIPE stays
/// ignored, so a closed socket is an error for the collectives to report, not a silent
/// death. Any other panic is a bug: one line naming it and where, and the backtrace only
/// when `RUST_BACKTRACE` asks for one.
fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        if text.starts_with("failed printing to std") && text.contains("Broken pipe") {
            std::process::exit(CLOSED_STDOUT_EXIT.load(std::sync::atomic::Ordering::Relaxed));
        }
        if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
            return default(info);
        }
        let at = info
            .location()
            .map_or(String::new(), |l| format!(" at {}:{}", l.file(), l.line()));
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        let text = one_line(&text);
        eprintln!(
            "drill: internal error (a bug, please report it): {text}{at} (thread {thread}; RUST_BACKTRACE=1 shows the backtrace)"
        );
    }));
}

/// A message on one line, whatever it holds (assert_eq!'s writes three): its lines joined
/// with `; `.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The exit code when stdout's reader has gone by the time drill prints: 0, or the code the
/// run already decided (130 after Ctrl-C), which a closed pipe must not turn into success.
static CLOSED_STDOUT_EXIT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Set the exit code a closed stdout ends the command with from here on.
pub(crate) fn exit_code_if_stdout_closes(code: i32) {
    CLOSED_STDOUT_EXIT.store(code, std::sync::atomic::Ordering::Relaxed);
}

/// Size the tensor thread pool (burn's and drill's kernels run on rayon's global pool): once,
/// before any tensor work.
pub(crate) fn init_threads(n: usize) {
    if !drill_algo::runner::init_threads(n) {
        tracing::warn!("could not size the tensor thread pool to {n}");
    }
}

/// The error and its causes, `: `-joined, each cause said once: errors that already name
/// their source in their message (`{path}: {source}`) do not repeat it.
pub(crate) fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_message_is_one_line() {
        let r = std::panic::catch_unwind(|| assert_eq!(1 + 1, 3, "sum"));
        let payload = r.unwrap_err();
        let text = payload.downcast_ref::<String>().unwrap();
        assert!(text.contains('\n'), "{text:?}");
        let line = super::one_line(text);
        assert!(
            !line.contains('\n') && line.contains("left: 2; right: 3"),
            "{line}"
        );
    }
}
