//! [`Mailbox`]: the events of one name, queued as they arrive, for a middleware that consumes
//! them at its own pace (a learner taking every trajectory, an evaluator the newest model).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use crate::error::TaskError;
use crate::events::{Event, EventBus, HandlerId};
use crate::handle::TaskHandle;

type Queue = Arc<(Mutex<VecDeque<Event>>, Condvar)>;

/// Every `name` event from the moment the mailbox is made, decoded as `T` when taken out.
/// Unlike [`EventBus::wait_for`], nothing emitted between two receives is lost.
pub struct Mailbox<T> {
    queue: Queue,
    bus: EventBus,
    name: String,
    id: HandlerId,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Mailbox<T> {
    /// Start queueing `name` events from `bus`.
    pub fn new(bus: &EventBus, name: &str) -> Self {
        let queue: Queue = Arc::default();
        let q = queue.clone();
        let id = bus.on(name, move |e| {
            q.0.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push_back(e.clone());
            q.1.notify_all();
        });
        Self {
            queue,
            bus: bus.clone(),
            name: name.to_string(),
            id,
            _t: PhantomData,
        }
    }

    /// The oldest queued event, if any.
    pub fn try_recv(&self) -> Result<Option<T>, TaskError> {
        let e = self.lock().pop_front();
        e.map(|e| e.decode()).transpose()
    }

    /// The newest queued event, dropping older ones (a model where only the latest matters).
    pub fn latest(&self) -> Result<Option<T>, TaskError> {
        let e = {
            let mut q = self.lock();
            let last = q.pop_back();
            q.clear();
            last
        };
        e.map(|e| e.decode()).transpose()
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Nothing waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait for the oldest event. `Ok(None)` when `task` is finished meanwhile (another
    /// process ended the run); an error when a peer process is lost or after `timeout`.
    pub fn recv(&self, task: &TaskHandle, timeout: Duration) -> Result<Option<T>, TaskError> {
        self.wait(task, timeout, false)
    }

    /// Like [`Self::recv`], but the newest event, dropping older ones.
    pub fn recv_latest(
        &self,
        task: &TaskHandle,
        timeout: Duration,
    ) -> Result<Option<T>, TaskError> {
        self.wait(task, timeout, true)
    }

    fn wait(
        &self,
        task: &TaskHandle,
        timeout: Duration,
        newest: bool,
    ) -> Result<Option<T>, TaskError> {
        let deadline = Instant::now() + timeout;
        let mut q = self.lock();
        loop {
            if !q.is_empty() {
                let e = if newest {
                    let last = q.pop_back();
                    q.clear();
                    last
                } else {
                    q.pop_front()
                };
                drop(q);
                return e.map(|e| e.decode()).transpose();
            }
            if task.finished() {
                return Ok(None);
            }
            if let Some(why) = self.bus.lost() {
                return Err(TaskError::PeerLost {
                    event: self.name.clone(),
                    detail: why,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TaskError::Timeout {
                    event: self.name.clone(),
                    timeout,
                });
            }
            // Woken by an arrival; the short cap re-checks finish and lost peers.
            q = self
                .queue
                .1
                .wait_timeout(q, left.min(Duration::from_millis(5)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Event>> {
        self.queue.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<T> Drop for Mailbox<T> {
    fn drop(&mut self) {
        self.bus.off(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OnlineRLContext, Task};

    #[test]
    fn keeps_every_event_and_latest_drops_older() {
        let task = Task::<OnlineRLContext>::new();
        let h = task.handle().clone();
        let all = Mailbox::<u32>::new(h.events(), "x");
        let newest = Mailbox::<u32>::new(h.events(), "x");
        for i in 0..3u32 {
            h.emit("x", &i).unwrap();
        }
        assert_eq!(all.len(), 3);
        assert_eq!(all.recv(&h, Duration::from_secs(1)).unwrap(), Some(0));
        assert_eq!(all.try_recv().unwrap(), Some(1));
        assert_eq!(newest.latest().unwrap(), Some(2));
        assert!(newest.is_empty());
        let e = newest.recv(&h, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, TaskError::Timeout { .. }), "{e}");
        h.finish();
        assert_eq!(newest.recv(&h, Duration::from_secs(5)).unwrap(), None);
        h.events().fail("node 1 lost".into());
        drop(all);
        h.emit("x", &9u32).unwrap();
        assert_eq!(newest.try_recv().unwrap(), Some(9), "still registered");
    }

    #[test]
    fn a_lost_peer_ends_the_wait() {
        let task = Task::<OnlineRLContext>::new();
        let h = task.handle().clone();
        let m = Mailbox::<u32>::new(h.events(), "model");
        h.events()
            .fail("node 2 closed its link without saying goodbye".into());
        let e = m.recv(&h, Duration::from_secs(5)).unwrap_err().to_string();
        assert!(e.contains("node 2"), "{e}");
    }
}
