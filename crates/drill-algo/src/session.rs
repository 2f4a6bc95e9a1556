//! [`Session`]: the plumbing every algorithm's training loop shares — seeding, the collector's
//! environments, the evaluator, env-step counting, evaluate → checkpoint → stop decisions,
//! progress, and the final [`TrainResult`]. Algorithms keep only their own logic.

use crate::checkpoint::Checkpoint;
use crate::eval::{ActionBuf, EvalResult, Evaluator};
use crate::run::{Progress, RunContext, TrainError, TrainResult};
use drill_config::Config;
use drill_env::{DynVecEnv, make_vec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

/// One training run's shared state (see the module docs).
pub struct Session {
    start: Instant,
    algo: &'static str,
    /// The run's generator: sampling, exploration, shuffling.
    pub rng: ChaCha8Rng,
    /// The collector's environments, reset with copy `i` seeded `seed + i`.
    pub venv: Box<dyn DynVecEnv>,
    evaluator: Evaluator,
    /// Env steps collected (continued from the checkpoint when resuming).
    pub env_steps: u64,
    last_eval: Option<(u64, EvalResult)>,
    best_eval: f64,
    stop_reached: bool,
}

impl Session {
    /// Seed everything from `config.seed`, build and reset the environments.
    pub fn new(cfg: &Config, ctx: &RunContext<'_>, algo: &'static str) -> Result<Self, TrainError> {
        ctx.device.seed(cfg.seed);
        let n_env = cfg.env.collector_env_num;
        let mut venv = make_vec(&cfg.env.id, n_env, cfg.seed, cfg.env.env_threads)?;
        venv.reset(None);
        let evaluator = Evaluator::new(
            &cfg.env.id,
            cfg.env.evaluator_env_num,
            cfg.env.n_evaluator_episode,
            cfg.seed + n_env as u64,
        )?;
        let env_steps = ctx
            .resume
            .as_ref()
            .map(|ck| ck.counter("env_steps"))
            .transpose()?
            .unwrap_or(0);
        Ok(Self {
            start: Instant::now(),
            algo,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_add(0x5eed)),
            venv,
            evaluator,
            env_steps,
            last_eval: None,
            best_eval: f64::NEG_INFINITY,
            stop_reached: false,
        })
    }

    /// An evaluation is due: none yet, or `eval_freq` train iterations since the last.
    pub fn eval_due(&self, iters: u64, eval_freq: u64) -> bool {
        self.last_eval
            .as_ref()
            .is_none_or(|(at, _)| iters >= at + eval_freq)
    }

    /// Evaluate `policy`, log it, write `best` (when improved) and `latest` checkpoints, and
    /// return whether `env.stop_value` is reached.
    pub fn evaluate(
        &mut self,
        cfg: &Config,
        ctx: &mut RunContext<'_>,
        iters: u64,
        policy: impl FnMut(&[f32], &mut ActionBuf),
        checkpoint: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<bool, TrainError> {
        let result = self.evaluator.run(policy);
        ctx.reporter
            .scalar("eval/episodic_return_mean", result.mean, self.env_steps);
        ctx.reporter
            .scalar("eval/episodic_return_std", result.std, self.env_steps);
        let (env_steps, algo) = (self.env_steps, self.algo);
        let mut build = || with_counters(checkpoint(), env_steps, iters, algo);
        if result.mean > self.best_eval {
            self.best_eval = result.mean;
            ctx.reporter.checkpoint("best", &mut build)?;
        }
        ctx.reporter.checkpoint("latest", &mut build)?;
        self.stop_reached = cfg.env.stop_value.is_some_and(|v| result.mean >= v);
        self.last_eval = Some((iters, result));
        Ok(self.stop_reached)
    }

    /// `max_env_step` or `max_train_iter` is reached.
    pub fn limits_reached(&self, cfg: &Config, iters: u64) -> bool {
        cfg.max_env_step.is_some_and(|m| self.env_steps >= m)
            || cfg.max_train_iter.is_some_and(|m| iters >= m)
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

    /// Write the `final` checkpoint and build the result.
    pub fn finish(
        self,
        ctx: &mut RunContext<'_>,
        iters: u64,
        checkpoint: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<TrainResult, TrainError> {
        let (env_steps, algo) = (self.env_steps, self.algo);
        ctx.reporter.checkpoint("final", &mut || {
            with_counters(checkpoint(), env_steps, iters, algo)
        })?;
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
            world_size: 1,
            restarts: 0,
        })
    }
}

fn with_counters(mut ck: Checkpoint, env_steps: u64, iters: u64, algo: &str) -> Checkpoint {
    ck.meta.insert("env_steps".into(), env_steps.to_string());
    ck.meta.insert("train_iters".into(), iters.to_string());
    ck.meta.insert("algo".into(), algo.into());
    ck
}
