//! The typed collectives of a [`ProcessGroup`]: blocking, and async ones returning a
//! [`Work`].

use crate::dtype::{Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::work::Work;

use super::ProcessGroup;

impl ProcessGroup {
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
}
