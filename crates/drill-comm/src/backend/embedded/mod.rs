//! The embedded backend (the default; nothing to install): shared-memory rings between ranks
//! on one host, TCP between hosts, a full mesh of authenticated control connections as the
//! failure detector, and size-dependent algorithms (`algo.rs`).

pub(crate) mod algo;
mod connect;
pub(crate) mod frame;
pub(crate) mod health;
pub(crate) mod link;
pub(crate) mod mesh;
pub(crate) mod shm;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use self::algo::View;
use self::mesh::{Cx, Mesh, Sink, recv_from, send_to};
use super::{Backend, OpCode};
use crate::auth::Token;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::store::Store;

/// all_reduce sizes up to this many bytes use recursive doubling; larger ones the ring.
pub const SMALL_ALL_REDUCE: usize = 64 << 10;

/// How the embedded backend connects.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// Use shared memory between ranks of one host (`DRILL_SHM=0` turns it off).
    pub shm: bool,
    /// Longest wait without progress.
    pub timeout: Duration,
    /// Silence after which a peer counts as unreachable (`health.rs`).
    pub heartbeat: Duration,
}

/// One group on the embedded backend: a view of the process's mesh.
pub struct Embedded {
    mesh: Arc<Mutex<Mesh>>,
    ranks: Vec<usize>,
    rank: usize,
    id: u16,
    name: String,
    seq: u32,
    timeout: Duration,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.goodbye();
    }
}

impl Embedded {
    /// Rendezvous through `store`: publish our address, connect to every other rank
    /// (authenticated), set up shared memory with same-host ranks (all in `connect.rs`), start the
    /// failure detector.
    pub fn connect(
        rank: usize,
        world: usize,
        store: &Store,
        token: &Token,
        opts: &EmbeddedOptions,
    ) -> Result<Embedded> {
        let (peers, places) = connect::peers(rank, world, store, token, opts)?;
        let (shm_ranks, tcp_ranks): (Vec<usize>, Vec<usize>) = (0..world)
            .filter(|&j| j != rank)
            .partition(|&j| peers[j].as_ref().is_some_and(|p| p.link.is_shm()));
        tracing::info!(
            "rank {rank} on {}: shared memory with ranks {shm_ranks:?}, TCP with ranks {tcp_ranks:?}",
            places[rank]
        );
        let mesh = Mesh::new(rank, peers, &places, opts.heartbeat)?;
        store.barrier("connected", rank, world, opts.timeout)?;
        Ok(Embedded {
            mesh: Arc::new(Mutex::new(mesh)),
            ranks: (0..world).collect(),
            rank,
            id: 0,
            name: "world".into(),
            seq: 0,
            timeout: opts.timeout,
        })
    }

    /// A world of one process (no connections).
    pub fn single(timeout: Duration) -> Result<Embedded> {
        Ok(Embedded {
            mesh: Arc::new(Mutex::new(Mesh::new(
                0,
                vec![None],
                &[],
                health::HEARTBEAT_TIMEOUT,
            )?)),
            ranks: vec![0],
            rank: 0,
            id: 0,
            name: "world".into(),
            seq: 0,
            timeout,
        })
    }

    /// How many peers are reached through shared memory (for reports and tests).
    pub fn shm_peers(&self) -> usize {
        let m = self.mesh.lock().unwrap_or_else(|p| p.into_inner());
        m.peers.iter().flatten().filter(|p| p.link.is_shm()).count()
    }

    /// A collective: numbered by the group's own counter.
    fn op<R>(&mut self, op: OpCode, f: impl FnOnce(&mut View, &Cx) -> Result<R>) -> Result<R> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        self.on_mesh(op, seq, f)
    }

    /// Run `f` on the locked mesh for operation `op` numbered `seq` (the tag for send/recv),
    /// failing first if the job is already broken.
    fn on_mesh<R>(
        &self,
        op: OpCode,
        seq: u32,
        f: impl FnOnce(&mut View, &Cx) -> Result<R>,
    ) -> Result<R> {
        let cx = Cx {
            op,
            group: self.id,
            name: &self.name,
            seq,
            timeout: self.timeout,
        };
        let mut m = self.mesh.lock().unwrap_or_else(|p| p.into_inner());
        m.check(&cx)?;
        let mut view = View {
            mesh: &mut m,
            ranks: &self.ranks,
            rank: self.rank,
        };
        f(&mut view, &cx)
    }
}

impl Backend for Embedded {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.ranks.len()
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        self.op(OpCode::Broadcast, |v, cx| algo::broadcast(v, cx, buf, root))
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.op(OpCode::AllReduce, |v, cx| {
            algo::all_reduce(v, cx, buf, dtype, op, SMALL_ALL_REDUCE)
        })
    }

    fn reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        self.op(OpCode::Reduce, |v, cx| {
            algo::reduce(v, cx, buf, dtype, op, root)
        })
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.op(OpCode::AllGather, |v, cx| {
            algo::all_gather(v, cx, send, recv)
        })
    }

    fn gather(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.op(OpCode::Gather, |v, cx| {
            algo::gather(v, cx, send, recv, root)
        })
    }

    fn scatter(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.op(OpCode::Scatter, |v, cx| {
            algo::scatter(v, cx, send, recv, root)
        })
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.op(OpCode::ReduceScatter, |v, cx| {
            algo::reduce_scatter(v, cx, send, recv, dtype, op)
        })
    }

    fn barrier(&mut self) -> Result<()> {
        self.op(OpCode::Barrier, algo::barrier)
    }

    fn send(&mut self, buf: &[u8], dst: usize, tag: u32) -> Result<()> {
        let g = self.ranks[dst];
        self.on_mesh(OpCode::P2p, tag, |v, cx| {
            v.mesh.run(cx, &mut [send_to(g, buf)], &mut [])
        })
    }

    fn recv(&mut self, buf: &mut [u8], src: usize, tag: u32) -> Result<()> {
        let g = self.ranks[src];
        self.on_mesh(OpCode::P2p, tag, |v, cx| {
            v.mesh
                .run(cx, &mut [], &mut [recv_from(g, Sink::Copy(buf))])
        })
    }

    fn new_group(
        &mut self,
        ranks: &[usize],
        id: u16,
        name: &str,
    ) -> Result<Option<Box<dyn Backend>>> {
        // Sub-groups share the process's connections; headers carry the group id, so their
        // messages can never be mistaken for another group's.
        let Some(pos) = ranks.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        Ok(Some(Box::new(Embedded {
            mesh: self.mesh.clone(),
            ranks: ranks.iter().map(|&r| self.ranks[r]).collect(),
            rank: pos,
            id,
            name: name.to_string(),
            seq: 0,
            timeout: self.timeout,
        })))
    }
}
