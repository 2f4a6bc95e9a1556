//! `drill train`.

use anyhow::Context;
use drill_algo::checkpoint::Checkpoint;
use drill_algo::{RunContext, run::select_device};
use drill_config::Config;
use drill_exp::Experiment;
use std::path::PathBuf;

/// Arguments of `drill train`.
#[derive(clap::Args)]
pub struct Args {
    /// Experiment config (TOML, DI-engine's tree: env / policy.learn / policy.collect / …).
    pub config: String,
    /// Override the config's seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override any config key, e.g. `--set policy.learn.batch_size=128` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Experiment folder (default: the config's exp_name). An existing one is never
    /// overwritten: a suffixed sibling is used instead.
    #[arg(long)]
    pub exp_dir: Option<PathBuf>,
    /// Continue from a checkpoint (model, optimizer and counters).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Load the config, train, write the experiment folder, print a summary.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut overrides = args.set.clone();
    if let Some(seed) = args.seed {
        overrides.push(format!("seed={seed}"));
    }
    let config = Config::load(&args.config, &overrides)?;
    drill_algo::validate(&config)?;
    let device = select_device(&config)?;
    let resume = args.resume.as_deref().map(Checkpoint::load).transpose()?;
    let dir = args
        .exp_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(&config.exp_name));
    let mut exp = Experiment::create(&dir, &config, args.quiet)
        .with_context(|| format!("cannot create experiment folder {}", dir.display()))?;
    tracing::info!(
        "training {} on {} → {}",
        config.policy.kind(),
        config.env.id,
        exp.dir().display()
    );
    let result = drill_algo::train(
        &config,
        &mut RunContext {
            device,
            reporter: &mut exp,
            resume,
        },
    )?;
    exp.finish(&result)
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
