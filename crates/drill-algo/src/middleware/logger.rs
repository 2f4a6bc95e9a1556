//! [`Outputs`] (the run's reporter, shared by the middlewares that write) and
//! [`OnlineLogger`] (TensorBoard scalars and progress from what the step produced).

use std::cell::RefCell;
use std::time::Instant;

use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};

use super::{EpisodeReturns, Epsilon, EvalOutput};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::context::{Progress, Reporter};

/// The run's [`Reporter`], shared by [`OnlineLogger`] and [`crate::middleware::CkptSaver`].
pub(crate) struct Outputs<'a>(RefCell<&'a mut dyn Reporter>);

impl<'a> Outputs<'a> {
    /// Share `reporter`.
    pub(crate) fn new(reporter: &'a mut dyn Reporter) -> Self {
        Self(RefCell::new(reporter))
    }

    /// See [`Reporter::scalar`].
    pub(crate) fn scalar(&self, tag: &str, value: f64, step: u64) {
        self.0.borrow_mut().scalar(tag, value, step);
    }

    /// See [`Reporter::progress`].
    pub(crate) fn progress(&self, p: &Progress) {
        self.0.borrow_mut().progress(p);
    }

    /// Persist `ck` as `name`.
    pub(crate) fn checkpoint(&self, name: &str, ck: Checkpoint) -> Result<(), CheckpointError> {
        let mut ck = Some(ck);
        self.0
            .borrow_mut()
            .checkpoint(name, &mut || ck.take().unwrap_or_default())
    }

    /// Persist what `build` makes as `name`, building only if the reporter writes it.
    pub(crate) fn checkpoint_with(
        &self,
        name: &str,
        build: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<(), CheckpointError> {
        self.0.borrow_mut().checkpoint(name, build)
    }
}

/// Writes what the step produced (episode returns, evaluation, learner scalars, epsilon) and
/// updates the progress display (DI-engine's `online_logger`). Register it last.
pub(crate) struct OnlineLogger<'a> {
    out: &'a Outputs<'a>,
    start: Instant,
    from_env_step: u64,
    max_env_step: Option<u64>,
}

impl<'a> OnlineLogger<'a> {
    /// Log to `out`; `max_env_step` sizes the progress bar; the run starts at env step
    /// `from_env_step` (a resumed run's rate counts its own steps).
    pub(crate) fn new(out: &'a Outputs<'a>, max_env_step: Option<u64>, from_env_step: u64) -> Self {
        Self {
            out,
            start: Instant::now(),
            from_env_step,
            max_env_step,
        }
    }
}

impl Middleware<OnlineRLContext> for OnlineLogger<'_> {
    fn name(&self) -> String {
        "logger".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let step = ctx.env_step;
        if let Some(r) = ctx.ext.get::<EpisodeReturns>() {
            for &(ret, at) in &r.0 {
                self.out.scalar("charts/episodic_return", ret, at);
            }
        }
        if let Some(e) = ctx.ext.get::<EvalOutput>() {
            self.out
                .scalar("eval/episodic_return_mean", e.result.mean, e.env_step);
            self.out
                .scalar("eval/episodic_return_std", e.result.std, e.env_step);
        }
        if !ctx.train_output.is_empty() {
            for (tag, v) in &ctx.train_output {
                self.out.scalar(tag, *v, step);
            }
            if let Some(Epsilon(eps)) = ctx.ext.get::<Epsilon>() {
                self.out.scalar("charts/epsilon", *eps, step);
            }
        }
        let secs = self.start.elapsed().as_secs_f64();
        let rate = step.saturating_sub(self.from_env_step) as f64 / secs;
        if !ctx.train_output.is_empty() {
            self.out.scalar("charts/SPS", rate, step);
        }
        self.out.progress(&Progress {
            env_steps: step,
            train_iters: ctx.train_iter,
            last_eval: ctx.last_eval_value,
            env_steps_per_sec: rate,
            max_env_step: self.max_env_step,
        });
        Ok(())
    }
}
