//! [`Task`]: runs the middleware pipeline step by step; [`Middleware`]: one stage of it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use crate::ctx::Context;
use crate::error::TaskError;
use crate::events::EventBus;
use crate::handle::TaskHandle;
use crate::labels::Labels;
use crate::stage::{Shared, Stage, check_async};
use crate::timer::{Clock, StepTimer};

/// One stage of the pipeline. `forward` is DI-engine's code before `yield` (registration
/// order), `backward` the code after it (reverse order).
pub trait Middleware<C> {
    /// Name for timing and errors.
    fn name(&self) -> String;
    /// Before the rest of the pipeline.
    fn forward(&mut self, ctx: &mut C, task: &TaskHandle) -> Result<(), TaskError>;
    /// After the rest of the pipeline.
    fn backward(&mut self, _ctx: &mut C, _task: &TaskHandle) -> Result<(), TaskError> {
        Ok(())
    }
}

struct FnMiddleware<F> {
    name: String,
    f: F,
}

impl<C, F> Middleware<C> for FnMiddleware<F>
where
    F: FnMut(&mut C, &TaskHandle) -> Result<(), TaskError>,
{
    fn name(&self) -> String {
        self.name.clone()
    }
    fn forward(&mut self, ctx: &mut C, task: &TaskHandle) -> Result<(), TaskError> {
        (self.f)(ctx, task)
    }
}

/// The pipeline and its context. Middlewares may borrow what outlives `'a` (a run's
/// reporter, shared buffers): they run on the calling thread, so they need not be `Send`.
pub struct Task<'a, C: Context> {
    mws: Vec<Box<dyn Middleware<C> + 'a>>,
    stages: Vec<Box<dyn Stage<C> + 'a>>,
    async_mode: bool,
    checked: bool,
    handle: TaskHandle,
    timer: Option<StepTimer>,
    ctx: C,
}

impl<C: Context> Default for Task<'_, C> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a, C: Context> Task<'a, C> {
    /// A standalone task; labels `standalone` plus those in `DRILL_LABELS` (comma-separated).
    pub fn new() -> Self {
        let mut labels = Labels::new(["standalone"]);
        if let Ok(list) = std::env::var("DRILL_LABELS") {
            labels.extend_from_list(&list);
        }
        Self::with_labels(labels)
    }

    /// A task with exactly `labels`.
    pub fn with_labels(labels: Labels) -> Self {
        Self {
            mws: Vec::new(),
            stages: Vec::new(),
            async_mode: false,
            checked: false,
            handle: TaskHandle {
                finish: Arc::default(),
                step: Arc::default(),
                events: EventBus::default(),
                labels: Arc::new(RwLock::new(labels)),
                barrier: Arc::default(),
            },
            timer: None,
            ctx: C::default(),
        }
    }

    /// A task sharing `handle`'s finish flag, step counter, events, labels and barrier: e.g.
    /// inside [`crate::parallel::Parallel::run`], to build a pipeline whose middlewares
    /// borrow locals of `main`.
    pub fn with_handle(handle: TaskHandle) -> Self {
        Self {
            mws: Vec::new(),
            stages: Vec::new(),
            async_mode: false,
            checked: false,
            handle,
            timer: None,
            ctx: C::default(),
        }
    }

    /// Append a middleware (DI-engine's `task.use`).
    pub fn use_mw(&mut self, m: impl Middleware<C> + 'a) -> &mut Self {
        self.mws.push(Box::new(m));
        self
    }

    /// Append a closure as a forward-only middleware.
    pub fn use_fn(
        &mut self,
        name: &str,
        f: impl FnMut(&mut C, &TaskHandle) -> Result<(), TaskError> + 'a,
    ) -> &mut Self {
        self.use_mw(FnMiddleware {
            name: name.to_string(),
            f,
        })
    }

    /// Append a stage: stages run after every middleware's `forward` and before the
    /// `backward`s — in registration order, or all at once in async mode.
    pub fn use_stage(&mut self, s: impl Stage<C> + 'a) -> &mut Self {
        self.stages.push(Box::new(s));
        self.checked = false;
        self
    }

    /// Run the stages of each step concurrently (a thread each), joined at the end of the
    /// stage phase (DI-engine's `async_mode`). Their declared reads and writes are checked
    /// before the first step.
    pub fn async_mode(&mut self, on: bool) -> &mut Self {
        self.async_mode = on;
        if on {
            // DI-engine's `async` label, for `match_labels(["async"])`.
            self.handle.insert_label("async");
        }
        self.checked = false;
        self
    }

    /// Time every middleware (the `StepTimer` wrapper); log a table every `print_every` steps
    /// (0: only read it with [`Self::timer`]).
    pub fn step_timer(&mut self, print_every: u64) -> &mut Self {
        self.timer = Some(StepTimer::new(print_every));
        self
    }

    /// The timings, when enabled.
    pub fn timer(&self) -> Option<&StepTimer> {
        self.timer.as_ref()
    }

    /// What middlewares get: finish, events, labels.
    pub fn handle(&self) -> &TaskHandle {
        &self.handle
    }

    /// The current context.
    pub fn ctx(&self) -> &C {
        &self.ctx
    }

    /// The current context, mutably: e.g. to start from a checkpoint's counters.
    pub fn ctx_mut(&mut self) -> &mut C {
        &mut self.ctx
    }

    /// Run one step: every `forward` in order, then every `backward` in reverse order.
    pub fn step(&mut self) -> Result<(), TaskError> {
        let step = self.handle.step();
        // Names are read once per newly added middleware, not every step.
        if let Some(t) = &mut self.timer
            && t.stats().len() != self.mws.len()
        {
            t.ensure(self.mws.iter().map(|m| m.name()));
        }
        let h = &self.handle;
        let err = |m: &dyn Middleware<C>, phase, e: TaskError| TaskError::Middleware {
            middleware: m.name(),
            phase,
            step,
            source: Box::new(e),
        };
        if self.async_mode && !self.checked {
            check_async(&self.stages)?;
            self.checked = true;
        }
        match &mut self.timer {
            None => {
                for m in self.mws.iter_mut() {
                    m.forward(&mut self.ctx, h)
                        .map_err(|e| err(m.as_ref(), "forward", e))?;
                }
                run_stages(&mut self.stages, &mut self.ctx, h, self.async_mode, step)?;
                for m in self.mws.iter_mut().rev() {
                    m.backward(&mut self.ctx, h)
                        .map_err(|e| err(m.as_ref(), "backward", e))?;
                }
            }
            Some(timer) => {
                for (k, m) in self.mws.iter_mut().enumerate() {
                    let c = Clock::start();
                    m.forward(&mut self.ctx, h)
                        .map_err(|e| err(m.as_ref(), "forward", e))?;
                    timer.record(k, c.spent(), true);
                }
                run_stages(&mut self.stages, &mut self.ctx, h, self.async_mode, step)?;
                for (k, m) in self.mws.iter_mut().enumerate().rev() {
                    let c = Clock::start();
                    m.backward(&mut self.ctx, h)
                        .map_err(|e| err(m.as_ref(), "backward", e))?;
                    timer.record(k, c.spent(), false);
                }
                timer.end_step();
            }
        }
        self.handle.step.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Run steps until a middleware calls `finish` or `max_step` steps ran; each step starts
    /// from the renewed context of the last. Returns the last context.
    pub fn run(&mut self, max_step: Option<u64>) -> Result<C, TaskError> {
        let mut first = true;
        while !self.handle.finished() && max_step.is_none_or(|m| self.handle.step() < m) {
            if !first {
                self.ctx.renew();
            }
            first = false;
            self.step()?;
        }
        Ok(std::mem::take(&mut self.ctx))
    }
}

/// Run `stages` on `ctx`: in order, or each on its own thread (async), first error wins.
fn run_stages<C: Context>(
    stages: &mut [Box<dyn Stage<C> + '_>],
    ctx: &mut C,
    h: &TaskHandle,
    async_mode: bool,
    step: u64,
) -> Result<(), TaskError> {
    if stages.is_empty() {
        return Ok(());
    }
    let lock = RwLock::new(ctx);
    let run = |s: &mut Box<dyn Stage<C> + '_>| {
        let view = Shared::new(&lock, s.name(), s.reads(), s.writes());
        s.run(&view, h).map_err(|e| TaskError::Middleware {
            middleware: s.name(),
            phase: "stage",
            step,
            source: Box::new(e),
        })
    };
    if !async_mode {
        return stages.iter_mut().try_for_each(run);
    }
    std::thread::scope(|sc| {
        let threads: Vec<_> = stages.iter_mut().map(|s| sc.spawn(|| run(s))).collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(TaskError::msg("a stage panicked")))
            })
            .collect::<Result<Vec<()>, TaskError>>()
            .map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::OnlineRLContext;
    use std::sync::Mutex;

    struct Trace {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl Middleware<OnlineRLContext> for Trace {
        fn name(&self) -> String {
            self.name.into()
        }
        fn forward(&mut self, _: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
            self.log.lock().unwrap().push(format!("{}>", self.name));
            Ok(())
        }
        fn backward(&mut self, _: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
            self.log.lock().unwrap().push(format!("<{}", self.name));
            Ok(())
        }
    }

    #[test]
    fn forward_in_order_backward_reversed() {
        let log = Arc::new(Mutex::new(vec![]));
        let mut task = Task::<OnlineRLContext>::new();
        for name in ["a", "b", "c"] {
            task.use_mw(Trace {
                name,
                log: log.clone(),
            });
        }
        task.run(Some(1)).unwrap();
        assert_eq!(*log.lock().unwrap(), ["a>", "b>", "c>", "<c", "<b", "<a"]);
    }

    #[test]
    fn kept_fields_survive_renew_and_the_rest_is_fresh() {
        #[derive(Debug, PartialEq)]
        struct Buffer(Vec<u32>);
        struct Scratch;
        let mut task = Task::<OnlineRLContext>::new();
        task.use_fn("collect", |ctx, _| {
            assert!(ctx.ext.get::<Scratch>().is_none(), "step data is fresh");
            assert_eq!(ctx.eval_value, None);
            ctx.env_step += 8;
            ctx.ext.insert(Scratch);
            match ctx.ext.get_mut::<Buffer>() {
                Some(b) => b.0.push(1),
                None => ctx.ext.keep(Buffer(vec![1])),
            }
            Ok(())
        });
        task.use_fn("eval", |ctx, task| {
            ctx.eval_value = Some(1.0);
            ctx.last_eval_value = Some(ctx.env_step as f64);
            if ctx.env_step >= 32 {
                task.finish();
            }
            Ok(())
        });
        let mut ctx = task.run(None).unwrap();
        assert_eq!(ctx.env_step, 32);
        assert_eq!(
            ctx.total_step, 3,
            "renewed three times after the first step"
        );
        assert_eq!(ctx.last_eval_value, Some(32.0));
        assert_eq!(ctx.ext.remove::<Buffer>(), Some(Buffer(vec![1, 1, 1, 1])));
    }

    #[test]
    fn errors_name_the_middleware_and_step_and_timer_reads_back() {
        let mut task = Task::<OnlineRLContext>::new();
        task.step_timer(0);
        task.use_fn("sleepy", |_, _| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            Ok(())
        });
        task.use_fn("fails", |_, task| {
            if task.step() == 2 {
                return Err(TaskError::msg("replay buffer empty"));
            }
            Ok(())
        });
        let e = task.run(Some(10)).unwrap_err().to_string();
        assert_eq!(
            e,
            "middleware 'fails' (forward) at step 2: replay buffer empty"
        );
        let t = task.timer().unwrap().get("sleepy").unwrap();
        assert_eq!(t.steps, 2);
        assert!(t.last_ms >= 2.0 && t.mean_ms >= 2.0, "{t:?}");
    }

    #[test]
    fn labels_reach_middlewares() {
        let mut task = Task::<OnlineRLContext>::with_labels(Labels::new(["distributed", "node.1"]));
        task.use_fn("evaluator", |ctx, task| {
            if task.match_labels(&["node.1"])? {
                ctx.eval_value = Some(1.0);
            }
            assert!(!task.match_labels(&["node.0"])?);
            Ok(())
        });
        let ctx = task.run(Some(1)).unwrap();
        assert_eq!(ctx.eval_value, Some(1.0));
    }
}
