//! Backends: the byte-level collective engines behind a [`ProcessGroup`](crate::ProcessGroup)
//! (c10d's Backend). Argument checks happen in the group; a backend gets consistent sizes.

pub mod checked;
pub mod embedded;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;

use crate::dtype::{DType, ReduceOp};
use crate::error::Result;

/// Operation codes (in frame headers and messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpCode {
    /// broadcast
    Broadcast = 1,
    /// all_reduce
    AllReduce = 2,
    /// reduce
    Reduce = 3,
    /// all_gather
    AllGather = 4,
    /// gather
    Gather = 5,
    /// scatter
    Scatter = 6,
    /// reduce_scatter
    ReduceScatter = 7,
    /// barrier
    Barrier = 8,
    /// send / recv
    P2p = 9,
}

impl OpCode {
    /// From the wire.
    pub fn from_u8(b: u8) -> Option<OpCode> {
        use OpCode::*;
        Some(match b {
            1 => Broadcast,
            2 => AllReduce,
            3 => Reduce,
            4 => AllGather,
            5 => Gather,
            6 => Scatter,
            7 => ReduceScatter,
            8 => Barrier,
            9 => P2p,
            _ => return None,
        })
    }

    /// torch's name.
    pub fn name(self) -> &'static str {
        use OpCode::*;
        match self {
            Broadcast => "broadcast",
            AllReduce => "all_reduce",
            Reduce => "reduce",
            AllGather => "all_gather",
            Gather => "gather",
            Scatter => "scatter",
            ReduceScatter => "reduce_scatter",
            Barrier => "barrier",
            P2p => "send/recv",
        }
    }
}

/// Which backend a group runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// drill's own backend (default; nothing to install): shared-memory rings between the
    /// ranks of one host, TCP between hosts (`DRILL_SHM=0`: TCP only). `DRILL_BACKEND=tcp`
    /// (torch users' habit), `embedded`, `gloo` or `shm` select it.
    Embedded,
    /// MPI (feature `mpi`, under mpirun/srun).
    Mpi,
    /// NCCL (feature `nccl`, CUDA devices).
    Nccl,
}

impl BackendKind {
    /// Parse `tcp|embedded|gloo|mpi|nccl`.
    pub fn parse(s: &str) -> Option<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" | "embedded" | "gloo" | "shm" => Some(BackendKind::Embedded),
            "mpi" => Some(BackendKind::Mpi),
            "nccl" => Some(BackendKind::Nccl),
            _ => None,
        }
    }

    /// Whether this drill-comm was built with the backend (MPI and NCCL are cargo features).
    pub fn built(self) -> bool {
        match self {
            BackendKind::Embedded => true,
            BackendKind::Mpi => cfg!(feature = "mpi"),
            BackendKind::Nccl => cfg!(feature = "nccl"),
        }
    }

    /// Name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Embedded => "embedded",
            BackendKind::Mpi => "mpi",
            BackendKind::Nccl => "nccl",
        }
    }
}

/// A collective engine over byte buffers. Ranks are the group's own (0..size).
///
/// Buffers arrive checked: all_gather/gather `recv` is `size * send.len()` (gather: on the
/// root; elsewhere empty), scatter `send` likewise, reduce_scatter `send` is
/// `size * recv.len()`, and lengths are whole `dtype` elements.
pub trait Backend: Send {
    /// Short name: `embedded`, `mpi` or `nccl` (as [`BackendKind::name`]).
    fn name(&self) -> &'static str;
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// Group size.
    fn size(&self) -> usize;
    /// Copy `buf` from `root` to everyone.
    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()>;
    /// Combine `buf` across ranks; everyone gets the result.
    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()>;
    /// Combine `buf` across ranks into `root`'s buffer.
    fn reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()>;
    /// Everyone's `send` concatenated in rank order, on everyone.
    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()>;
    /// Everyone's `send` concatenated on `root`.
    fn gather(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()>;
    /// Block `rank` of `root`'s `send` to each rank.
    fn scatter(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()>;
    /// Combine `send` across ranks and leave block `rank` of the result in `recv`.
    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()>;
    /// Wait until every rank arrives.
    fn barrier(&mut self) -> Result<()>;
    /// Send `buf` to `dst` with `tag`.
    fn send(&mut self, buf: &[u8], dst: usize, tag: u32) -> Result<()>;
    /// Receive exactly `buf.len()` bytes from `src` with `tag`.
    fn recv(&mut self, buf: &mut [u8], src: usize, tag: u32) -> Result<()>;
    /// A backend for the sub-group `ranks` (this group's ranks, sorted, unique). Every rank of
    /// this group calls it; non-members get `None`.
    fn new_group(
        &mut self,
        ranks: &[usize],
        id: u16,
        name: &str,
    ) -> Result<Option<Box<dyn Backend>>>;
}
