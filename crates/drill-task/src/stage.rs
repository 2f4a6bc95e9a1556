//! Async mode: [`Stage`]s of a step run concurrently (a thread each), joined at the end of
//! the step, as DI-engine's `async_mode`. Unlike DI-engine (issue #634: context fields missing
//! at random), every stage declares what context fields it reads and writes; a stage that
//! reads a field an async sibling writes in the same step is refused before the first step,
//! naming both, and a read or write of an undeclared field is an error naming the stage.

use std::collections::HashSet;
use std::sync::RwLock;

use crate::error::TaskError;
use crate::handle::TaskHandle;

/// A middleware that can run concurrently with its siblings: it touches the context only
/// through [`Shared`], for the fields it declares. Field names are the contract: `Shared`
/// checks that a name was declared, not which struct field the closure then touches.
pub trait Stage<C>: Send {
    /// Name for timing and errors.
    fn name(&self) -> String;
    /// Context fields read this step.
    fn reads(&self) -> &[&'static str];
    /// Context fields written this step.
    fn writes(&self) -> &[&'static str];
    /// One step's work.
    fn run(&mut self, ctx: &Shared<'_, C>, task: &TaskHandle) -> Result<(), TaskError>;
}

/// The step's context as one stage sees it: short locked reads and writes of declared fields.
pub struct Shared<'a, C> {
    ctx: &'a RwLock<&'a mut C>,
    stage: String,
    reads: HashSet<&'static str>,
    writes: HashSet<&'static str>,
}

impl<'a, C> Shared<'a, C> {
    pub(crate) fn new(
        ctx: &'a RwLock<&'a mut C>,
        stage: String,
        reads: &[&'static str],
        writes: &[&'static str],
    ) -> Self {
        Self {
            ctx,
            stage,
            reads: reads.iter().copied().collect(),
            writes: writes.iter().copied().collect(),
        }
    }

    /// Read `field` (declared in [`Stage::reads`]) through `f`.
    pub fn read<R>(&self, field: &'static str, f: impl FnOnce(&C) -> R) -> Result<R, TaskError> {
        if !self.reads.contains(field) && !self.writes.contains(field) {
            return Err(TaskError::msg(format!(
                "stage '{}' reads ctx field '{field}' without declaring it in reads()",
                self.stage
            )));
        }
        let guard = self.ctx.read().unwrap_or_else(|p| p.into_inner());
        Ok(f(&guard))
    }

    /// Write `field` (declared in [`Stage::writes`]) through `f`.
    pub fn write<R>(
        &self,
        field: &'static str,
        f: impl FnOnce(&mut C) -> R,
    ) -> Result<R, TaskError> {
        if !self.writes.contains(field) {
            return Err(TaskError::msg(format!(
                "stage '{}' writes ctx field '{field}' without declaring it in writes()",
                self.stage
            )));
        }
        let mut guard = self.ctx.write().unwrap_or_else(|p| p.into_inner());
        Ok(f(&mut guard))
    }
}

/// Refuse stage sets whose declared data flow needs an order async mode cannot give: a
/// field read by one stage and written by a sibling, or written by two.
pub(crate) fn check_async<C>(stages: &[Box<dyn Stage<C> + '_>]) -> Result<(), TaskError> {
    for (i, a) in stages.iter().enumerate() {
        for (j, b) in stages.iter().enumerate() {
            if i == j {
                continue;
            }
            if let Some(f) = a.reads().iter().find(|f| b.writes().contains(f)) {
                return Err(TaskError::msg(format!(
                    "async mode: stage '{}' reads ctx field '{f}', which its sibling '{}' writes in the same step; siblings run concurrently, so '{}' could run before it is produced. Run them serially (async_mode off) or have '{}' read the value a kept field carries from the last step",
                    a.name(),
                    b.name(),
                    a.name(),
                    a.name()
                )));
            }
            if j > i
                && let Some(f) = a.writes().iter().find(|f| b.writes().contains(f))
            {
                return Err(TaskError::msg(format!(
                    "async mode: stages '{}' and '{}' both write ctx field '{f}' in the same step",
                    a.name(),
                    b.name()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{OnlineRLContext, Shared, Stage, Task, TaskError, TaskHandle};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Adds 1 to one counter field and records how many stages overlap. It first waits
    /// (up to 20 s) until `together` stages have been running at once: stages that really
    /// run concurrently all get there however slowly their threads start, and serial ones
    /// (`together` = 1) do not wait.
    struct Count {
        field: &'static str,
        reads: Vec<&'static str>,
        active: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
        together: usize,
    }

    impl Stage<OnlineRLContext> for Count {
        fn name(&self) -> String {
            format!("count-{}", self.field)
        }
        fn reads(&self) -> &[&'static str] {
            &self.reads
        }
        fn writes(&self) -> &[&'static str] {
            std::slice::from_ref(&self.field)
        }
        fn run(
            &mut self,
            ctx: &Shared<'_, OnlineRLContext>,
            _: &TaskHandle,
        ) -> Result<(), TaskError> {
            let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            for r in &self.reads {
                ctx.read(r, |c| c.env_step)?;
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.most.load(Ordering::SeqCst) < self.together && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            ctx.write(self.field, |c| match self.field {
                "env_step" => c.env_step += 1,
                "train_iter" => c.train_iter += 1,
                _ => c.env_episode += 1,
            })?;
            self.active.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn task(
        async_mode: bool,
        learner_reads: &[&'static str],
    ) -> (Task<'static, OnlineRLContext>, Arc<AtomicUsize>) {
        let (active, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut t = Task::<OnlineRLContext>::new();
        for (field, reads) in [
            ("env_step", vec![]),
            ("train_iter", learner_reads.to_vec()),
            ("env_episode", vec![]),
        ] {
            t.use_stage(Count {
                field,
                reads,
                active: active.clone(),
                most: most.clone(),
                together: if async_mode { 3 } else { 1 },
            });
        }
        t.async_mode(async_mode);
        (t, most)
    }

    #[test]
    fn async_mode_equals_serial_for_independent_stages_and_overlaps_them() {
        let (mut serial, most_serial) = task(false, &[]);
        let a = serial.run(Some(3)).unwrap();
        let (mut concurrent, most_async) = task(true, &[]);
        let b = concurrent.run(Some(3)).unwrap();
        assert_eq!((a.env_step, a.train_iter, a.env_episode), (3, 3, 3));
        assert_eq!((b.env_step, b.train_iter, b.env_episode), (3, 3, 3));
        assert_eq!(most_serial.load(Ordering::SeqCst), 1);
        assert_eq!(
            most_async.load(Ordering::SeqCst),
            3,
            "the three stages overlapped"
        );
        assert!(concurrent.handle().match_labels(&["async"]).unwrap());
        assert!(!serial.handle().match_labels(&["async"]).unwrap());
    }

    #[test]
    fn a_read_of_what_an_async_sibling_writes_is_refused_naming_both() {
        let (mut t, _) = task(true, &["env_step"]);
        let e = t.run(Some(1)).unwrap_err().to_string();
        assert!(
            e.contains("'count-train_iter' reads ctx field 'env_step'")
                && e.contains("sibling 'count-env_step' writes"),
            "{e}"
        );
        // Serially the same pipeline is fine: the collector runs first.
        let (mut t, _) = task(false, &["env_step"]);
        assert_eq!(t.run(Some(2)).unwrap().train_iter, 2);
    }

    #[test]
    fn undeclared_fields_are_errors_naming_the_stage() {
        struct Sneaky;
        impl Stage<OnlineRLContext> for Sneaky {
            fn name(&self) -> String {
                "sneaky".into()
            }
            fn reads(&self) -> &[&'static str] {
                &[]
            }
            fn writes(&self) -> &[&'static str] {
                &[]
            }
            fn run(
                &mut self,
                ctx: &Shared<'_, OnlineRLContext>,
                _: &TaskHandle,
            ) -> Result<(), TaskError> {
                ctx.read("train_iter", |c| c.train_iter).map(drop)
            }
        }
        let mut t = Task::<OnlineRLContext>::new();
        t.use_stage(Sneaky).async_mode(true);
        let e = t.run(Some(1)).unwrap_err().to_string();
        assert!(
            e.contains("stage 'sneaky' reads ctx field 'train_iter' without declaring it"),
            "{e}"
        );
    }
}
