//! [`OffPolicyLearner`]: `update_per_collect` gradient steps on replay minibatches.

use std::cell::RefCell;

use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand_chacha::ChaCha8Rng;

use super::{Ranks, task_err};
use crate::TrainError;
use crate::data::{Batch, ReplayBuffer};
use crate::dqn::UpdateStats;

/// What an off-policy learner trains (DQN: online + target network and the acting copy).
pub trait OffPolicy {
    /// Updates done so far.
    fn train_iter(&self) -> u64;
    /// One gradient step on `batch`; TD errors into `td` when priorities are kept.
    fn update(
        &mut self,
        batch: &Batch,
        td: Option<&mut Vec<f32>>,
    ) -> Result<UpdateStats, TrainError>;
    /// After a round of updates: refresh what the collector and evaluator act with.
    fn publish(&mut self);
}

/// Samples `batch_size` transitions and updates `update_per_collect` times per step, once the
/// buffer holds `learning_starts` (rank 0's buffer decides under DDP, so every rank runs the
/// same number of updates); pauses at multiples of `eval_freq` so the evaluator sees those
/// iterations, as DI-engine's learner does.
pub struct OffPolicyLearner<'a, P: OffPolicy> {
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
    td: Vec<f32>,
}

impl<'a, P: OffPolicy> OffPolicyLearner<'a, P> {
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
            td: Vec::new(),
        }
    }
}

impl<P: OffPolicy> Middleware<OnlineRLContext> for OffPolicyLearner<'_, P> {
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
        let mut stats = UpdateStats::default();
        for _ in 0..self.update_per_collect {
            buffer.sample(
                self.batch_size,
                self.priority_beta.unwrap_or(0.0),
                &mut *self.rng.borrow_mut(),
                &mut self.batch,
            );
            let td = self.priority_beta.is_some().then_some(&mut self.td);
            stats = policy.update(&self.batch, td).map_err(task_err)?;
            if !stats.loss.is_finite() {
                return Err(task_err(TrainError::NonFinite {
                    iter: policy.train_iter(),
                    value: f64::from(stats.loss),
                }));
            }
            if self.priority_beta.is_some() {
                buffer.update_priorities(&self.batch.indices, &self.td);
            }
            if policy.train_iter().is_multiple_of(self.eval_freq) {
                break;
            }
        }
        policy.publish();
        ctx.train_iter = policy.train_iter();
        let mut logged = [stats.loss, stats.target_q_mean];
        self.ranks.mean(&mut logged).map_err(task_err)?;
        ctx.train_output
            .push(("losses/td_loss".into(), f64::from(logged[0])));
        ctx.train_output
            .push(("losses/target_q_mean".into(), f64::from(logged[1])));
        Ok(())
    }
}
