//! [`InteractionEvaluator`] (evaluate every `eval_freq` train iterations, finish at the stop
//! value) and [`TerminationChecker`] (finish at `max_env_step` / `max_train_iter`, or when a
//! signal asks).

use std::cell::RefCell;

use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};

use super::{EvalOutput, LastEval, task_err};
use crate::ddp::Ranks;
use crate::eval::{EvalResult, Evaluator};
use crate::interrupt;
use crate::policy::Policy;

/// Evaluates the policy's eval side when none has been evaluated yet or `eval_freq` train
/// iterations passed since the last evaluation, logging one line per evaluation; finishes
/// the task when the mean return reaches `stop_value`. Under DDP every rank runs its share
/// of the episodes ([`crate::envs::evaluator`]) and every rank gets the whole result, the
/// same as one process evaluating alone would get.
pub struct InteractionEvaluator<'a, P> {
    evaluator: Option<Evaluator>,
    eval_freq: u64,
    stop_value: Option<f64>,
    finish_on_stop: bool,
    remote: bool,
    ranks: Ranks,
    policy: &'a RefCell<P>,
}

impl<'a, P: Policy> InteractionEvaluator<'a, P> {
    /// `evaluator` is this rank's share (`None`: a rank with no evaluator copy).
    pub fn new(
        evaluator: Option<Evaluator>,
        eval_freq: u64,
        stop_value: Option<f64>,
        ranks: Ranks,
        policy: &'a RefCell<P>,
    ) -> Self {
        Self {
            evaluator,
            eval_freq,
            stop_value,
            finish_on_stop: true,
            remote: false,
            ranks,
            policy,
        }
    }

    /// The learner runs elsewhere and sends the weights that are due (every `eval_freq`-th
    /// iteration by its count): evaluate each new one, and leave the stop to the learner (it
    /// decides, from the result it is sent).
    pub(crate) fn remote(mut self) -> Self {
        self.remote = true;
        self.finish_on_stop = false;
        self
    }
}

impl<P: Policy> Middleware<OnlineRLContext> for InteractionEvaluator<'_, P> {
    fn name(&self) -> String {
        "evaluator".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        let due = ctx.last_eval_iter.is_none_or(|at| match self.remote {
            true => ctx.train_iter != at,
            false => ctx.train_iter >= at + self.eval_freq,
        });
        if task.finished() || !due {
            return Ok(());
        }
        let mine = match self.evaluator.as_mut() {
            Some(e) => {
                let mut policy = self.policy.borrow_mut();
                e.run_episodes(|obs, hidden, out| policy.eval(obs, hidden, out))
                    .map_err(task_err)?
            }
            None => Vec::new(),
        };
        let episodes = self.ranks.all_gather(mine).map_err(task_err)?;
        let result = EvalResult::from_episodes(episodes.into_iter().flatten().collect());
        let stop = self.stop_value.is_some_and(|v| result.mean >= v);
        if self.ranks.rank() == 0 {
            tracing::info!(
                "eval at env step {}, train iteration {}: {:.1} ± {:.1} over {} episodes{}",
                ctx.env_step,
                ctx.train_iter,
                result.mean,
                result.std,
                result.returns.len(),
                if stop { " (stop value reached)" } else { "" }
            );
        }
        ctx.eval_value = Some(result.mean);
        ctx.last_eval_iter = Some(ctx.train_iter);
        ctx.last_eval_value = Some(result.mean);
        let out = EvalOutput {
            train_iter: ctx.train_iter,
            env_step: ctx.env_step,
            result,
            stop,
        };
        ctx.ext.keep(LastEval(out.clone()));
        ctx.ext.insert(out);
        if stop && self.finish_on_stop {
            task.finish();
        }
        Ok(())
    }
}

/// In the context once a signal stopped the run ([`crate::interrupt`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interrupted;

/// Finishes the task once `max_env_step` env steps were collected or `max_train_iter`
/// updates done (rank 0 decides under DDP), or a signal asked any rank to stop
/// ([`crate::interrupt`]; [`Interrupted`] is then put in the context).
pub(crate) struct TerminationChecker {
    max_env_step: Option<u64>,
    max_train_iter: Option<u64>,
    ranks: Ranks,
}

impl TerminationChecker {
    /// The limits (`None`: no limit).
    pub(crate) fn new(
        max_env_step: Option<u64>,
        max_train_iter: Option<u64>,
        ranks: Ranks,
    ) -> Self {
        Self {
            max_env_step,
            max_train_iter,
            ranks,
        }
    }
}

impl Middleware<OnlineRLContext> for TerminationChecker {
    fn name(&self) -> String {
        "termination_checker".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let reached = self.max_env_step.is_some_and(|m| ctx.env_step >= m)
            || self.max_train_iter.is_some_and(|m| ctx.train_iter >= m);
        let (stop, interrupted) = self
            .ranks
            .stop(reached, interrupt::requested())
            .map_err(task_err)?;
        if interrupted {
            ctx.ext.insert(Interrupted);
        }
        if stop {
            task.finish();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::middleware::probe::Probe;
    use drill_task::Task;

    #[test]
    fn evaluates_at_start_and_every_eval_freq_then_finishes_at_the_stop_value() {
        let evaluator = Evaluator::new("CartPole-v1", 2, 2, 0).unwrap();
        let policy = RefCell::new(Probe::new(4, 0));
        let mut task = Task::<OnlineRLContext>::new();
        task.use_mw(InteractionEvaluator::new(
            Some(evaluator),
            40,
            Some(1e9),
            Ranks::alone(),
            &policy,
        ));
        task.use_fn("train", |ctx, _| {
            ctx.train_iter += 10;
            Ok(())
        });
        let mut evals = Vec::new();
        for _ in 0..9 {
            task.step().unwrap();
            let ctx = task.ctx_mut();
            if let Some(e) = ctx.ext.get::<EvalOutput>() {
                evals.push(e.train_iter);
            }
            drill_task::Context::renew(ctx);
        }
        assert_eq!(evals, [0, 40, 80]);
        assert!(policy.borrow().evals > 0);
        assert!(!task.handle().finished(), "stop value 1e9 is not reached");

        let policy = RefCell::new(Probe::new(4, 0));
        let mut task = Task::<OnlineRLContext>::new();
        let evaluator = Evaluator::new("CartPole-v1", 2, 2, 0).unwrap();
        task.use_mw(InteractionEvaluator::new(
            Some(evaluator),
            40,
            Some(1.0),
            Ranks::alone(),
            &policy,
        ));
        let ctx = task.run(Some(5)).unwrap();
        assert_eq!(ctx.total_step, 0, "finished in the first step");
        assert!(ctx.ext.get::<LastEval>().unwrap().0.stop);
    }

    #[test]
    fn termination_at_max_env_step_or_train_iter() {
        for (env, iter, steps) in [(Some(30), None, 3), (None, Some(20), 2)] {
            let mut task = Task::<OnlineRLContext>::new();
            task.use_fn("work", |ctx, _| {
                ctx.env_step += 10;
                ctx.train_iter += 10;
                Ok(())
            });
            task.use_mw(TerminationChecker::new(env, iter, Ranks::alone()));
            let ctx = task.run(Some(100)).unwrap();
            assert_eq!(ctx.total_step + 1, steps);
        }
    }
}
