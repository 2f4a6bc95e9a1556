//! [`TaskHandle`]: what a middleware can reach (finish, step, events, labels, barrier).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Serialize;

use crate::error::TaskError;
use crate::events::{Event, EventBus, HandlerId};
use crate::labels::Labels;

/// What middlewares reach: the finish flag, events and labels. Cheap to clone.
#[derive(Clone)]
pub struct TaskHandle {
    pub(crate) finish: Arc<AtomicBool>,
    pub(crate) step: Arc<AtomicU64>,
    pub(crate) events: EventBus,
    pub(crate) labels: Arc<RwLock<Labels>>,
    pub(crate) barrier: Arc<RwLock<Option<BarrierFn>>>,
}

pub(crate) type BarrierFn = Arc<dyn Fn() -> Result<(), TaskError> + Send + Sync>;

impl TaskHandle {
    /// End the task after the current step (DI-engine's `task.finish = True`).
    pub fn finish(&self) {
        self.finish.store(true, Ordering::SeqCst);
    }

    /// Whether [`Self::finish`] was called.
    pub fn finished(&self) -> bool {
        self.finish.load(Ordering::SeqCst)
    }

    /// The current step (0-based).
    pub fn step(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }

    /// The event bus.
    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// Emit an event (see [`EventBus::emit`]).
    pub fn emit<T: Serialize + ?Sized>(&self, name: &str, payload: &T) -> Result<(), TaskError> {
        self.events.emit(name, payload)
    }

    /// Handle every later `name` event.
    pub fn on(&self, name: &str, f: impl Fn(&Event) + Send + Sync + 'static) -> HandlerId {
        self.events.on(name, f)
    }

    /// Handle the next `name` event.
    pub fn once(&self, name: &str, f: impl Fn(&Event) + Send + Sync + 'static) -> HandlerId {
        self.events.once(name, f)
    }

    /// Remove a handler.
    pub fn off(&self, id: HandlerId) -> bool {
        self.events.off(id)
    }

    /// Wait for the next `name` event.
    pub fn wait_for(&self, name: &str, timeout: Duration) -> Result<Event, TaskError> {
        self.events.wait_for(name, timeout)
    }

    /// Wait until every process of a Parallel run calls this (no-op when standalone): e.g.
    /// after registering handlers, so no process emits before the others listen.
    pub fn barrier(&self) -> Result<(), TaskError> {
        let f = self
            .barrier
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match f {
            Some(f) => f(),
            None => Ok(()),
        }
    }

    /// Install the cross-process barrier (the Parallel runner does).
    pub fn set_barrier(&self, f: impl Fn() -> Result<(), TaskError> + Send + Sync + 'static) {
        *self.barrier.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(f));
    }

    /// This process's labels.
    pub fn labels(&self) -> Labels {
        self.labels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Give this process another label (e.g. a role it takes).
    pub fn insert_label(&self, label: impl Into<String>) {
        self.labels
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(label.into());
    }

    /// Whether every glob pattern matches one of this process's labels (a malformed pattern
    /// is an error naming it).
    pub fn match_labels<S: AsRef<str>>(&self, patterns: &[S]) -> Result<bool, TaskError> {
        self.labels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .matches(patterns)
            .map_err(TaskError::Msg)
    }
}
