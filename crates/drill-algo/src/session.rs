//! The setup every algorithm's pipeline shares: seeding (rank-aware under DDP: each rank
//! seeds its own environments `seed + rank * collector_env_num + i` and generator), the
//! collector's environments, the evaluator, DDP options, generator states for checkpoints,
//! and the final [`TrainResult`] from the task's last context. The loop itself is the
//! middleware pipeline ([`crate::middleware`]).

use crate::checkpoint::Checkpoint;
use crate::ddp::DdpOptions;
use crate::eval::Evaluator;
use crate::run::{TrainError, TrainResult};
use drill_config::Config;
use drill_env::{DynVecEnv, make_vec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A generator's position, to save in checkpoints.
pub(crate) fn rng_state(rng: &ChaCha8Rng) -> String {
    let seed: String = rng.get_seed().iter().map(|b| format!("{b:02x}")).collect();
    format!("{seed}:{}:{}", rng.get_stream(), rng.get_word_pos())
}

pub(crate) fn parse_rng_state(s: &str) -> Option<ChaCha8Rng> {
    let mut it = s.split(':');
    let hex = it.next()?;
    let stream: u64 = it.next()?.parse().ok()?;
    let pos: u128 = it.next()?.parse().ok()?;
    let mut seed = [0u8; 32];
    for (k, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok()?;
    }
    let mut rng = ChaCha8Rng::from_seed(seed);
    rng.set_stream(stream);
    rng.set_word_pos(pos);
    Some(rng)
}

/// This rank's generator: restored from `resume` (`rng.{rank}`) or seeded
/// `seed + 0x5eed + rank`.
pub fn rank_rng(cfg: &Config, resume: Option<&Checkpoint>, rank: usize) -> ChaCha8Rng {
    resume
        .and_then(|ck| ck.meta.get(&format!("rng.{rank}")))
        .and_then(|s| parse_rng_state(s))
        .unwrap_or_else(|| {
            ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(0x5eed).wrapping_add(rank as u64))
        })
}

/// The start of every pipeline: the DDP ranks of `run`, with the device seeded with
/// `config.seed` (the same initial weights everywhere).
pub fn setup(cfg: &Config, run: &crate::RunContext<'_>) -> crate::middleware::Ranks {
    run.device.seed(cfg.seed);
    crate::middleware::Ranks::new(run.dist.clone())
}

/// This rank's collector environments (copy `i` seeded `seed + rank * n + i`), reset.
pub fn collector_envs(cfg: &Config, rank: usize) -> Result<Box<dyn DynVecEnv>, TrainError> {
    let n = cfg.env.collector_env_num;
    let mut venv = make_vec(
        &cfg.env.id,
        n,
        cfg.seed + (rank * n) as u64,
        cfg.env.env_threads,
    )?;
    venv.reset(None);
    Ok(venv)
}

/// The evaluator (seeded after every rank's collector copies).
pub fn evaluator(cfg: &Config, world: usize) -> Result<Evaluator, TrainError> {
    Ok(Evaluator::new(
        &cfg.env.id,
        cfg.env.evaluator_env_num,
        cfg.env.n_evaluator_episode,
        cfg.seed + (world * cfg.env.collector_env_num) as u64,
    )?)
}

/// The run's result from the task's last context.
pub fn result(
    ctx: &drill_task::OnlineRLContext,
    seconds: f64,
    world_size: usize,
    restarts: u32,
) -> TrainResult {
    let last = ctx.ext.get::<crate::middleware::LastEval>().map(|l| &l.0);
    TrainResult {
        stop_reached: last.is_some_and(|e| e.stop),
        env_steps: ctx.env_step,
        train_iters: ctx.train_iter,
        wall_seconds: seconds,
        env_steps_per_sec: ctx.env_step as f64 / seconds,
        eval_reward_mean: last.map_or(f64::NAN, |e| e.result.mean),
        eval_reward_std: last.map_or(f64::NAN, |e| e.result.std),
        eval_episodes: last.map_or(0, |e| e.result.returns.len()),
        world_size,
        restarts,
    }
}

/// DDP options from the config (`policy.ddp_bucket_cap_mb`, `policy.ddp_check_every`).
pub fn ddp_options(cfg: &Config) -> DdpOptions {
    let (_, cap, check) = cfg.policy.ddp();
    DdpOptions {
        bucket_cap_mb: cap,
        check_every: check,
        ..DdpOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn rng_state_round_trips_mid_stream() {
        let mut a = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..13 {
            a.random::<u32>();
        }
        let mut b = parse_rng_state(&rng_state(&a)).unwrap();
        let xs: Vec<u64> = (0..5).map(|_| a.random()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.random()).collect();
        assert_eq!(xs, ys);
    }
}
