//! Process groups (c10d's ProcessGroup): the group and its shared state here; one file per
//! job beside it: `init.rs` (joining a job), `collectives.rs` (typed, blocking and async),
//! `objects.rs` (any serde type), `subgroup.rs` (`new_group`), `context.rs` ([`DistContext`],
//! the guard that sets it all up and tears it down).

mod collectives;
mod context;
mod init;
mod objects;
mod subgroup;

pub use context::DistContext;
pub use init::InitOptions;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::Backend;
use crate::env::InitInfo;
use crate::error::{CommError, Result};
use crate::store::{Store, StoreServer};
use crate::work::{Executor, Work};

struct World {
    info: InitInfo,
    store: Option<Store>,
    server: Mutex<Option<StoreServer>>,
    next_id: Mutex<u16>,
    exec: Arc<Executor>,
    /// Set once an operation failed because of another rank: no orderly goodbye wait then.
    failed: std::sync::atomic::AtomicBool,
}

impl Drop for World {
    fn drop(&mut self) {
        self.exec.shutdown();
        // The store host keeps serving until every rank has said it is done (bounded wait), so
        // a fast rank 0 does not pull the store from under slower ranks.
        if let Some(store) = &self.store {
            let failed = self.failed.load(std::sync::atomic::Ordering::Acquire);
            let host = !failed && self.server.lock().map(|s| s.is_some()).unwrap_or(false);
            let world = self.info.world_size;
            // After a failure the store may be behind a cut link: say goodbye, but briefly.
            let store = match failed {
                true => store.with_reply_slack(Duration::from_secs(1)),
                false => store.clone(),
            };
            let _ = store.depart("finished", world, host, Duration::from_secs(5));
        }
    }
}

struct Inner {
    backend: Mutex<Box<dyn Backend>>,
    world: Arc<World>,
    name: String,
    rank: usize,
    size: usize,
    global: Vec<usize>,
}

/// A set of ranks that run collectives together. Cheap to clone; the connections close when
/// the last clone (of every group of the process) is dropped.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup({}, rank {}/{}, {})",
            self.inner.name,
            self.inner.rank,
            self.inner.size,
            self.backend_name()
        )
    }
}

impl ProcessGroup {
    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the group.
    pub fn world_size(&self) -> usize {
        self.inner.size
    }

    /// Rank 0 of this group.
    pub fn is_main(&self) -> bool {
        self.inner.rank == 0
    }

    /// Rank among the processes of this node.
    pub fn local_rank(&self) -> usize {
        self.inner.world.info.local_rank
    }

    /// Number of processes on this node.
    pub fn local_world_size(&self) -> usize {
        self.inner.world.info.local_world_size
    }

    /// Index of this node.
    pub fn node_rank(&self) -> usize {
        self.inner.world.info.node_rank
    }

    /// Global rank of each rank of this group.
    pub fn global_ranks(&self) -> &[usize] {
        &self.inner.global
    }

    /// The group's name (`world`, `group1`, ...).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Backend name (tcp, mpi, nccl).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.lock().map(|b| b.name()).unwrap_or("?")
    }

    /// Where the job's coordinates came from, and the rest of them.
    pub fn info(&self) -> &InitInfo {
        &self.inner.world.info
    }

    /// The rendezvous store (absent for single-process and MPI jobs).
    pub fn store(&self) -> Option<&Store> {
        self.inner.world.store.as_ref()
    }

    fn sync<R>(&self, f: impl FnOnce(&mut dyn Backend) -> Result<R>) -> Result<R> {
        let inner = &self.inner;
        let r = inner.world.exec.run_sync(|| {
            let mut b = inner.backend.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut **b)
        });
        if let Err(e) = &r
            && e.peer().is_some()
        {
            inner
                .world
                .failed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        r
    }

    fn spawn<R: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&mut dyn Backend) -> Result<R> + Send + 'static,
    ) -> Work<R> {
        let inner = self.inner.clone();
        self.inner.world.exec.submit(op, move || {
            let mut b = inner.backend.lock().unwrap_or_else(|p| p.into_inner());
            let r = f(&mut **b);
            if let Err(e) = &r
                && e.peer().is_some()
            {
                inner
                    .world
                    .failed
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            r
        })
    }

    fn check_rank(&self, op: &str, what: &str, r: usize) -> Result<()> {
        if r >= self.inner.size {
            return Err(CommError::usage(
                op,
                format!(
                    "{what} {r} is not a rank of group '{}' (size {})",
                    self.inner.name, self.inner.size
                ),
            ));
        }
        Ok(())
    }

    fn check_len(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(CommError::usage(
                op,
                format!("{what} has {got} elements, expected {want}"),
            ));
        }
        Ok(())
    }
}
