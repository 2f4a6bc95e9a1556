//! Asynchronous operations: a persistent worker thread per process runs queued collectives in
//! the order they were issued; a [`Work`] handle waits for one.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{CommError, Result};

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    running: bool,
    started: bool,
    shutdown: bool,
}

/// Orders every operation of a process (sync and async, all groups): an operation starts only
/// after every earlier one finished, so all ranks see the same order on every connection.
#[derive(Default)]
pub struct Executor {
    state: Mutex<State>,
    cv: Condvar,
}

impl Executor {
    /// A new executor (its worker thread starts with the first async operation).
    pub fn new() -> Arc<Executor> {
        Arc::new(Executor::default())
    }

    /// Run `f` on the calling thread once everything issued before has finished.
    pub fn run_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.running || !s.queue.is_empty() {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.running = true;
        drop(s);
        struct Done<'a>(&'a Executor);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                let mut s = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
                s.running = false;
                self.0.cv.notify_all();
            }
        }
        let _done = Done(self);
        f()
    }

    /// Queue `f` behind everything issued before; the returned handle yields its result.
    pub fn submit<R: Send + 'static>(
        self: &Arc<Self>,
        op: &'static str,
        f: impl FnOnce() -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let slot = Arc::new((Mutex::new(None::<Result<R>>), Condvar::new()));
        let out = slot.clone();
        let job: Job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .unwrap_or_else(|_| Err(CommError::usage(op, "the operation panicked")));
            *out.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            out.1.notify_all();
        });
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.queue.push_back(job);
        if !s.started {
            s.started = true;
            let me = self.clone();
            std::thread::Builder::new()
                .name("drill-comm-async".into())
                .spawn(move || me.worker())
                .expect("spawn the async collective thread");
        }
        self.cv.notify_all();
        Work { slot, op }
    }

    fn worker(self: Arc<Self>) {
        loop {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let job = loop {
                if s.shutdown {
                    return;
                }
                if !s.running
                    && let Some(j) = s.queue.pop_front()
                {
                    s.running = true;
                    break j;
                }
                s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
            };
            drop(s);
            job();
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            s.running = false;
            self.cv.notify_all();
        }
    }

    /// Stop the worker thread after the queue drains.
    pub fn shutdown(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while s.running || !s.queue.is_empty() {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.shutdown = true;
        self.cv.notify_all();
    }
}

/// A pending asynchronous collective (torch's `Work`); `wait` returns its buffer.
#[must_use = "a Work must be waited on to get the buffer back and see errors"]
pub struct Work<R> {
    slot: Arc<(Mutex<Option<Result<R>>>, Condvar)>,
    op: &'static str,
}

impl<R> Work<R> {
    /// Block until the operation finished; its result (the buffer, for buffer operations).
    pub fn wait(self) -> Result<R> {
        let (m, cv) = &*self.slot;
        let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether it finished (wait will not block).
    pub fn is_completed(&self) -> bool {
        self.slot.0.lock().map(|g| g.is_some()).unwrap_or(true)
    }

    /// The operation's name.
    pub fn op(&self) -> &'static str {
        self.op
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_jobs_run_in_order_before_sync_ones() {
        let ex = Executor::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let works: Vec<_> = (0..5)
            .map(|i| {
                let log = log.clone();
                ex.submit("t", move || {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    log.lock().unwrap().push(i);
                    Ok(i)
                })
            })
            .collect();
        ex.run_sync(|| log.lock().unwrap().push(99));
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3, 4, 99]);
        let r: Vec<i32> = works.into_iter().map(|w| w.wait().unwrap()).collect();
        assert_eq!(r, vec![0, 1, 2, 3, 4]);
        let w = ex.submit::<()>("boom", || panic!("x"));
        assert!(w.wait().is_err());
        ex.shutdown();
    }
}
