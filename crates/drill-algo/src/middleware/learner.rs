//! [`OffPolicyLearner`]: `update_per_collect` gradient steps on replay minibatches.

use std::cell::RefCell;

use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand_chacha::ChaCha8Rng;

use super::task_err;
use crate::data::{Batch, ReplayBuffer};
use crate::ddp::Ranks;
use crate::error::TrainError;
use crate::policy::{LearnOutput, Policy};

/// Samples `batch_size` transitions and calls the policy's learn side `update_per_collect`
/// times per step, once the buffer holds `learning_starts` (rank 0's buffer decides under
/// DDP, so every rank runs the same number of updates); pauses at multiples of `eval_freq` so
/// the evaluator sees those iterations, as DI-engine's learner does. Logs the last update's
/// scalars, averaged over ranks.
pub struct OffPolicyLearner<'a, P> {
    policy: &'a RefCell<P>,
    buffer: &'a RefCell<ReplayBuffer>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    /// Minibatch size.
    pub batch_size: usize,
    /// Updates per step.
    pub update_per_collect: usize,
    /// Buffer fill before the first update.
    pub learning_starts: usize,
    /// Pause a round at multiples of this.
    pub eval_freq: u64,
    /// Prioritized replay's importance exponent; `None` for uniform replay.
    pub priority_beta: Option<f64>,
    batch: Batch,
    out: LearnOutput,
    logged: Vec<f32>,
}

impl<'a, P: Policy<Data = Batch>> OffPolicyLearner<'a, P> {
    /// A learner for `policy` on `buffer`; set the public fields for the schedule.
    pub fn new(
        policy: &'a RefCell<P>,
        buffer: &'a RefCell<ReplayBuffer>,
        rng: &'a RefCell<ChaCha8Rng>,
        ranks: Ranks,
    ) -> Self {
        Self {
            policy,
            buffer,
            rng,
            ranks,
            batch_size: 64,
            update_per_collect: 1,
            learning_starts: 64,
            eval_freq: u64::MAX,
            priority_beta: None,
            batch: Batch::default(),
            out: LearnOutput::default(),
            logged: Vec::new(),
        }
    }
}

impl<P: Policy<Data = Batch>> Middleware<OnlineRLContext> for OffPolicyLearner<'_, P> {
    fn name(&self) -> String {
        "learner".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let ready = self.buffer.borrow().len() >= self.learning_starts.max(self.batch_size);
        if !self.ranks.rank0_decides(ready).map_err(task_err)? {
            return Ok(());
        }
        let mut policy = self.policy.borrow_mut();
        let mut buffer = self.buffer.borrow_mut();
        let mut rng = self.rng.borrow_mut();
        for _ in 0..self.update_per_collect {
            buffer.sample(
                self.batch_size,
                self.priority_beta.unwrap_or(0.0),
                &mut *rng,
                &mut self.batch,
            );
            self.out.clear();
            policy
                .learn(&self.batch, ctx.env_step, &mut rng, &mut self.out)
                .map_err(task_err)?;
            if !self.out.loss.is_finite() {
                return Err(task_err(TrainError::NonFinite {
                    iter: policy.train_iter(),
                    value: f64::from(self.out.loss),
                }));
            }
            if self.priority_beta.is_some() {
                buffer.update_priorities(&self.batch.indices, &self.out.priorities);
            }
            if policy.train_iter().is_multiple_of(self.eval_freq) {
                break;
            }
        }
        ctx.train_iter = policy.train_iter();
        log_scalars(ctx, &self.ranks, &self.out, &mut self.logged)
    }
}

/// Average `out`'s scalars over ranks and put them into `ctx.train_output`.
pub(crate) fn log_scalars(
    ctx: &mut OnlineRLContext,
    ranks: &Ranks,
    out: &LearnOutput,
    scratch: &mut Vec<f32>,
) -> Result<(), TaskError> {
    scratch.clear();
    scratch.extend(out.scalars.iter().map(|&(_, v)| v));
    ranks.mean(scratch).map_err(task_err)?;
    for (&(tag, _), &v) in out.scalars.iter().zip(scratch.iter()) {
        ctx.train_output.push((tag.into(), f64::from(v)));
    }
    Ok(())
}
