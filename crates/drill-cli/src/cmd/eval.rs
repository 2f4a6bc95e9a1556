//! `drill eval`: mean and std return of a checkpoint.

use drill_algo::checkpoint::Checkpoint;
use drill_algo::compute::select_device;
use drill_config::Config;
use std::path::PathBuf;

/// Arguments of `drill eval`.
#[derive(clap::Args)]
pub struct Args {
    /// A checkpoint written by `drill train` (`EXP/ckpt/*.safetensors`).
    pub checkpoint: PathBuf,
    /// The config it was trained with (e.g. `EXP/config.toml`).
    #[arg(long)]
    pub config: String,
    /// Episodes to run (default: the config's env.n_evaluator_episode).
    #[arg(long)]
    pub episodes: Option<usize>,
    /// Seed of the evaluation environments.
    #[arg(long, default_value_t = 12345)]
    pub seed: u64,
    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

/// Load, evaluate, print.
pub fn run(args: Args, threads: Option<usize>) -> anyhow::Result<()> {
    let config = Config::load(&args.config, &[])?;
    let spec = drill_algo::envs::env_spec(&config)?;
    crate::init_threads(threads.unwrap_or_else(|| drill_algo::envs::default_threads(&spec, 1)));
    let device = select_device(&config)?;
    let ck = Checkpoint::load(&args.checkpoint)?;
    let episodes = args.episodes.unwrap_or(config.env.n_evaluator_episode);
    let r = drill_algo::evaluate(&config, &spec, &ck, episodes, args.seed, &device)?;
    if args.json {
        println!(
            r#"{{"eval_reward_mean":{},"eval_reward_std":{},"eval_episodes":{}}}"#,
            r.mean,
            r.std,
            r.returns.len()
        );
    } else {
        println!(
            "{} on {}: {:.2} ± {:.2} over {} episodes",
            args.checkpoint.display(),
            config.env.id,
            r.mean,
            r.std,
            r.returns.len()
        );
    }
    Ok(())
}
