//! drill's built-in middleware (DI-engine's `ding.framework.middleware`): the pieces every
//! training pipeline is composed of, each a [`drill_task::Middleware`] over
//! [`OnlineRLContext`](drill_task::OnlineRLContext). They are generic: each takes the
//! algorithm as a [`Policy`](crate::policy::Policy) (shared as `&RefCell<P>`) and calls the
//! side it needs; the algorithm itself lives in its own file (`dqn.rs`, `ppo.rs`, `sac.rs`).
//!
//! | middleware | reads from ctx | writes to ctx |
//! |---|---|---|
//! | [`InteractionEvaluator`] | `train_iter` | `eval_value`, `last_eval_*`, `EvalOutput`; finish at `stop_value` |
//! | `TerminationChecker` | `env_step`, `train_iter` | finish at `max_env_step` / `max_train_iter` |
//! | [`EpsGreedyHandler`] | `env_step` | [`Epsilon`] |
//! | [`StepCollector`] | [`Epsilon`] | [`Transitions`], `EpisodeReturns`, `Collected`, `env_step`, `env_episode` |
//! | [`NStepRewardEnhancer`] | raw [`Transitions`] | n-step [`Transitions`] |
//! | [`DataPusher`] | n-step [`Transitions`] | the replay buffer |
//! | [`OffPolicyLearner`] | the replay buffer | `train_iter`, `train_output` |
//! | `RolloutCollector`, `GaeEstimator` / `VtraceEstimator`, `OnPolicyLearner` | [`Rollout`](crate::data::Rollout): rollout, advantages, update | `env_step`, `train_iter`, `train_output` |
//! | `CkptSaver` | `EvalOutput` | `best` / `latest` / `final` checkpoints (with `TrainClock`'s time) |
//! | `OnlineLogger` | everything above | TensorBoard scalars, progress |
//! | `ContextExchanger`, `ModelExchanger`, `FinishSync` | | across processes (Parallel runner) |
//!
//! Under DDP (`policy.multi_gpu`) the same middlewares are rank-aware through
//! [`Ranks`]:
//! env-step counts are summed, evaluation runs on rank 0 and is broadcast, and every decision
//! that changes control flow (stop, learning start, limits) is rank 0's, so all ranks run
//! the same collectives in the same order.
//!
//! Middlewares that do work skip it once the task is finished (an evaluation that reached the
//! stop value ends the run before more data is collected).

mod ckpt;
mod collector;
mod evaluator;
mod exchange;
mod learner;
mod logger;
mod onpolicy;
#[cfg(test)]
pub(crate) mod probe;
mod roles;

pub(crate) use ckpt::{CkptSaver, TrainClock};
pub use collector::{DataPusher, EpsGreedyHandler, NStepRewardEnhancer, StepCollector};
pub use evaluator::InteractionEvaluator;
pub(crate) use evaluator::{Interrupted, TerminationChecker};
pub(crate) use exchange::{learner_sender, use_exchangers};
pub use learner::OffPolicyLearner;
pub(crate) use logger::{OnlineLogger, Outputs};
pub(crate) use onpolicy::{GaeEstimator, OnPolicyLearner, RolloutCollector, VtraceEstimator};
pub(crate) use roles::in_one_process;
pub use roles::{RolePlan, Roles};

use crate::context::TrainResult;
use crate::ddp::Ranks;
use crate::eval::EvalResult;
use drill_env::{ActionBuf, Dtype, ObsBuf};
use drill_task::TaskError;
use serde::{Deserialize, Serialize};

/// The exploration rate the collector uses this step ([`EpsGreedyHandler`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Epsilon(pub f64);

/// Transitions collected this step: one-step from [`StepCollector`] (with `env` and
/// `truncated`), or n-step after [`NStepRewardEnhancer`] (with `discounts`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Transitions {
    /// Elements per observation.
    pub obs_dim: usize,
    /// Which collector env copy each came from (one-step only).
    pub env: Vec<u32>,
    /// Observations, `obs_dim` elements each.
    pub obs: ObsBuf,
    /// Actions.
    pub actions: ActionBuf,
    /// Rewards (n-step: discounted sums).
    pub rewards: Vec<f32>,
    /// Next observations (the episode's last one when it ended).
    pub next_obs: ObsBuf,
    /// The episode terminated (no bootstrap).
    pub terminated: Vec<bool>,
    /// The episode was cut by a time limit (one-step only).
    pub truncated: Vec<bool>,
    /// `gamma^m` on the bootstrap value (n-step only; empty for one-step).
    pub discounts: Vec<f32>,
}

impl Transitions {
    /// None held yet: observations of `obs_dim` elements of `dtype`, actions of `actions`'
    /// kind (its contents are not used).
    pub fn empty(obs_dim: usize, dtype: Dtype, actions: &ActionBuf) -> Self {
        Self {
            obs_dim,
            obs: ObsBuf::new(dtype),
            next_obs: ObsBuf::new(dtype),
            actions: actions.empty_like(),
            ..Self::default()
        }
    }

    /// Transitions held.
    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.rewards.is_empty()
    }
}

/// What this process's collector gathered this step (counted before any n-step rewrite).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Collected {
    /// Env steps, every rank's under DDP.
    pub env_steps: u64,
    /// Episodes finished, every rank's under DDP.
    pub episodes: u64,
}

/// Episodes finished this step: `(return, env step)` each.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EpisodeReturns(pub Vec<(f64, u64)>);

/// This step's evaluation (rank 0's, on every rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EvalOutput {
    /// Train iteration of the evaluated weights.
    pub train_iter: u64,
    /// Env steps at that point.
    pub env_step: u64,
    /// The returns.
    pub result: EvalResult,
    /// `env.stop_value` was reached.
    pub stop: bool,
}

/// The last evaluation so far (kept across steps), for the run's result.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LastEval(pub EvalOutput);

/// The run's result from the task's last context; `from_env_step` is where it started (a
/// resumed run's checkpoint), so the rate counts this run's steps only; `clock` gives this
/// run's time and the total with the runs it continues.
pub(crate) fn run_result(
    ctx: &drill_task::OnlineRLContext,
    from_env_step: u64,
    clock: &TrainClock,
    world_size: usize,
    restarts: u32,
) -> TrainResult {
    let last = ctx.ext.get::<LastEval>().map(|l| &l.0);
    let (seconds, total) = clock.seconds();
    TrainResult {
        stop_reached: last.is_some_and(|e| e.stop),
        env_steps: ctx.env_step,
        train_iters: ctx.train_iter,
        wall_seconds: seconds,
        total_wall_seconds: total,
        env_steps_per_sec: ctx.env_step.saturating_sub(from_env_step) as f64 / seconds,
        eval_reward_mean: last.map_or(f64::NAN, |e| e.result.mean),
        eval_reward_std: last.map_or(f64::NAN, |e| e.result.std),
        eval_episodes: last.map_or(0, |e| e.result.returns.len()),
        world_size,
        restarts,
        interrupted: ctx.ext.get::<Interrupted>().is_some(),
        error: None,
    }
}

/// Account a collection of `local` env steps and `returns` on this rank: every rank's sums
/// go to `env_step` / `env_episode` and [`Collected`]; the returns go into the ctx.
pub(crate) fn account_collection(
    ctx: &mut drill_task::OnlineRLContext,
    ranks: &Ranks,
    local: u64,
    returns: EpisodeReturns,
) -> Result<(), TaskError> {
    let mut counts = [local as i64, returns.0.len() as i64];
    ranks.sum(&mut counts).map_err(task_err)?;
    let collected = Collected {
        env_steps: counts[0] as u64,
        episodes: counts[1] as u64,
    };
    ctx.env_step += collected.env_steps;
    ctx.env_episode += collected.episodes;
    ctx.ext.insert(collected);
    ctx.ext.insert(returns);
    Ok(())
}

/// A training error as a middleware error (kept as its typed source).
pub(crate) fn task_err(e: impl Into<crate::error::TrainError>) -> TaskError {
    TaskError::source(e.into())
}
