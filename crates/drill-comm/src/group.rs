//! Process groups (c10d's ProcessGroup): typed collectives over a backend, object
//! collectives through serde, async variants returning [`Work`], sub-groups, and the
//! [`DistContext`] guard that sets it all up and tears it down.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::auth::Token;
use crate::backend::checked::Checked;
use crate::backend::embedded::{Embedded, EmbeddedOptions};
use crate::backend::{Backend, BackendKind};
use crate::dtype::{Element, ReduceOp};
use crate::env::InitInfo;
use crate::error::{CommError, Result};
use crate::store::{Store, StoreServer};
use crate::work::{Executor, Work};

/// How to start a process group; every field has a default from the environment.
#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    /// Backend (default: `DRILL_BACKEND`, else the embedded TCP/shared-memory one).
    pub backend: Option<BackendKind>,
    /// Timeout of every blocking call (default: `DRILL_TIMEOUT`, else 30 s).
    pub timeout: Option<Duration>,
    /// Shared memory between same-host ranks (default: on unless `DRILL_SHM=0`).
    pub shm: Option<bool>,
    /// Coordinates (default: read from the environment, `env://`).
    pub info: Option<InitInfo>,
}

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

fn env_backend() -> Result<Option<BackendKind>> {
    match std::env::var("DRILL_BACKEND") {
        Ok(v) if !v.is_empty() => BackendKind::parse(&v).map(Some).ok_or_else(|| {
            CommError::Env(format!("DRILL_BACKEND={v:?}: expected tcp, mpi or nccl"))
        }),
        _ => Ok(None),
    }
}

impl ProcessGroup {
    /// Join the job described by the environment (torchrun / drill launch / Slurm / OpenMPI
    /// variables) with default options.
    pub fn from_env() -> Result<ProcessGroup> {
        Self::init(InitOptions::default())
    }

    /// Join a job: rendezvous, connect, return the world group.
    pub fn init(opts: InitOptions) -> Result<ProcessGroup> {
        let kind = match opts.backend {
            Some(k) => k,
            None => env_backend()?.unwrap_or(BackendKind::Tcp),
        };
        let mut info = match opts.info {
            Some(i) => i,
            None if kind == BackendKind::Mpi => InitInfo::single(),
            None => InitInfo::from_env()?,
        };
        if let Some(t) = opts.timeout {
            info.timeout = t;
        }
        let exec = Executor::new();
        let (backend, store, server): (Box<dyn Backend>, _, _) = match kind {
            BackendKind::Mpi => {
                #[cfg(feature = "mpi")]
                {
                    let b = crate::backend::mpi::Mpi::init()?;
                    info.rank = b.rank();
                    info.world_size = b.size();
                    info.local_rank = b.local_rank();
                    info.local_world_size = b.local_size();
                    info.source = "MPI";
                    (Box::new(b), None, None)
                }
                #[cfg(not(feature = "mpi"))]
                return Err(CommError::Backend { backend: "mpi", detail: "drill was built without MPI: rebuild with `--features mpi` (needs libopenmpi-dev and libclang-dev)".into() });
            }
            BackendKind::Tcp if info.world_size == 1 => {
                (Box::new(Embedded::single(info.timeout)?), None, None)
            }
            BackendKind::Tcp | BackendKind::Nccl => {
                let token = Token::new(info.token.as_deref());
                let server = if info.rank == 0 && !info.agent_store {
                    Some(StoreServer::bind(&format!("0.0.0.0:{}", info.master_port), &token).map_err(|e| {
                        CommError::Env(format!("rank 0 cannot host the store on port {}: {e} (another job on MASTER_PORT?)", info.master_port))
                    })?)
                } else {
                    None
                };
                let store =
                    Store::connect(&info.master_addr, info.master_port, &token, info.timeout)?
                        .with_prefix(&format!("drill/{}", info.run_id));
                let backend: Box<dyn Backend> = if kind == BackendKind::Tcp {
                    let shm = opts.shm.unwrap_or_else(|| {
                        std::env::var("DRILL_SHM").map(|v| v != "0").unwrap_or(true)
                    });
                    Box::new(Embedded::connect(
                        info.rank,
                        info.world_size,
                        &store.with_prefix("world"),
                        &token,
                        &EmbeddedOptions {
                            shm,
                            timeout: info.timeout,
                        },
                    )?)
                } else {
                    #[cfg(feature = "nccl")]
                    {
                        let heartbeat = Store::connect(
                            &info.master_addr,
                            info.master_port,
                            &token,
                            info.timeout,
                        )?
                        .with_prefix(&format!("drill/{}", info.run_id));
                        Box::new(crate::backend::nccl::Nccl::connect(
                            info.rank,
                            info.world_size,
                            info.local_rank,
                            &store.with_prefix("world"),
                            heartbeat.with_prefix("world"),
                            info.timeout,
                        )?)
                    }
                    #[cfg(not(feature = "nccl"))]
                    return Err(CommError::Backend {
                        backend: "nccl",
                        detail: "drill was built without NCCL: rebuild with `--features nccl` (CUDA and NCCL are loaded at run time)".into(),
                    });
                };
                (backend, Some(store), server)
            }
        };
        let backend: Box<dyn Backend> = if Checked::wanted() {
            Box::new(Checked::new(backend, "world"))
        } else {
            backend
        };
        let (rank, size) = (backend.rank(), backend.size());
        let pg = ProcessGroup {
            inner: Arc::new(Inner {
                backend: Mutex::new(backend),
                world: Arc::new(World {
                    info,
                    store,
                    server: Mutex::new(server),
                    next_id: Mutex::new(1),
                    exec,
                    failed: Default::default(),
                }),
                name: "world".into(),
                rank,
                size,
                global: (0..size).collect(),
            }),
        };
        if size > 1 {
            pg.barrier()?;
        }
        Ok(pg)
    }

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

    /// Copy `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.check_rank("broadcast", "root", root)?;
        self.sync(|b| b.broadcast(bytemuck::cast_slice_mut(buf), root))
    }

    /// Combine `buf` element-wise across ranks; every rank gets the (bit-identical) result.
    pub fn all_reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.sync(|b| b.all_reduce(bytemuck::cast_slice_mut(buf), T::DTYPE, op))
    }

    /// Combine `buf` across ranks into `root`'s buffer (others' buffers are unchanged).
    pub fn reduce<T: Element>(&self, buf: &mut [T], op: ReduceOp, root: usize) -> Result<()> {
        self.check_rank("reduce", "root", root)?;
        self.sync(|b| b.reduce(bytemuck::cast_slice_mut(buf), T::DTYPE, op, root))
    }

    /// Every rank's `send`, concatenated in rank order into `recv` (`world_size * send.len()`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        Self::check_len(
            "all_gather",
            "recv",
            recv.len(),
            send.len() * self.inner.size,
        )?;
        self.sync(|b| b.all_gather(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv)))
    }

    /// Every rank's `send`, concatenated on `root` (which passes `Some(recv)`).
    pub fn gather<T: Element>(
        &self,
        send: &[T],
        recv: Option<&mut [T]>,
        root: usize,
    ) -> Result<()> {
        self.check_rank("gather", "root", root)?;
        let recv: &mut [T] = match (recv, self.inner.rank == root) {
            (Some(r), true) => {
                Self::check_len("gather", "recv", r.len(), send.len() * self.inner.size)?;
                r
            }
            (None, true) => {
                return Err(CommError::usage(
                    "gather",
                    "the root must pass a receive buffer",
                ));
            }
            (_, false) => &mut [],
        };
        self.sync(|b| {
            b.gather(
                bytemuck::cast_slice(send),
                bytemuck::cast_slice_mut(recv),
                root,
            )
        })
    }

    /// Block `rank` of `root`'s `send` (`world_size * recv.len()`, root only) into `recv`.
    pub fn scatter<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
    ) -> Result<()> {
        self.check_rank("scatter", "root", root)?;
        let send: &[T] = match (send, self.inner.rank == root) {
            (Some(s), true) => {
                Self::check_len("scatter", "send", s.len(), recv.len() * self.inner.size)?;
                s
            }
            (None, true) => {
                return Err(CommError::usage(
                    "scatter",
                    "the root must pass a send buffer",
                ));
            }
            (_, false) => &[],
        };
        self.sync(|b| {
            b.scatter(
                bytemuck::cast_slice(send),
                bytemuck::cast_slice_mut(recv),
                root,
            )
        })
    }

    /// Combine `send` (`world_size * recv.len()`) across ranks; block `rank` lands in `recv`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        Self::check_len(
            "reduce_scatter",
            "send",
            send.len(),
            recv.len() * self.inner.size,
        )?;
        self.sync(|b| {
            b.reduce_scatter(
                bytemuck::cast_slice(send),
                bytemuck::cast_slice_mut(recv),
                T::DTYPE,
                op,
            )
        })
    }

    /// Wait until every rank of the group arrives.
    pub fn barrier(&self) -> Result<()> {
        self.sync(|b| b.barrier())
    }

    /// Send `buf` to `dst` (matched by a `recv` with the same tag).
    pub fn send<T: Element>(&self, buf: &[T], dst: usize, tag: u32) -> Result<()> {
        self.check_rank("send", "destination", dst)?;
        if dst == self.inner.rank {
            return Err(CommError::usage("send", "a rank cannot send to itself"));
        }
        self.sync(|b| b.send(bytemuck::cast_slice(buf), dst, tag))
    }

    /// Receive exactly `buf.len()` elements from `src`.
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize, tag: u32) -> Result<()> {
        self.check_rank("recv", "source", src)?;
        if src == self.inner.rank {
            return Err(CommError::usage(
                "recv",
                "a rank cannot receive from itself",
            ));
        }
        self.sync(|b| b.recv(bytemuck::cast_slice_mut(buf), src, tag))
    }

    /// [`all_reduce`](Self::all_reduce) in the background; `wait()` gives the buffer back.
    pub fn all_reduce_async<T: Element>(&self, mut buf: Vec<T>, op: ReduceOp) -> Work<Vec<T>> {
        self.spawn("all_reduce", move |b| {
            b.all_reduce(bytemuck::cast_slice_mut(&mut buf), T::DTYPE, op)
                .map(|_| buf)
        })
    }

    /// [`broadcast`](Self::broadcast) in the background.
    pub fn broadcast_async<T: Element>(
        &self,
        mut buf: Vec<T>,
        root: usize,
    ) -> Result<Work<Vec<T>>> {
        self.check_rank("broadcast", "root", root)?;
        Ok(self.spawn("broadcast", move |b| {
            b.broadcast(bytemuck::cast_slice_mut(&mut buf), root)
                .map(|_| buf)
        }))
    }

    /// [`all_gather`](Self::all_gather) in the background; `wait()` gives the gathered buffer.
    pub fn all_gather_async<T: Element>(&self, send: Vec<T>) -> Work<Vec<T>> {
        let n = self.inner.size;
        self.spawn("all_gather", move |b| {
            let mut recv = vec![T::zeroed(); send.len() * n];
            b.all_gather(
                bytemuck::cast_slice(&send),
                bytemuck::cast_slice_mut(&mut recv),
            )
            .map(|_| recv)
        })
    }

    /// [`reduce_scatter`](Self::reduce_scatter) in the background; `wait()` gives this rank's block.
    pub fn reduce_scatter_async<T: Element>(
        &self,
        send: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>> {
        let n = self.inner.size;
        if !send.len().is_multiple_of(n) {
            return Err(CommError::usage(
                "reduce_scatter",
                format!(
                    "send has {} elements, not a multiple of the group size {n}",
                    send.len()
                ),
            ));
        }
        Ok(self.spawn("reduce_scatter", move |b| {
            let mut recv = vec![T::zeroed(); send.len() / n];
            b.reduce_scatter(
                bytemuck::cast_slice(&send),
                bytemuck::cast_slice_mut(&mut recv),
                T::DTYPE,
                op,
            )
            .map(|_| recv)
        }))
    }

    /// [`barrier`](Self::barrier) in the background.
    pub fn barrier_async(&self) -> Work<()> {
        self.spawn("barrier", |b| b.barrier())
    }

    fn encode<T: Serialize>(op: &str, obj: &T) -> Result<Vec<u8>> {
        postcard::to_stdvec(obj).map_err(|e| CommError::Object {
            op: op.into(),
            detail: e.to_string(),
        })
    }

    fn decode<T: DeserializeOwned>(op: &str, bytes: &[u8]) -> Result<T> {
        postcard::from_bytes(bytes).map_err(|e| CommError::Object {
            op: op.into(),
            detail: e.to_string(),
        })
    }

    /// Send any serde value from `root` (which passes `Some`) to every rank.
    pub fn broadcast_object<T: Serialize + DeserializeOwned>(
        &self,
        obj: Option<&T>,
        root: usize,
    ) -> Result<T> {
        self.check_rank("broadcast_object", "root", root)?;
        let mut bytes = match (obj, self.inner.rank == root) {
            (Some(o), true) => Self::encode("broadcast_object", o)?,
            (None, true) => {
                return Err(CommError::usage(
                    "broadcast_object",
                    "the root must pass the object",
                ));
            }
            (_, false) => Vec::new(),
        };
        let mut len = [bytes.len() as i64];
        self.broadcast(&mut len, root)?;
        bytes.resize(len[0] as usize, 0);
        self.broadcast(&mut bytes, root)?;
        Self::decode("broadcast_object", &bytes)
    }

    fn gather_bytes(&self, mine: &[u8], root: Option<usize>) -> Result<Option<Vec<Vec<u8>>>> {
        let n = self.inner.size;
        let mut lens = vec![0i64; n];
        self.all_gather(&[mine.len() as i64], &mut lens)?;
        let max = *lens.iter().max().unwrap_or(&0) as usize;
        let mut padded = mine.to_vec();
        padded.resize(max, 0);
        let mut all = vec![0u8; max * n];
        match root {
            None => self.all_gather(&padded, &mut all)?,
            Some(r) => {
                let is_root = self.inner.rank == r;
                self.gather(&padded, is_root.then_some(&mut all[..]), r)?;
                if !is_root {
                    return Ok(None);
                }
            }
        }
        Ok(Some(
            lens.iter()
                .enumerate()
                .map(|(i, &l)| all[i * max..i * max + l as usize].to_vec())
                .collect(),
        ))
    }

    /// Every rank's value, in rank order, on every rank.
    pub fn all_gather_object<T: Serialize + DeserializeOwned>(&self, obj: &T) -> Result<Vec<T>> {
        let mine = Self::encode("all_gather_object", obj)?;
        let all = self.gather_bytes(&mine, None)?.expect("all ranks receive");
        all.iter()
            .map(|b| Self::decode("all_gather_object", b))
            .collect()
    }

    /// Every rank's value on `root` (`Some` there, `None` elsewhere).
    pub fn gather_object<T: Serialize + DeserializeOwned>(
        &self,
        obj: &T,
        root: usize,
    ) -> Result<Option<Vec<T>>> {
        self.check_rank("gather_object", "root", root)?;
        let mine = Self::encode("gather_object", obj)?;
        match self.gather_bytes(&mine, Some(root))? {
            None => Ok(None),
            Some(all) => all
                .iter()
                .map(|b| Self::decode("gather_object", b))
                .collect::<Result<_>>()
                .map(Some),
        }
    }

    /// Value `rank` of `root`'s list (one per rank) to each rank.
    pub fn scatter_object<T: Serialize + DeserializeOwned>(
        &self,
        objs: Option<&[T]>,
        root: usize,
    ) -> Result<T> {
        self.check_rank("scatter_object", "root", root)?;
        let n = self.inner.size;
        let encoded: Vec<Vec<u8>> = match (objs, self.inner.rank == root) {
            (Some(o), true) if o.len() == n => o
                .iter()
                .map(|x| Self::encode("scatter_object", x))
                .collect::<Result<_>>()?,
            (Some(o), true) => {
                return Err(CommError::usage(
                    "scatter_object",
                    format!("{} objects for a group of {n}", o.len()),
                ));
            }
            (None, true) => {
                return Err(CommError::usage(
                    "scatter_object",
                    "the root must pass one object per rank",
                ));
            }
            (_, false) => Vec::new(),
        };
        let lens: Vec<i64> = encoded.iter().map(|e| e.len() as i64).collect();
        let mut my_len = [0i64];
        self.scatter(
            (self.inner.rank == root).then_some(&lens[..]),
            &mut my_len,
            root,
        )?;
        let mut max = [lens.iter().copied().max().unwrap_or(0)];
        self.broadcast(&mut max, root)?;
        let max = max[0] as usize;
        let mut flat = Vec::new();
        if self.inner.rank == root {
            flat.reserve(max * n);
            for e in &encoded {
                flat.extend_from_slice(e);
                flat.resize(flat.len() + max - e.len(), 0);
            }
        }
        let mut mine = vec![0u8; max];
        self.scatter(
            (self.inner.rank == root).then_some(&flat[..]),
            &mut mine,
            root,
        )?;
        Self::decode("scatter_object", &mine[..my_len[0] as usize])
    }

    /// A sub-group of `ranks` (ranks of this group). Every rank of this group must call it, in
    /// the same order as other `new_group` calls; ranks outside get `None`.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != ranks.len() || sorted.is_empty() {
            return Err(CommError::usage(
                "new_group",
                format!("ranks {ranks:?} must be non-empty and distinct"),
            ));
        }
        for &r in &sorted {
            self.check_rank("new_group", "rank", r)?;
        }
        let id = {
            let mut n = self
                .inner
                .world
                .next_id
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let id = *n;
            *n = n.wrapping_add(1);
            id
        };
        let name = format!("group{id}");
        let sub = self.sync(|b| b.new_group(&sorted, id, &name))?;
        Ok(sub.map(|b| ProcessGroup {
            inner: Arc::new(Inner {
                rank: b.rank(),
                size: b.size(),
                backend: Mutex::new(b),
                world: self.inner.world.clone(),
                name,
                global: sorted.iter().map(|&r| self.inner.global[r]).collect(),
            }),
        }))
    }
}

/// DI-engine's DDPContext: initialises the world group on creation and tears it down in
/// order when dropped (goodbye to peers, store kept until every rank is done).
pub struct DistContext {
    group: ProcessGroup,
}

impl DistContext {
    /// Join the job described by the environment.
    pub fn new() -> Result<DistContext> {
        Self::with(InitOptions::default())
    }

    /// Join with explicit options.
    pub fn with(opts: InitOptions) -> Result<DistContext> {
        Ok(DistContext {
            group: ProcessGroup::init(opts)?,
        })
    }

    /// The world group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }
}

impl std::ops::Deref for DistContext {
    type Target = ProcessGroup;
    fn deref(&self) -> &ProcessGroup {
        &self.group
    }
}
