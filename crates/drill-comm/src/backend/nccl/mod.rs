//! NCCL backend (feature `nccl`): collectives between CUDA devices, one device per rank
//! (`LOCAL_RANK` modulo the visible devices). CUDA is driven through cudarc with dynamic
//! loading, NCCL through [`loader`], so the feature builds and runs on machines without CUDA
//! (and fails there with a clear error).
//!
//! - The unique id travels through the Store (rank 0 of each group creates it).
//! - Host buffers are staged through two persistent device buffers that only grow, so
//!   repeated operations allocate nothing.
//! - NCCL has no gather, scatter or barrier: gather/scatter are grouped send/recv, barrier is a
//!   one-element all_reduce. Avg is Sum then a division (as on the other backends, for every
//!   dtype). send/recv carry an 8-byte tag+length header so mismatched pairs are explained.
//! - Never a silent hang: operations are polled, not waited on. A peer whose store heartbeat
//!   ([`crate::store::Heartbeat`]) stalls is declared dead, a
//!   NCCL asynchronous error or the group timeout aborts the communicator, and the error names
//!   the operation, the group and (when known) the rank.

pub mod loader;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::Backend;
use crate::dtype::{DType, ReduceOp, div_bytes};
use crate::error::{CommError, Result};
use crate::store::{Heartbeat, Liveness, Store};
use loader::{
    Api, Comm, IN_PROGRESS, NcclResult, ReduceCall, SUCCESS, UniqueId, data_type, red_op,
};

/// State shared by every group of the process.
struct Shared {
    api: &'static Api,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    store: Store,
    timeout: Duration,
    _heartbeat: Heartbeat,
}

/// One NCCL communicator (the world or a sub-group).
pub struct Nccl {
    shared: Arc<Shared>,
    comm: Comm,
    name: String,
    rank: usize,
    /// Global rank of each member.
    global: Vec<usize>,
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    done: CudaEvent,
    live: Liveness,
    broken: Option<String>,
}

// SAFETY: the communicator and device buffers are used by one thread at a time: drill-comm's executor
// runs one operation at a time per process, and each operation binds the CUDA context first.
unsafe impl Send for Nccl {}

fn backend_err(detail: impl Into<String>) -> CommError {
    CommError::Backend {
        backend: "nccl",
        detail: detail.into(),
    }
}

fn nccl_type(dtype: DType) -> i32 {
    match dtype {
        DType::F32 => data_type::FLOAT32,
        DType::F64 => data_type::FLOAT64,
        DType::F16 => data_type::FLOAT16,
        DType::BF16 => data_type::BFLOAT16,
        DType::I32 => data_type::INT32,
        DType::I64 => data_type::INT64,
        DType::U8 => data_type::UINT8,
    }
}

fn nccl_op(op: ReduceOp) -> i32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => red_op::SUM,
        ReduceOp::Prod => red_op::PROD,
        ReduceOp::Min => red_op::MIN,
        ReduceOp::Max => red_op::MAX,
    }
}

impl Nccl {
    /// Join the world communicator: pick device `local_rank % devices`, exchange the unique id
    /// through `store`, start the heartbeat (on `heartbeat_store`, a connection of its own).
    pub fn connect(
        rank: usize,
        world: usize,
        local_rank: usize,
        store: &Store,
        heartbeat_store: Store,
        timeout: Duration,
    ) -> Result<Nccl> {
        let api = loader::api()?;
        let devices = available_devices()?;
        if devices == 0 {
            return Err(backend_err(
                "no CUDA device is visible (CUDA_VISIBLE_DEVICES?); use DRILL_BACKEND=tcp on CPU",
            ));
        }
        let ordinal = local_rank % devices;
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            backend_err(format!(
                "rank {rank}: cannot open CUDA device {ordinal}: {e:?}"
            ))
        })?;
        let stream = ctx
            .new_stream()
            .map_err(|e| backend_err(format!("cannot create a CUDA stream: {e:?}")))?;
        tracing::debug!(rank, ordinal, nccl = %api.path, version = %api.version(), "NCCL backend");
        let shared = Arc::new(Shared {
            api,
            ctx,
            stream,
            store: store.clone(),
            timeout,
            _heartbeat: Heartbeat::start(heartbeat_store, rank),
        });
        Self::init_comm(shared, "world".into(), rank, (0..world).collect(), "world")
    }

    /// Create a communicator for `global` (this process is `global[rank]`), the id under
    /// `key` in the store.
    fn init_comm(
        shared: Arc<Shared>,
        name: String,
        rank: usize,
        global: Vec<usize>,
        key: &str,
    ) -> Result<Nccl> {
        let api = shared.api;
        let key = format!("nccl/{key}/id");
        let id = if rank == 0 {
            let mut id = UniqueId { internal: [0; 128] };
            // SAFETY: writes the 128-byte id, an exclusively borrowed local.
            let rc = unsafe { (api.get_unique_id)(&mut id) };
            check(api, rc, "ncclGetUniqueId")?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            shared.store.set(&key, &bytes)?;
            id
        } else {
            let bytes = shared.store.get_timeout(&key, shared.timeout)?;
            if bytes.len() != 128 {
                return Err(backend_err(format!(
                    "the NCCL unique id in the store has {} bytes, not 128",
                    bytes.len()
                )));
            }
            let mut id = UniqueId { internal: [0; 128] };
            for (d, &s) in id.internal.iter_mut().zip(&bytes) {
                *d = s as _;
            }
            id
        };
        shared
            .ctx
            .bind_to_thread()
            .map_err(|e| backend_err(format!("bind the CUDA context: {e:?}")))?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the new communicator; every member calls this with the same id.
        let r = unsafe { (api.comm_init_rank)(&mut comm, global.len() as i32, id, rank as i32) };
        check(api, r, "ncclCommInitRank")?;
        let alloc = |n: usize| {
            shared
                .stream
                .alloc_zeros::<u8>(n)
                .map_err(|e| backend_err(format!("cannot allocate {n} bytes on the device: {e:?}")))
        };
        let (a, b) = (alloc(256)?, alloc(256)?);
        let done = shared
            .ctx
            .new_event(None)
            .map_err(|e| backend_err(format!("cannot create a CUDA event: {e:?}")))?;
        let live = Liveness::new(shared.store.clone());
        Ok(Nccl {
            shared,
            comm,
            name,
            rank,
            global,
            a,
            b,
            done,
            live,
            broken: None,
        })
    }

    /// Grow the staging buffers to at least `a` and `b` bytes.
    fn reserve(&mut self, a: usize, b: usize) -> Result<()> {
        let s = &self.shared.stream;
        for (buf, need) in [(&mut self.a, a), (&mut self.b, b)] {
            if buf.len() < need {
                *buf = s.alloc_zeros::<u8>(need.next_power_of_two()).map_err(|e| {
                    backend_err(format!("cannot allocate {need} bytes on the device: {e:?}"))
                })?;
            }
        }
        Ok(())
    }

    fn start(&self, op: &str) -> Result<()> {
        if let Some(why) = &self.broken {
            return Err(backend_err(format!(
                "{op} on group '{}': the communicator was aborted earlier ({why})",
                self.name
            )));
        }
        self.shared
            .ctx
            .bind_to_thread()
            .map_err(|e| backend_err(format!("bind the CUDA context: {e:?}")))
    }

    /// Wait for everything queued on the stream (before any copy back to the host: a copy
    /// into pageable memory would block behind a hung collective), watching for NCCL errors, dead peers and
    /// the timeout; on any of them abort the communicator (so no later call can hang).
    fn finish(&mut self, op: &str) -> Result<()> {
        let sh = self.shared.clone();
        self.done
            .record(&sh.stream)
            .map_err(|e| backend_err(format!("{op}: record a CUDA event: {e:?}")))?;
        let start = Instant::now();
        let mut next_check = start + Duration::from_secs(1);
        let mut spins = 0u32;
        loop {
            match self.done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.abort(op, format!("CUDA error: {e:?}"), None)),
            }
            let mut async_err: NcclResult = SUCCESS;
            // SAFETY: reads the communicator's asynchronous error state.
            unsafe { (sh.api.comm_get_async_error)(self.comm, &mut async_err) };
            if async_err != SUCCESS && async_err != IN_PROGRESS {
                let detail = sh.api.error_string(async_err);
                return Err(self.abort(op, detail, None));
            }
            let now = Instant::now();
            if now >= next_check {
                next_check = now + Duration::from_secs(1);
                let others: Vec<usize> = (self.global.iter().copied())
                    .filter(|&g| g != self.global[self.rank])
                    .collect();
                if let Some((r, why)) = self.live.dead(&others) {
                    return Err(self.abort(op, why, Some(r)));
                }
            }
            if now - start > sh.timeout {
                let err = CommError::Backend {
                    backend: "nccl",
                    detail: format!(
                        "{op} on group '{}' did not complete within {:?} although every rank's heartbeat is alive (a rank is stuck elsewhere or called a different collective); set DRILL_TIMEOUT to wait longer",
                        self.name, sh.timeout
                    ),
                };
                self.abort(op, "timeout".into(), None);
                return Err(err);
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else if spins < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Abort the communicator and describe why.
    fn abort(&mut self, op: &str, detail: String, rank: Option<usize>) -> CommError {
        if self.broken.is_none() {
            // SAFETY: aborting a live communicator; it is never used again (see `start`).
            unsafe { (self.shared.api.comm_abort)(self.comm) };
            self.broken = Some(detail.clone());
        }
        match rank {
            Some(rank) => CommError::PeerLost {
                op: op.into(),
                group: self.name.clone(),
                rank,
                detail,
            },
            None => backend_err(format!("{op} on group '{}': {detail}", self.name)),
        }
    }

    fn check(&self, r: NcclResult, what: &str) -> Result<()> {
        check(self.shared.api, r, what)
    }

    /// all_reduce (in place: `send` is `None`) and reduce_scatter: stage the input in buffer
    /// a, reduce into a (in place) or b, copy the result to `out` once done, divide for Avg.
    fn reduce_staged(
        &mut self,
        name: &'static str,
        (call, call_name): (ReduceCall, &'static str),
        send: Option<&[u8]>,
        out: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.start(name)?;
        if out.is_empty() {
            return Ok(());
        }
        let in_place = send.is_none();
        match send {
            Some(send) => {
                self.reserve(send.len(), out.len())?;
                self.upload(send, false, 0)?;
            }
            None => {
                self.reserve(out.len(), 0)?;
                self.upload(out, false, 0)?;
            }
        }
        let (a, b) = self.ptrs();
        let dst = if in_place { a } else { b };
        let n = out.len() / dtype.size();
        // SAFETY: reduces staging buffer a into `dst` (in place, or b sized by `reserve`),
        // n elements of the result per rank, on this communicator's stream.
        let r = unsafe {
            call(
                a as _,
                dst as _,
                n,
                nccl_type(dtype),
                nccl_op(op),
                self.comm,
                self.stream(),
            )
        };
        self.check(r, call_name)?;
        self.finish(name)?;
        self.download(out, !in_place, 0)?;
        if op == ReduceOp::Avg {
            div_bytes(dtype, out, self.size());
        }
        Ok(())
    }

    fn stream(&self) -> *mut std::ffi::c_void {
        self.shared.stream.cu_stream() as _
    }

    /// Copy `host` to the start of staging buffer `a` (or `b`).
    fn upload(&mut self, host: &[u8], to_b: bool, offset: usize) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let s = self.shared.stream.clone();
        let dst = if to_b { &mut self.b } else { &mut self.a };
        let mut view = dst.slice_mut(offset..offset + host.len());
        s.memcpy_htod(host, &mut view)
            .map_err(|e| backend_err(format!("copy to the device: {e:?}")))
    }

    fn download(&mut self, host: &mut [u8], from_b: bool, offset: usize) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let s = self.shared.stream.clone();
        let src = if from_b { &self.b } else { &self.a };
        let view = src.slice(offset..offset + host.len());
        s.memcpy_dtoh(&view, host)
            .map_err(|e| backend_err(format!("copy from the device: {e:?}")))
    }

    fn ptrs(&mut self) -> (u64, u64) {
        let s = self.shared.stream.clone();
        let (a, _ga) = self.a.device_ptr_mut(&s);
        let (b, _gb) = self.b.device_ptr(&s);
        (a, b)
    }

    /// Gather/scatter's data movement, as grouped send/recv (NCCL has neither): `n` bytes
    /// between block r of staging buffer a on `root` and staging buffer b on rank r, towards
    /// the root when `to_root`.
    fn root_exchange(&mut self, root: usize, n: usize, to_root: bool) -> Result<()> {
        let (a, b) = self.ptrs();
        let (api, comm, stream, me) = (self.shared.api, self.comm, self.stream(), self.rank);
        let size = self.size();
        // Towards the root the root receives and the others send; scatter is the reverse.
        let receive = (me == root) == to_root;
        self.grouped(|| {
            for r in 0..size {
                let (ptr, peer) = match (me == root, r == root) {
                    (true, false) => (a + (r * n) as u64, r),
                    (false, true) => (b, root),
                    _ => continue,
                };
                let res = if receive {
                    // SAFETY: receives n bytes into a staging block sized for them.
                    unsafe { (api.recv)(ptr as _, n, data_type::UINT8, peer as i32, comm, stream) }
                } else {
                    // SAFETY: sends n bytes from a staging block holding them.
                    unsafe { (api.send)(ptr as _, n, data_type::UINT8, peer as i32, comm, stream) }
                };
                check(api, res, if receive { "ncclRecv" } else { "ncclSend" })?;
            }
            Ok(())
        })
    }

    /// Run `f` between ncclGroupStart and ncclGroupEnd.
    fn grouped(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let api = self.shared.api;
        // SAFETY: group calls only batch the enqueued operations.
        self.check(unsafe { (api.group_start)() }, "ncclGroupStart")?;
        let r = f();
        // SAFETY: as above; always closed so NCCL's group depth stays balanced.
        let end = self.check(unsafe { (api.group_end)() }, "ncclGroupEnd");
        r.and(end)
    }
}

/// How many CUDA devices NCCL can use here; an error saying what is missing (driver, libnccl)
/// on machines without them.
pub fn available_devices() -> Result<usize> {
    loader::api()?;
    let n = CudaContext::device_count()
        .map_err(|e| backend_err(format!("cannot count CUDA devices: {e:?}")))?;
    Ok(n.max(0) as usize)
}

fn check(api: &Api, r: NcclResult, what: &str) -> Result<()> {
    if r == SUCCESS {
        Ok(())
    } else {
        Err(backend_err(format!("{what}: {}", api.error_string(r))))
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.broken.is_none() && self.shared.ctx.bind_to_thread().is_ok() {
            // SAFETY: the communicator is idle (every operation waited for completion).
            unsafe { (self.shared.api.comm_destroy)(self.comm) };
        }
    }
}

impl Backend for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.global.len()
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        self.start("broadcast")?;
        if buf.is_empty() {
            return Ok(());
        }
        self.reserve(buf.len(), 0)?;
        if self.rank == root {
            self.upload(buf, false, 0)?;
        }
        let (a, _) = self.ptrs();
        let api = self.shared.api;
        // SAFETY: in-place broadcast of `buf.len()` bytes in staging buffer a.
        let r = unsafe {
            (api.broadcast)(
                a as _,
                a as _,
                buf.len(),
                data_type::UINT8,
                root as i32,
                self.comm,
                self.stream(),
            )
        };
        self.check(r, "ncclBroadcast")?;
        self.finish("broadcast")?;
        if self.rank != root {
            self.download(buf, false, 0)?;
        }
        Ok(())
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        let call = (self.shared.api.all_reduce, "ncclAllReduce");
        self.reduce_staged("all_reduce", call, None, buf, dtype, op)
    }

    fn reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        self.start("reduce")?;
        if buf.is_empty() {
            return Ok(());
        }
        self.reserve(buf.len(), 0)?;
        self.upload(buf, false, 0)?;
        let (a, _) = self.ptrs();
        let api = self.shared.api;
        let n = buf.len() / dtype.size();
        // SAFETY: in-place reduce of n elements in staging buffer a.
        let r = unsafe {
            (api.reduce)(
                a as _,
                a as _,
                n,
                nccl_type(dtype),
                nccl_op(op),
                root as i32,
                self.comm,
                self.stream(),
            )
        };
        self.check(r, "ncclReduce")?;
        self.finish("reduce")?;
        if self.rank == root {
            self.download(buf, false, 0)?;
        }
        if op == ReduceOp::Avg && self.rank == root {
            div_bytes(dtype, buf, self.size());
        }
        Ok(())
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.start("all_gather")?;
        if send.is_empty() {
            return Ok(());
        }
        let n = send.len();
        self.reserve(recv.len(), 0)?;
        self.upload(send, false, self.rank * n)?;
        let (a, _) = self.ptrs();
        let api = self.shared.api;
        let mine = a + (self.rank * n) as u64;
        // SAFETY: in-place all_gather (send block at rank * n of the receive buffer).
        let r = unsafe {
            (api.all_gather)(
                mine as _,
                a as _,
                n,
                data_type::UINT8,
                self.comm,
                self.stream(),
            )
        };
        self.check(r, "ncclAllGather")?;
        self.finish("all_gather")?;
        self.download(recv, false, 0)
    }

    fn gather(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.start("gather")?;
        let n = send.len();
        if n == 0 {
            return Ok(());
        }
        let size = self.size();
        self.reserve(if self.rank == root { n * size } else { 0 }, n)?;
        if self.rank != root {
            self.upload(send, true, 0)?;
        }
        self.root_exchange(root, n, true)?;
        self.finish("gather")?;
        if self.rank == root {
            recv[root * n..(root + 1) * n].copy_from_slice(send);
            for r in (0..size).filter(|&r| r != root) {
                let block = &mut recv[r * n..(r + 1) * n];
                self.download(block, false, r * n)?;
            }
        }
        Ok(())
    }

    fn scatter(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.start("scatter")?;
        let n = recv.len();
        if n == 0 {
            return Ok(());
        }
        let size = self.size();
        self.reserve(if self.rank == root { n * size } else { 0 }, n)?;
        if self.rank == root {
            self.upload(send, false, 0)?;
        }
        self.root_exchange(root, n, false)?;
        self.finish("scatter")?;
        if self.rank == root {
            recv.copy_from_slice(&send[root * n..(root + 1) * n]);
        } else {
            self.download(recv, true, 0)?;
        }
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let call = (self.shared.api.reduce_scatter, "ncclReduceScatter");
        self.reduce_staged("reduce_scatter", call, Some(send), recv, dtype, op)
    }

    fn barrier(&mut self) -> Result<()> {
        self.start("barrier")?;
        let (a, _) = self.ptrs();
        let api = self.shared.api;
        // SAFETY: a one-byte all_reduce in staging buffer a (at least 256 bytes).
        let r = unsafe {
            (api.all_reduce)(
                a as _,
                a as _,
                1,
                data_type::UINT8,
                red_op::MAX,
                self.comm,
                self.stream(),
            )
        };
        self.check(r, "ncclAllReduce (barrier)")?;
        self.finish("barrier")
    }

    fn send(&mut self, buf: &[u8], dst: usize, tag: u32) -> Result<()> {
        self.start("send")?;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&tag.to_le_bytes());
        head[4..].copy_from_slice(&(buf.len() as u32).to_le_bytes());
        self.reserve(8 + buf.len(), 0)?;
        self.upload(&head, false, 0)?;
        self.upload(buf, false, 8)?;
        let (a, _) = self.ptrs();
        let api = self.shared.api;
        // SAFETY: sends header + payload from staging buffer a.
        let r = unsafe {
            (api.send)(
                a as _,
                8 + buf.len(),
                data_type::UINT8,
                dst as i32,
                self.comm,
                self.stream(),
            )
        };
        self.check(r, "ncclSend")?;
        self.finish("send")
    }

    fn recv(&mut self, buf: &mut [u8], src: usize, tag: u32) -> Result<()> {
        self.start("recv")?;
        self.reserve(8 + buf.len(), 0)?;
        let (a, _) = self.ptrs();
        let api = self.shared.api;
        // SAFETY: receives header + payload into staging buffer a.
        let r = unsafe {
            (api.recv)(
                a as _,
                8 + buf.len(),
                data_type::UINT8,
                src as i32,
                self.comm,
                self.stream(),
            )
        };
        self.check(r, "ncclRecv")?;
        self.finish("recv")?;
        let mut head = [0u8; 8];
        self.download(&mut head, false, 0)?;
        self.download(buf, false, 8)?;
        let got_tag = u32::from_le_bytes(head[..4].try_into().unwrap_or_default());
        let got_len = u32::from_le_bytes(head[4..].try_into().unwrap_or_default()) as usize;
        if got_tag != tag || got_len != buf.len() {
            return Err(CommError::Protocol {
                op: "recv".into(),
                group: self.name.clone(),
                rank: self.global[src],
                detail: format!(
                    "expected tag {tag} with {} bytes, the sender sent tag {got_tag} with {got_len} bytes",
                    buf.len()
                ),
            });
        }
        Ok(())
    }

    fn new_group(
        &mut self,
        ranks: &[usize],
        id: u16,
        name: &str,
    ) -> Result<Option<Box<dyn Backend>>> {
        let Some(sub_rank) = ranks.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        self.start("new_group")?;
        let global = ranks.iter().map(|&r| self.global[r]).collect();
        let g = Nccl::init_comm(
            self.shared.clone(),
            name.into(),
            sub_rank,
            global,
            &format!("g{id}"),
        )?;
        Ok(Some(Box::new(g)))
    }
}
