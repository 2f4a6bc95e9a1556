//! [`Session`]: the plumbing every algorithm's training loop shares — seeding, the collector's
//! environments, the evaluator, env-step counting, evaluate → checkpoint → stop decisions,
//! progress, and the final [`TrainResult`]. Algorithms keep only their own logic.
//!
//! Rank-aware (DDP, `policy.multi_gpu`): each rank seeds its own environments
//! (`seed + rank * collector_env_num + i`) and generator, collected env steps are
//! sum-all-reduced so counters and schedules are global, evaluation runs on rank 0 only and
//! its result and the stop decision are broadcast, so every rank stops at the same iteration.

use crate::checkpoint::Checkpoint;
use crate::ddp::DdpOptions;
use crate::eval::{ActionBuf, EvalResult, Evaluator};
use crate::run::{Progress, RunContext, TrainError, TrainResult};
use drill_comm::{ProcessGroup, ReduceOp};
use drill_config::Config;
use drill_env::{DynVecEnv, make_vec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// One training run's shared state (see the module docs).
pub struct Session {
    start: Instant,
    algo: &'static str,
    /// This rank's generator: sampling, exploration, shuffling.
    pub rng: ChaCha8Rng,
    /// This rank's collector environments, copy `i` seeded `seed + rank * n + i`.
    pub venv: Box<dyn DynVecEnv>,
    /// Rank 0 only.
    evaluator: Option<Evaluator>,
    /// Env steps collected by all ranks (continued from the checkpoint when resuming).
    pub env_steps: u64,
    dist: Option<ProcessGroup>,
    rank: usize,
    world: usize,
    restarts: u32,
    last_eval: Option<(u64, EvalResult)>,
    best_eval: f64,
    stop_reached: bool,
}

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

impl Session {
    /// Seed everything from `config.seed` (and the rank), build and reset the environments.
    pub fn new(cfg: &Config, ctx: &RunContext<'_>, algo: &'static str) -> Result<Self, TrainError> {
        let dist = ctx.dist.clone().filter(|pg| pg.world_size() > 1);
        let (rank, world) = dist
            .as_ref()
            .map_or((0, 1), |pg| (pg.rank(), pg.world_size()));
        // The same initial weights everywhere (rank 0's are broadcast anyway).
        ctx.device.seed(cfg.seed);
        let n_env = cfg.env.collector_env_num;
        let mut venv = make_vec(
            &cfg.env.id,
            n_env,
            cfg.seed + (rank * n_env) as u64,
            cfg.env.env_threads,
        )?;
        venv.reset(None);
        let evaluator = (rank == 0)
            .then(|| {
                Evaluator::new(
                    &cfg.env.id,
                    cfg.env.evaluator_env_num,
                    cfg.env.n_evaluator_episode,
                    cfg.seed + (world * n_env) as u64,
                )
            })
            .transpose()?;
        let env_steps = ctx
            .resume
            .as_ref()
            .map(|ck| ck.counter("env_steps"))
            .transpose()?
            .unwrap_or(0);
        let rng = ctx
            .resume
            .as_ref()
            .and_then(|ck| ck.meta.get(&format!("rng.{rank}")))
            .and_then(|s| parse_rng_state(s))
            .unwrap_or_else(|| {
                ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(0x5eed).wrapping_add(rank as u64))
            });
        Ok(Self {
            start: Instant::now(),
            algo,
            rng,
            venv,
            evaluator,
            env_steps,
            dist,
            rank,
            world,
            restarts: ctx.restarts,
            last_eval: None,
            best_eval: f64::NEG_INFINITY,
            stop_reached: false,
        })
    }

    /// The process group when training data-parallel on more than one rank.
    pub fn dist(&self) -> Option<&ProcessGroup> {
        self.dist.as_ref()
    }

    /// This rank (0 without DDP).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks training together (1 without DDP).
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// DDP options from the config.
    pub fn ddp_options(cfg: &Config) -> DdpOptions {
        let (_, cap, check) = cfg.policy.ddp();
        DdpOptions {
            bucket_cap_mb: cap,
            check_every: check,
            ..DdpOptions::default()
        }
    }

    /// `n` per rank: divided by the world size (rounded up) when `policy.ddp_split_batch`.
    pub fn per_rank(&self, cfg: &Config, n: usize) -> usize {
        if cfg.policy.ddp().0 {
            n.div_ceil(self.world)
        } else {
            n
        }
    }

    /// The global env-step count while this rank is `local` steps into a collection (exact
    /// on one rank; assumes the others progress alike under DDP).
    pub fn env_steps_now(&self, local: u64) -> u64 {
        self.env_steps + local * self.world as u64
    }

    /// Account a finished collection of `local` env steps on this rank: the global count
    /// grows by every rank's (sum-all-reduced, as DI-engine's collector).
    pub fn collected(&mut self, local: u64) -> Result<(), TrainError> {
        let mut n = [local as i64];
        if let Some(pg) = &self.dist {
            pg.all_reduce(&mut n, ReduceOp::Sum)?;
        }
        self.env_steps += n[0] as u64;
        Ok(())
    }

    /// Average learner statistics across ranks before logging them.
    pub fn mean_across_ranks(&self, values: &mut [f32]) -> Result<(), TrainError> {
        if let Some(pg) = &self.dist {
            pg.all_reduce(values, ReduceOp::Avg)?;
        }
        Ok(())
    }

    /// An evaluation is due: none yet, or `eval_freq` train iterations since the last.
    pub fn eval_due(&self, iters: u64, eval_freq: u64) -> bool {
        self.last_eval
            .as_ref()
            .is_none_or(|(at, _)| iters >= at + eval_freq)
    }

    /// Evaluate `policy` (on rank 0; every rank calls this), log it, write `best` (when
    /// improved) and `latest` checkpoints, and return whether `env.stop_value` is reached
    /// (rank 0's decision, the same on every rank).
    pub fn evaluate(
        &mut self,
        cfg: &Config,
        ctx: &mut RunContext<'_>,
        iters: u64,
        policy: impl FnMut(&[f32], &mut ActionBuf),
        checkpoint: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<bool, TrainError> {
        let rngs = self.gather_rng_states()?;
        let result = match &mut self.evaluator {
            Some(evaluator) => {
                let result = evaluator.run(policy);
                ctx.reporter
                    .scalar("eval/episodic_return_mean", result.mean, self.env_steps);
                ctx.reporter
                    .scalar("eval/episodic_return_std", result.std, self.env_steps);
                let (env_steps, algo) = (self.env_steps, self.algo);
                let mut build = || with_counters(checkpoint(), env_steps, iters, algo, &rngs);
                if result.mean > self.best_eval {
                    self.best_eval = result.mean;
                    ctx.reporter.checkpoint("best", &mut build)?;
                }
                ctx.reporter.checkpoint("latest", &mut build)?;
                Some(result)
            }
            None => None,
        };
        let result = match &self.dist {
            Some(pg) => pg.broadcast_object(result.as_ref(), 0)?,
            None => result.expect("rank 0 evaluates"),
        };
        self.stop_reached = cfg.env.stop_value.is_some_and(|v| result.mean >= v);
        self.last_eval = Some((iters, result));
        Ok(self.stop_reached)
    }

    /// Each rank's generator state, on rank 0 (empty elsewhere).
    fn gather_rng_states(&self) -> Result<Vec<String>, TrainError> {
        let mine = rng_state(&self.rng);
        Ok(match &self.dist {
            Some(pg) => pg.gather_object(&mine, 0)?.unwrap_or_default(),
            None => vec![mine],
        })
    }

    /// `max_env_step` or `max_train_iter` is reached: decided on rank 0 and broadcast.
    pub fn limits_reached(&self, cfg: &Config, iters: u64) -> Result<bool, TrainError> {
        self.rank0_decides(
            cfg.max_env_step.is_some_and(|m| self.env_steps >= m)
                || cfg.max_train_iter.is_some_and(|m| iters >= m),
        )
    }

    /// Rank 0's `local` decision, on every rank, so control flow that runs collectives never
    /// branches differently across ranks.
    pub fn rank0_decides(&self, local: bool) -> Result<bool, TrainError> {
        let mut v = [u8::from(local)];
        if let Some(pg) = &self.dist {
            pg.broadcast(&mut v, 0)?;
        }
        Ok(v[0] == 1)
    }

    /// Seconds since the session started.
    pub fn seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Report counters for the progress display.
    pub fn progress(&self, cfg: &Config, ctx: &mut RunContext<'_>, iters: u64) {
        ctx.reporter.progress(&Progress {
            env_steps: self.env_steps,
            train_iters: iters,
            last_eval: self.last_eval.as_ref().map(|(_, r)| r.mean),
            env_steps_per_sec: self.env_steps as f64 / self.seconds(),
            max_env_step: cfg.max_env_step,
        });
    }

    /// Write the `final` checkpoint (rank 0) and build the result.
    pub fn finish(
        self,
        ctx: &mut RunContext<'_>,
        iters: u64,
        checkpoint: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<TrainResult, TrainError> {
        let rngs = self.gather_rng_states()?;
        let (env_steps, algo) = (self.env_steps, self.algo);
        if self.rank == 0 {
            ctx.reporter.checkpoint("final", &mut || {
                with_counters(checkpoint(), env_steps, iters, algo, &rngs)
            })?;
        }
        let wall = self.seconds();
        let (_, eval) = self
            .last_eval
            .expect("the loop evaluates before anything else");
        Ok(TrainResult {
            stop_reached: self.stop_reached,
            env_steps,
            train_iters: iters,
            wall_seconds: wall,
            env_steps_per_sec: env_steps as f64 / wall,
            eval_reward_mean: eval.mean,
            eval_reward_std: eval.std,
            eval_episodes: eval.returns.len(),
            world_size: self.world,
            restarts: self.restarts,
        })
    }
}

fn with_counters(
    mut ck: Checkpoint,
    env_steps: u64,
    iters: u64,
    algo: &str,
    rngs: &[String],
) -> Checkpoint {
    ck.meta.insert("env_steps".into(), env_steps.to_string());
    ck.meta.insert("train_iters".into(), iters.to_string());
    ck.meta.insert("algo".into(), algo.into());
    ck.meta.insert("world_size".into(), rngs.len().to_string());
    for (r, s) in rngs.iter().enumerate() {
        ck.meta.insert(format!("rng.{r}"), s.clone());
    }
    ck
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
