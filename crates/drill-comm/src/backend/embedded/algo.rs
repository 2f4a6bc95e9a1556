//! The collective algorithms of the embedded backend, each written over point-to-point
//! messages on the [`Mesh`]. Small messages take latency-optimal paths (recursive doubling,
//! binomial trees, dissemination); large all_reduce / reduce_scatter / all_gather take the
//! bandwidth-optimal ring, streamed in chunks through the progress engine.

use std::ops::Range;

use super::mesh::{Cx, Mesh, Sink, recv_from, send_to};
use crate::dtype::{DType, ReduceOp, div_bytes, reduce_bytes};
use crate::error::Result;

/// A group's view of the mesh for one operation: its ranks mapped to global ranks.
pub struct View<'a> {
    /// The process's connections.
    pub mesh: &'a mut Mesh,
    /// Global rank of each group rank.
    pub ranks: &'a [usize],
    /// This process's group rank.
    pub rank: usize,
}

impl View<'_> {
    fn n(&self) -> usize {
        self.ranks.len()
    }

    fn g(&self, r: usize) -> usize {
        self.ranks[r]
    }

    /// One exchange: optionally send to a group rank and receive from one, concurrently.
    fn xfer(
        &mut self,
        cx: &Cx,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, Sink)>,
    ) -> Result<()> {
        let mut s = send.map(|(p, b)| send_to(self.g(p), b));
        let mut r = recv.map(|(p, sink)| recv_from(self.g(p), sink));
        self.mesh.run(
            cx,
            s.as_mut().map(std::slice::from_mut).unwrap_or_default(),
            r.as_mut().map(std::slice::from_mut).unwrap_or_default(),
        )
    }
}

/// Byte ranges of `n` blocks over `len` bytes of `esz`-byte elements (sizes differ by at
/// most one element when the count does not divide).
pub fn blocks(len: usize, esz: usize, n: usize) -> Vec<Range<usize>> {
    let c = len / esz;
    (0..n)
        .map(|i| (i * c / n) * esz..((i + 1) * c / n) * esz)
        .collect()
}

/// Borrow block `a` to read and block `b` to write from one buffer (they must not overlap).
fn split<'b>(buf: &'b mut [u8], a: &Range<usize>, b: &Range<usize>) -> (&'b [u8], &'b mut [u8]) {
    if a.is_empty() {
        return (&[], &mut buf[b.clone()]);
    }
    if b.is_empty() {
        return (&buf[a.clone()], &mut []);
    }
    if a.start < b.start {
        let (x, y) = buf.split_at_mut(b.start);
        (&x[a.clone()], &mut y[..b.len()])
    } else {
        let (x, y) = buf.split_at_mut(a.start);
        (&y[..a.len()], &mut x[b.clone()])
    }
}

/// Dissemination barrier: ceil(log2 n) rounds of empty messages.
pub fn barrier(v: &mut View, cx: &Cx) -> Result<()> {
    let (n, r) = (v.n(), v.rank);
    let mut k = 1;
    while k < n {
        v.xfer(
            cx,
            Some(((r + k) % n, &[])),
            Some(((r + n - k) % n, Sink::Copy(&mut []))),
        )?;
        k <<= 1;
    }
    Ok(())
}

/// Binomial-tree broadcast; a node sends to all its children at once.
pub fn broadcast(v: &mut View, cx: &Cx, buf: &mut [u8], root: usize) -> Result<()> {
    let n = v.n();
    let vr = (v.rank + n - root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let src = (vr - mask + root) % n;
            v.xfer(cx, None, Some((src, Sink::Copy(buf))))?;
            break;
        }
        mask <<= 1;
    }
    let mut sends = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            sends.push(send_to(v.g((vr + mask + root) % n), &*buf));
        }
        mask >>= 1;
    }
    v.mesh.run(cx, &mut sends, &mut [])
}

/// All-reduce: recursive doubling up to `small` bytes, ring reduce-scatter + all-gather above.
/// Every rank ends with bit-identical values (reductions are applied in one order per element).
pub fn all_reduce(
    v: &mut View,
    cx: &Cx,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    small: usize,
) -> Result<()> {
    let n = v.n();
    if n > 1 {
        if buf.len() <= small || buf.len() / dtype.size() < n {
            recursive_doubling(v, cx, buf, dtype, op)?;
            if op == ReduceOp::Avg {
                div_bytes(dtype, buf, n);
            }
        } else {
            let bl = blocks(buf.len(), dtype.size(), n);
            let owned = ring_reduce_scatter(v, cx, buf, &bl, 0, dtype, op)?;
            if op == ReduceOp::Avg {
                div_bytes(dtype, &mut buf[bl[owned].clone()], n);
            }
            ring_all_gather(v, cx, buf, &bl, owned)?;
        }
    }
    Ok(())
}

fn recursive_doubling(
    v: &mut View,
    cx: &Cx,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (v.n(), v.rank);
    let pof2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let rem = n - pof2;
    let newrank = if r < 2 * rem {
        if r % 2 == 0 {
            v.xfer(cx, Some((r + 1, &*buf)), None)?;
            None
        } else {
            v.xfer(cx, None, Some((r - 1, Sink::Reduce(buf, dtype, op))))?;
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    if let Some(nr) = newrank {
        let mut scratch = std::mem::take(&mut v.mesh.scratch);
        let words = buf.len().div_ceil(8);
        if scratch.len() < words {
            scratch.resize(words, 0);
        }
        let res = (|| {
            let mut mask = 1;
            while mask < pof2 {
                let nd = nr ^ mask;
                let dst = if nd < rem { nd * 2 + 1 } else { nd + rem };
                let sc =
                    &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..words])[..buf.len()];
                v.xfer(cx, Some((dst, &*buf)), Some((dst, Sink::Copy(sc))))?;
                reduce_bytes(dtype, op, buf, sc);
                mask <<= 1;
            }
            Ok(())
        })();
        v.mesh.scratch = scratch;
        res?;
    }
    if r < 2 * rem {
        if r % 2 == 1 {
            v.xfer(cx, Some((r - 1, &*buf)), None)?;
        } else {
            v.xfer(cx, None, Some((r + 1, Sink::Copy(buf))))?;
        }
    }
    Ok(())
}

/// Ring reduce-scatter over `bl` blocks of `buf`; returns the block this rank holds fully
/// reduced: `(rank + 1 + shift) mod n`.
pub fn ring_reduce_scatter(
    v: &mut View,
    cx: &Cx,
    buf: &mut [u8],
    bl: &[Range<usize>],
    shift: usize,
    dtype: DType,
    op: ReduceOp,
) -> Result<usize> {
    let (n, r) = (v.n(), v.rank);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n - 1 {
        let si = (r + shift + 2 * n - s) % n;
        let ri = (si + n - 1) % n;
        let (sb, rb) = split(buf, &bl[si], &bl[ri]);
        v.xfer(
            cx,
            Some((right, sb)),
            Some((left, Sink::Reduce(rb, dtype, op))),
        )?;
    }
    Ok((r + 1 + shift) % n)
}

/// Ring all-gather over `bl` blocks of `buf`, starting from the block this rank holds.
pub fn ring_all_gather(
    v: &mut View,
    cx: &Cx,
    buf: &mut [u8],
    bl: &[Range<usize>],
    own: usize,
) -> Result<()> {
    let (n, r) = (v.n(), v.rank);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n - 1 {
        let si = (own + n - s) % n;
        let ri = (si + n - 1) % n;
        let (sb, rb) = split(buf, &bl[si], &bl[ri]);
        v.xfer(cx, Some((right, sb)), Some((left, Sink::Copy(rb))))?;
    }
    Ok(())
}

/// Binomial-tree reduce to `root`; other ranks' buffers are left as they were.
pub fn reduce(
    v: &mut View,
    cx: &Cx,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let n = v.n();
    let vr = (v.rank + n - root) % n;
    let mut scratch = std::mem::take(&mut v.mesh.scratch);
    let res = (|| {
        let acc: &mut [u8] = if vr == 0 {
            buf
        } else {
            let words = buf.len().div_ceil(8);
            if scratch.len() < words {
                scratch.resize(words, 0);
            }
            let sc = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..words])[..buf.len()];
            sc.copy_from_slice(buf);
            sc
        };
        let mut mask = 1;
        while mask < n {
            if vr & mask == 0 {
                let src = vr | mask;
                if src < n {
                    v.xfer(
                        cx,
                        None,
                        Some(((src + root) % n, Sink::Reduce(acc, dtype, op))),
                    )?;
                }
            } else {
                v.xfer(cx, Some((((vr & !mask) + root) % n, &*acc)), None)?;
                break;
            }
            mask <<= 1;
        }
        if vr == 0 && op == ReduceOp::Avg {
            div_bytes(dtype, acc, n);
        }
        Ok(())
    })();
    v.mesh.scratch = scratch;
    res
}

/// All-gather: ring (every block travels n-1 hops, each link busy every step).
pub fn all_gather(v: &mut View, cx: &Cx, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (n, r, len) = (v.n(), v.rank, send.len());
    recv[r * len..(r + 1) * len].copy_from_slice(send);
    let bl: Vec<Range<usize>> = (0..n).map(|i| i * len..(i + 1) * len).collect();
    ring_all_gather(v, cx, recv, &bl, r)
}

/// Gather to `root`: the root receives from everyone at once.
pub fn gather(v: &mut View, cx: &Cx, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
    let (n, r, len) = (v.n(), v.rank, send.len());
    if r != root {
        return v.xfer(cx, Some((root, send)), None);
    }
    let mut recvs = Vec::with_capacity(n - 1);
    let mut rest = recv;
    for i in 0..n {
        let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(len);
        rest = tail;
        if i == r {
            chunk.copy_from_slice(send);
        } else {
            recvs.push(recv_from(v.g(i), Sink::Copy(chunk)));
        }
    }
    v.mesh.run(cx, &mut [], &mut recvs)
}

/// Scatter from `root`: the root sends to everyone at once.
pub fn scatter(v: &mut View, cx: &Cx, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
    let (n, r, len) = (v.n(), v.rank, recv.len());
    if r != root {
        return v.xfer(cx, None, Some((root, Sink::Copy(recv))));
    }
    recv.copy_from_slice(&send[r * len..(r + 1) * len]);
    let mut sends: Vec<_> = (0..n)
        .filter(|&i| i != r)
        .map(|i| send_to(v.g(i), &send[i * len..(i + 1) * len]))
        .collect();
    v.mesh.run(cx, &mut sends, &mut [])
}

/// Reduce-scatter with equal blocks: ring on a scratch copy of `send`.
pub fn reduce_scatter(
    v: &mut View,
    cx: &Cx,
    send: &[u8],
    recv: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<()> {
    let (n, len) = (v.n(), recv.len());
    let mut scratch = std::mem::take(&mut v.mesh.scratch);
    let words = send.len().div_ceil(8);
    if scratch.len() < words {
        scratch.resize(words, 0);
    }
    let res = (|| {
        let acc = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch[..words])[..send.len()];
        acc.copy_from_slice(send);
        let bl: Vec<Range<usize>> = (0..n).map(|i| i * len..(i + 1) * len).collect();
        let owned = ring_reduce_scatter(v, cx, acc, &bl, n - 1, dtype, op)?;
        debug_assert_eq!(owned, v.rank);
        recv.copy_from_slice(&acc[bl[owned].clone()]);
        if op == ReduceOp::Avg {
            div_bytes(dtype, recv, n);
        }
        Ok(())
    })();
    v.mesh.scratch = scratch;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_non_divisible_sizes() {
        let b = blocks(7 * 4, 4, 3);
        assert_eq!(b, vec![0..8, 8..16, 16..28]);
        let b = blocks(2 * 8, 8, 4);
        assert_eq!(b.iter().map(|r| r.len()).sum::<usize>(), 16);
        let mut buf = [0u8; 8];
        let (a, b) = split(&mut buf, &(4..8), &(0..4));
        assert_eq!((a.len(), b.len()), (4, 4));
    }
}
