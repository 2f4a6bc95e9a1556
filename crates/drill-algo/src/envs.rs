//! A run's environments: the spec (an unknown `env.id` named), the collector's copies (each
//! rank's seeded `seed + rank * collector_env_num + i`, `seed` being the start's stream seed,
//! `resume::stream_seed`), the evaluator's share, Gymnasium
//! ids registered with their `[env]` options, and the default thread count they suggest.

use crate::error::TrainError;
use crate::eval::Evaluator;
use drill_config::Config;
use drill_env::{DynVecEnv, make_vec_with};

/// The environment's spec, an unknown `env.id` (or a missing Atari ROM) named.
pub fn env_spec(cfg: &Config) -> Result<drill_env::EnvSpec, TrainError> {
    register_env(cfg);
    drill_env::spec_with(&cfg.env.id, &cfg.env.atari)
        .map_err(|e| cfg.error("env.id", e.to_string()).into())
}

/// This rank's collector environments (copy `i` seeded `seed + rank * n + i`; `seed` is
/// `cfg.seed` at a run's first start), reset.
pub fn collector_envs(
    cfg: &Config,
    seed: u64,
    rank: usize,
) -> Result<Box<dyn DynVecEnv>, TrainError> {
    let n = cfg.env.collector_env_num;
    register_env(cfg);
    let mut venv = make_vec_with(
        &cfg.env.id,
        n,
        seed.wrapping_add((rank * n) as u64),
        cfg.env.env_threads,
        &cfg.env.atari,
    )?;
    venv.reset(None)?;
    Ok(venv)
}

/// This rank's share of the evaluator: of `env.evaluator_env_num` copies (seeded after the
/// collector copies of `seeded_ranks` ranks), the block of rank `rank` of `ranks`; `None` when
/// there are more ranks than copies and this one gets none. The shares together evaluate
/// exactly as one process would ([`Evaluator`]).
pub fn evaluator(
    cfg: &Config,
    seeded_ranks: usize,
    rank: usize,
    ranks: usize,
) -> Result<Option<Evaluator>, TrainError> {
    let total = cfg.env.evaluator_env_num;
    let (lo, hi) = (total * rank / ranks, total * (rank + 1) / ranks);
    if lo == hi {
        return Ok(None);
    }
    let seed = cfg.seed + (seeded_ranks * cfg.env.collector_env_num) as u64;
    register_env(cfg);
    let venv = make_vec_with(
        &cfg.env.id,
        hi - lo,
        seed + lo as u64,
        cfg.env.env_threads,
        &cfg.env.atari.eval(),
    )?;
    Ok(Some(Evaluator::share(
        venv,
        cfg.env.n_evaluator_episode,
        total,
        lo,
        seed,
    )))
}

/// Tell drill-env what `[env]` says of a Gymnasium id (`env.kwargs`, `env.entry_point`,
/// `env.vectorization`); every function here that builds the env calls it first.
pub(crate) fn register_env(cfg: &Config) {
    let e = &cfg.env;
    if !e.id.starts_with(drill_env::GYMNASIUM) {
        return;
    }
    let opts = drill_env::gymnasium::PythonOptions {
        kwargs_json: serde_json::to_string(&e.kwargs).unwrap_or_else(|_| "{}".into()),
        entry_point: e.entry_point.clone(),
        vectorization: if e.vectorization == "async" {
            drill_env::gymnasium::Vectorization::Async
        } else {
            drill_env::gymnasium::Vectorization::Sync
        },
    };
    drill_env::gymnasium::register(&e.id, opts);
}

/// Intra-op threads for a run on the environment `spec` describes when the command line
/// names none: for frame observations (a convolutional trunk, whose products split well)
/// every core of this process's share of the machine (`available_parallelism / processes`),
/// for vectors (small MLPs, measured faster on one thread) one.
pub fn default_threads(spec: &drill_env::EnvSpec, processes: usize) -> usize {
    if spec.obs.shape.len() != 3 {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (cores / processes.max(1)).max(1)
}
