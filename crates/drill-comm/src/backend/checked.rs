//! [`Checked`]: a backend wrapper that makes every collective first agree on what it is
//! (`DRILL_DEBUG_COLLECTIVES=1`; torch's `TORCH_DISTRIBUTED_DEBUG=DETAIL`, c10d's
//! `ProcessGroupWrapper`).
//!
//! Before each collective, every rank all-gathers a fingerprint of its call (the group's call
//! counter, the operation, dtype, byte count, root and reduce op) through the wrapped backend
//! and compares them. Ranks that branched differently — a collective called on some ranks
//! only, or different ones in different orders — fail with [`CommError::Desync`] naming
//! every rank's call, instead of waiting on each other until the timeout (or, on MPI and
//! NCCL, forever). Point-to-point send/recv are not collective and are passed through. The
//! cost is one small all-gather per collective: for debugging, not for production runs.

use super::{Backend, OpCode};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CommError, Result};

/// Bytes of one fingerprint: six little-endian u64.
const FP: usize = 48;

/// What one rank is about to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    seq: u64,
    op: u64,
    dtype: u64,
    bytes: u64,
    root: u64,
    reduce: u64,
}

const NONE: u64 = u64::MAX;

impl Call {
    fn encode(&self) -> [u8; FP] {
        let mut out = [0u8; FP];
        let fields = [
            self.seq,
            self.op,
            self.dtype,
            self.bytes,
            self.root,
            self.reduce,
        ];
        for (chunk, v) in out.chunks_mut(8).zip(fields) {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn decode(b: &[u8]) -> Call {
        let f = |k: usize| u64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap());
        Call {
            seq: f(0),
            op: f(1),
            dtype: f(2),
            bytes: f(3),
            root: f(4),
            reduce: f(5),
        }
    }

    /// `all_reduce(F32, 16 bytes, Sum)`, `broadcast(32 bytes, root 0)`, `barrier()`.
    fn describe(&self) -> String {
        let op = OpCode::from_u8(self.op as u8).map_or("unknown op", OpCode::name);
        let mut args = Vec::new();
        if let Some(d) = DType::ALL.iter().find(|d| **d as u64 == self.dtype) {
            args.push(format!("{d:?}"));
        }
        if self.op != OpCode::Barrier as u64 {
            args.push(format!("{} bytes", self.bytes));
        }
        if self.root != NONE {
            args.push(format!("root {}", self.root));
        }
        if let Some(r) = ReduceOp::ALL.iter().find(|r| **r as u64 == self.reduce) {
            args.push(format!("{r:?}"));
        }
        format!("{op}({})", args.join(", "))
    }
}

/// A backend whose collectives are checked across ranks first (see the module docs).
pub struct Checked {
    inner: Box<dyn Backend>,
    group: String,
    calls: u64,
    all: Vec<u8>,
}

impl Checked {
    /// Check `inner`'s collectives; `group` names the group in errors.
    pub fn new(inner: Box<dyn Backend>, group: &str) -> Self {
        Self {
            inner,
            group: group.to_string(),
            calls: 0,
            all: Vec::new(),
        }
    }

    /// Whether `DRILL_DEBUG_COLLECTIVES` asks for checked collectives.
    pub fn wanted() -> bool {
        std::env::var("DRILL_DEBUG_COLLECTIVES").is_ok_and(|v| !v.is_empty() && v != "0")
    }

    fn check(
        &mut self,
        op: OpCode,
        dtype: Option<DType>,
        bytes: usize,
        root: Option<usize>,
        reduce: Option<ReduceOp>,
    ) -> Result<()> {
        self.calls += 1;
        let mine = Call {
            seq: self.calls,
            op: op as u64,
            dtype: dtype.map_or(NONE, |d| d as u64),
            bytes: bytes as u64,
            root: root.map_or(NONE, |r| r as u64),
            reduce: reduce.map_or(NONE, |r| r as u64),
        };
        self.all.resize(FP * self.inner.size(), 0);
        self.inner.all_gather(&mine.encode(), &mut self.all)?;
        let calls: Vec<Call> = self.all.chunks(FP).map(Call::decode).collect();
        if calls.iter().all(|c| *c == mine) {
            return Ok(());
        }
        let listed: Vec<String> = calls
            .iter()
            .enumerate()
            .map(|(r, c)| format!("rank {r}: {} (call {})", c.describe(), c.seq))
            .collect();
        Err(CommError::Desync {
            group: self.group.clone(),
            call: self.calls,
            calls: listed.join(", "),
        })
    }
}

impl Backend for Checked {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        self.check(OpCode::Broadcast, None, buf.len(), Some(root), None)?;
        self.inner.broadcast(buf, root)
    }
    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.check(OpCode::AllReduce, Some(dtype), buf.len(), None, Some(op))?;
        self.inner.all_reduce(buf, dtype, op)
    }
    fn reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        self.check(OpCode::Reduce, Some(dtype), buf.len(), Some(root), Some(op))?;
        self.inner.reduce(buf, dtype, op, root)
    }
    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.check(OpCode::AllGather, None, send.len(), None, None)?;
        self.inner.all_gather(send, recv)
    }
    fn gather(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.check(OpCode::Gather, None, send.len(), Some(root), None)?;
        self.inner.gather(send, recv, root)
    }
    fn scatter(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.check(OpCode::Scatter, None, recv.len(), Some(root), None)?;
        self.inner.scatter(send, recv, root)
    }
    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.check(
            OpCode::ReduceScatter,
            Some(dtype),
            recv.len(),
            None,
            Some(op),
        )?;
        self.inner.reduce_scatter(send, recv, dtype, op)
    }
    fn barrier(&mut self) -> Result<()> {
        self.check(OpCode::Barrier, None, 0, None, None)?;
        self.inner.barrier()
    }
    fn send(&mut self, buf: &[u8], dst: usize, tag: u32) -> Result<()> {
        self.inner.send(buf, dst, tag)
    }
    fn recv(&mut self, buf: &mut [u8], src: usize, tag: u32) -> Result<()> {
        self.inner.recv(buf, src, tag)
    }
    fn new_group(
        &mut self,
        ranks: &[usize],
        id: u16,
        name: &str,
    ) -> Result<Option<Box<dyn Backend>>> {
        let sub = self.inner.new_group(ranks, id, name)?;
        Ok(sub.map(|b| Box::new(Checked::new(b, name)) as Box<dyn Backend>))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_and_read_well() {
        let c = Call {
            seq: 5,
            op: OpCode::AllReduce as u64,
            dtype: DType::F32 as u64,
            bytes: 16,
            root: NONE,
            reduce: ReduceOp::Sum as u64,
        };
        assert_eq!(Call::decode(&c.encode()), c);
        assert_eq!(c.describe(), "all_reduce(F32, 16 bytes, Sum)");
        let b = Call {
            op: OpCode::Barrier as u64,
            dtype: NONE,
            bytes: 0,
            reduce: NONE,
            ..c
        };
        assert_eq!(b.describe(), "barrier()");
    }
}
