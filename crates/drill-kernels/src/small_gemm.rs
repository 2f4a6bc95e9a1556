//! Matrix products small enough that packing costs more than it saves: the dense layers of
//! the small MLPs (CartPole's 4-128-128-2 at batch 64 is at most 1 M multiply-adds a product).
//!
//! Written by hand because the `gemm` crate packs both operands and goes through its full
//! dispatch even for a 64x128 by 128x128 product, and its microkernel steps through an unpacked
//! operand with an address computation per broadcast: callgrind put the whole small-MLP DQN update
//! at 3.0 M instructions, 2.0 M of them in `gemm` (`drill bench learner --case dqn-update`).
//! `nano-gemm` (the same author's small-matrix crate) needs column-major operands and tops out
//! at 4 columns a microkernel. Here one tile is `R` rows by `V` SIMD vectors of columns
//! ([`tile_shape`]), read straight from the operands: per depth step `V` loads, `R`
//! broadcasts and `R x V` fused multiply-adds into accumulators held in registers. The SIMD
//! level (AVX-512, AVX2+FMA, or scalar) is `pulp`'s runtime dispatch. The same tile reads a
//! gathered left operand ([`gathered`]: a table of row offsets and one of depth offsets), which
//! is how [`super::implicit`] convolves without a patch matrix.

use pulp::{Simd, WithSimd};

/// Rows and SIMD vectors of columns one tile computes at a SIMD level of `lanes` f32 lanes,
/// for a product of `vectors` vectors of columns.
///
/// AVX-512 (32 registers) takes up to 24 accumulators, shaped by the columns: 6 rows by 4
/// vectors from 4 vectors on, 8 rows by 3, 2 or 1 vectors below: the fastest of the shapes
/// tried for the gathered convolutions (12 accumulators left them no faster than `gemm`;
/// 12 x 2 spills its row pointers; `drill --threads 1 bench learner --case
/// nature-cnn-products`).
///
/// AVX2 has 16 registers, and 4 x 3 needs all of them (12 accumulators, 3 right-operand
/// vectors, a broadcast): the compiler would keep an accumulator on the stack, a store and a
/// reload in every depth step's dependency chain. 6 rows by 2 vectors leaves a register spare. Tiles of at most 3
/// rows take 3 vectors at every level (9 accumulators fit), or 4 on AVX-512.
pub const fn tile_shape(lanes: usize, vectors: usize) -> (usize, usize) {
    if lanes < 16 {
        (6, 2)
    } else if vectors >= 4 {
        (6, 4)
    } else {
        (8, 3)
    }
}

/// Products of at most this many multiply-adds come here (see [`super::gemm::matmul`]).
pub const MAX_MACS: usize = 1 << 20;

/// Products of at most this many rows with a row-major right operand come here too, however
/// large (see `gemm::few_rows`).
pub const FEW_ROWS: usize = 8;

/// What happens to each product cell before it is stored: a bias per column is added, then
/// ReLU (NaN stays NaN). A dense layer's forward pass in the same registers as its product.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// One value per column.
    pub bias: Option<&'a [f32]>,
    /// ReLU after the bias.
    pub relu: bool,
}

impl Epilogue<'_> {
    /// Applied to a row-major buffer with `n` columns (for products made elsewhere).
    pub fn apply(&self, out: &mut [f32], n: usize) {
        if n == 0 {
            return;
        }
        for row in out.chunks_exact_mut(n) {
            if let Some(bias) = self.bias {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
            if self.relu {
                super::relu_in_place(row);
            }
        }
    }
}

/// `c (m x n) = [c +] a (m x k) * b (k x n)`, where `c` and `b` are row-major with row
/// strides `ldc` and `ldb`, and `a` has strides `(ars, acs)`; then `epilogue` (whose bias,
/// if any, must hold `n` values).
///
/// # Safety
/// Every element of the three matrices that the shapes and strides reach must be valid (for
/// writes, in `c`, and reads when `accumulate`), and `c` must not alias `a` or `b`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    (ars, acs): (usize, usize),
    b: *const f32,
    ldb: usize,
    epilogue: Epilogue<'_>,
) {
    let left = Strided { ars, acs };
    // SAFETY: the caller's promise, passed on.
    unsafe {
        dispatch(
            (m, n, k),
            c,
            ldc,
            accumulate,
            a,
            left,
            b,
            ldb,
            epilogue,
            NoPrefetch,
        )
    };
}

/// [`matmul`] that also brings other data toward the cache while it computes: in its first
/// row tile, each depth step `d` of the column tile at `j` prefetches that tile's columns of
/// row `d` of `next` (row stride `stride`): the next block of a right operand that
/// `gemm::few_rows` copies. Prefetches never fault, so `next` may point anywhere (null: no
/// data wanted).
///
/// # Safety
/// As [`matmul`]'s.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_prefetching(
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    (ars, acs): (usize, usize),
    b: *const f32,
    ldb: usize,
    epilogue: Epilogue<'_>,
    (next, stride): (*const f32, usize),
) {
    let (shape, left) = ((m, n, k), Strided { ars, acs });
    if next.is_null() {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            dispatch(
                shape, c, ldc, accumulate, a, left, b, ldb, epilogue, NoPrefetch,
            )
        };
    } else {
        let lines = Lines { at: next, stride };
        // SAFETY: the caller's promise, passed on.
        unsafe { dispatch(shape, c, ldc, accumulate, a, left, b, ldb, epilogue, lines) };
    }
}

/// `c (m x n) = [c +] a (m x k) * b (k x n)` where the left operand is gathered: its element
/// `(i, d)` is `a[rows[i] + offsets[d]]`; `c` and `b` row-major as in [`matmul`]. A
/// convolution without a patch matrix (implicit GEMM): `rows` the output positions' input
/// offsets and `offsets` the kernel taps', or the other way round for the weight gradient.
///
/// # Safety
/// `rows` must hold `m` values and `offsets` `k`; `a[rows[i] + offsets[d]]` must be valid for
/// every `i < m`, `d < k`; otherwise as [`matmul`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gathered(
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    (rows, offsets): (&[usize], &[usize]),
    b: *const f32,
    ldb: usize,
    epilogue: Epilogue<'_>,
) {
    assert!(
        rows.len() >= m && offsets.len() >= k,
        "a gathered operand's tables"
    );
    let left = Gathered {
        rows: rows.as_ptr(),
        offsets: offsets.as_ptr(),
    };
    // SAFETY: the caller's promise, passed on.
    unsafe {
        dispatch(
            (m, n, k),
            c,
            ldc,
            accumulate,
            a,
            left,
            b,
            ldb,
            epilogue,
            NoPrefetch,
        )
    };
}

/// The product of [`matmul`], [`matmul_prefetching`] and [`gathered`], at the machine's SIMD
/// level, once the bias is checked.
///
/// # Safety
/// As the caller's: every element `left` and the shapes reach must be valid.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn dispatch<L: Left, P: Prefetch>(
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    left: L,
    b: *const f32,
    ldb: usize,
    epilogue: Epilogue<'_>,
    prefetch: P,
) {
    if let Some(bias) = epilogue.bias {
        assert_eq!(bias.len(), n, "one bias per column");
    }
    pulp::Arch::new().dispatch(Product {
        m,
        n,
        k,
        c,
        ldc,
        accumulate,
        a,
        left,
        b,
        ldb,
        bias: epilogue.bias.map_or(std::ptr::null(), <[f32]>::as_ptr),
        relu: epilogue.relu,
        prefetch,
    });
}

/// Where the left operand's elements lie: its row `i` starts at [`Left::row`], and depth step
/// `d` is [`Left::offset`] on from there. One [`Product`] per kind, so each compiles its own
/// tile loop: the strided one pays nothing for the gathered one (the CartPole DQN update's
/// instruction count, callgrind).
trait Left: Copy {
    /// The offset of row `i`'s first element from the operand's start.
    ///
    /// # Safety
    /// `i` must be below the product's row count.
    unsafe fn row(&self, i: usize) -> usize;
    /// The offset of depth step `d` from its row's start, given `walked`, the sum of
    /// [`Left::step`] over the steps before it.
    ///
    /// # Safety
    /// `d` must be below the product's depth.
    unsafe fn offset(&self, d: usize, walked: usize) -> usize;
    /// How far one depth step moves in a strided operand (0 where offsets come from a table).
    fn step(&self) -> usize;
}

/// A strided left operand: element `(i, d)` at `i * ars + d * acs`.
#[derive(Clone, Copy)]
struct Strided {
    ars: usize,
    acs: usize,
}

impl Left for Strided {
    #[inline(always)]
    unsafe fn row(&self, i: usize) -> usize {
        i * self.ars
    }

    #[inline(always)]
    unsafe fn offset(&self, _: usize, walked: usize) -> usize {
        walked
    }

    #[inline(always)]
    fn step(&self) -> usize {
        self.acs
    }
}

/// A gathered left operand ([`gathered`]): element `(i, d)` at `rows[i] + offsets[d]`.
#[derive(Clone, Copy)]
struct Gathered {
    rows: *const usize,
    offsets: *const usize,
}

impl Left for Gathered {
    #[inline(always)]
    unsafe fn row(&self, i: usize) -> usize {
        // SAFETY: `gathered` checked that the table holds a value for every row, and `i` is
        // one (the caller's contract).
        unsafe { *self.rows.add(i) }
    }

    #[inline(always)]
    unsafe fn offset(&self, d: usize, _: usize) -> usize {
        // SAFETY: `gathered` checked that the table holds a value for every depth step, and
        // `d` is one (the caller's contract).
        unsafe { *self.offsets.add(d) }
    }

    #[inline(always)]
    fn step(&self) -> usize {
        0
    }
}

/// What a product's first row tile prefetches per depth step ([`matmul_prefetching`]); a
/// type of its own, as [`Left`], so that products without it compile as before.
trait Prefetch: Copy {
    /// Depth step `d` of the column tile at `j`, `width` columns wide.
    fn touch(&self, d: usize, j: usize, width: usize);
}

/// No prefetching.
#[derive(Clone, Copy)]
struct NoPrefetch;

impl Prefetch for NoPrefetch {
    #[inline(always)]
    fn touch(&self, _: usize, _: usize, _: usize) {}
}

/// The same columns of row `d` of another row-major matrix.
#[derive(Clone, Copy)]
struct Lines {
    at: *const f32,
    stride: usize,
}

impl Prefetch for Lines {
    #[inline(always)]
    fn touch(&self, d: usize, j: usize, width: usize) {
        let start = self.at.wrapping_add(d * self.stride + j);
        // Every 64-byte line the columns span: from the first, and the line of the last.
        let lines = (0..width)
            .step_by(16)
            .chain(std::iter::once(width.max(1) - 1));
        for col in lines {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint: it never faults, whatever the address (computed
            // with `wrapping_add`, so no out-of-bounds pointer arithmetic either).
            unsafe {
                use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(col) as *const i8);
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = col;
        }
    }
}

/// One product's operands, for [`WithSimd`].
struct Product<L, P> {
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: *const f32,
    left: L,
    b: *const f32,
    ldb: usize,
    /// `n` values, or null.
    bias: *const f32,
    relu: bool,
    /// What the first row tile prefetches.
    prefetch: P,
}

impl<L: Left, P: Prefetch> WithSimd for Product<L, P> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let lanes = S::F32_LANES;
        let (mr, nv) = tile_shape(lanes, self.n.div_ceil(lanes));
        // Row tiles of even heights: 8 rows (the collector's batch) under a 6-row tile as
        // 4 + 4, not 6 + 2, whose 2-row tile has too few accumulators to hide the FMA
        // latency.
        let tiles = self.m.div_ceil(mr);
        let mut i = 0;
        for t in 0..tiles {
            let rows = self.m / tiles + usize::from(t < self.m % tiles);
            let nv = if rows <= 3 { nv.max(3) } else { nv };
            let mut j = 0;
            while j < self.n {
                let cols = (self.n - j).min(nv * lanes);
                let (vectors, tail) = (cols.div_ceil(lanes), cols % lanes);
                // SAFETY: the tile covers rows i..i+rows and columns j..j+cols, inside the
                // matrices (the caller vouches for them); the last vector is masked to `tail`
                // lanes when the columns do not fill it.
                unsafe {
                    if t == 0 {
                        self.tile_of(simd, rows, i, j, vectors, tail, self.prefetch);
                    } else {
                        self.tile_of(simd, rows, i, j, vectors, tail, NoPrefetch);
                    }
                }
                j += cols;
            }
            i += rows;
        }
    }
}

impl<L: Left, P: Prefetch> Product<L, P> {
    /// The tile of `rows` rows at `(i, j)`, prefetching with `pf`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn tile_of<S: Simd, Q: Prefetch>(
        &self,
        simd: S,
        rows: usize,
        i: usize,
        j: usize,
        vectors: usize,
        tail: usize,
        pf: Q,
    ) {
        // SAFETY: as for `tile`, forwarded from `with_simd`.
        unsafe {
            match rows {
                1 => self.tile_rows::<S, Q, 1>(simd, i, j, vectors, tail, pf),
                2 => self.tile_rows::<S, Q, 2>(simd, i, j, vectors, tail, pf),
                3 => self.tile_rows::<S, Q, 3>(simd, i, j, vectors, tail, pf),
                4 => self.tile_rows::<S, Q, 4>(simd, i, j, vectors, tail, pf),
                5 => self.tile_rows::<S, Q, 5>(simd, i, j, vectors, tail, pf),
                6 => self.tile_rows::<S, Q, 6>(simd, i, j, vectors, tail, pf),
                7 => self.tile_rows::<S, Q, 7>(simd, i, j, vectors, tail, pf),
                _ => self.tile_rows::<S, Q, 8>(simd, i, j, vectors, tail, pf),
            }
        }
    }

    /// The tile of `R` rows at `(i, j)` with `vectors` column vectors, the last one holding
    /// `tail` columns (0: full).
    #[inline(always)]
    unsafe fn tile_rows<S: Simd, Q: Prefetch, const R: usize>(
        &self,
        simd: S,
        i: usize,
        j: usize,
        vectors: usize,
        tail: usize,
        pf: Q,
    ) {
        // SAFETY: as for `tile`, forwarded from `with_simd`.
        unsafe {
            match (vectors, tail == 0) {
                (1, true) => self.tile::<S, Q, R, 1, false>(simd, i, j, tail, pf),
                (1, false) => self.tile::<S, Q, R, 1, true>(simd, i, j, tail, pf),
                (2, true) => self.tile::<S, Q, R, 2, false>(simd, i, j, tail, pf),
                (2, false) => self.tile::<S, Q, R, 2, true>(simd, i, j, tail, pf),
                (3, true) => self.tile::<S, Q, R, 3, false>(simd, i, j, tail, pf),
                (3, false) => self.tile::<S, Q, R, 3, true>(simd, i, j, tail, pf),
                (_, true) => self.tile::<S, Q, R, 4, false>(simd, i, j, tail, pf),
                (_, false) => self.tile::<S, Q, R, 4, true>(simd, i, j, tail, pf),
            }
        }
    }

    /// `c[i..i+R, j..]` over `V` vectors of columns, the last masked to `tail` lanes when
    /// `PARTIAL`. Accumulators stay in registers over the whole depth.
    #[inline(always)]
    unsafe fn tile<S: Simd, Q: Prefetch, const R: usize, const V: usize, const PARTIAL: bool>(
        &self,
        simd: S,
        i: usize,
        j: usize,
        tail: usize,
        pf: Q,
    ) {
        let lanes = S::F32_LANES;
        let mask = simd.mask_between_m32s(0, tail as u32);
        let zero = simd.splat_f32s(0.0);
        let mut acc = [[zero; V]; R];
        // SAFETY: every pointer below stays inside the tile's rows of `a`, columns of `b`
        // and cells of `c` (the caller's contract); masked lanes are neither read nor written.
        unsafe {
            // One pointer per row and one depth offset shared by all rows: offsets from the
            // first row (`r * ars`) cost the CartPole DQN update 92 k more instructions.
            let rows: [*const f32; R] = std::array::from_fn(|r| self.a.add(self.left.row(i + r)));
            let mut walked = 0;
            let mut b = self.b.add(j);
            for d in 0..self.k {
                pf.touch(d, j, V * lanes);
                let depth = self.left.offset(d, walked);
                let mut bv = [zero; V];
                for (v, bv) in bv.iter_mut().enumerate() {
                    let p = b.add(v * lanes);
                    *bv = if PARTIAL && v == V - 1 {
                        simd.mask_load_ptr_f32s(mask, p)
                    } else {
                        (p as *const S::f32s).read_unaligned()
                    };
                }
                for (acc, row) in acc.iter_mut().zip(rows) {
                    let x = simd.splat_f32s(*row.add(depth));
                    for (acc, bv) in acc.iter_mut().zip(bv) {
                        *acc = simd.mul_add_e_f32s(x, bv, *acc);
                    }
                }
                walked += self.left.step();
                b = b.add(self.ldb);
            }
            for (r, acc) in acc.iter().enumerate() {
                let row = self.c.add((i + r) * self.ldc + j);
                for (v, acc) in acc.iter().enumerate() {
                    let p = row.add(v * lanes);
                    let masked = PARTIAL && v == V - 1;
                    let mut y = *acc;
                    if self.accumulate {
                        let old = if masked {
                            simd.mask_load_ptr_f32s(mask, p)
                        } else {
                            (p as *const S::f32s).read_unaligned()
                        };
                        y = simd.add_f32s(y, old);
                    }
                    if !self.bias.is_null() {
                        let p = self.bias.add(j + v * lanes);
                        let bias = if masked {
                            simd.mask_load_ptr_f32s(mask, p)
                        } else {
                            (p as *const S::f32s).read_unaligned()
                        };
                        y = simd.add_f32s(y, bias);
                    }
                    if self.relu {
                        // Not `y <= 0` keeps NaN, as burn's ReLU does.
                        y = simd.select_f32s(simd.less_than_or_equal_f32s(y, zero), zero, y);
                    }
                    if masked {
                        simd.mask_store_ptr_f32s(mask, p, y);
                    } else {
                        (p as *mut S::f32s).write_unaligned(y);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile shape (1-8 rows, 1-4 vectors, full and masked last vectors), strided,
    /// transposed and gathered left operands, accumulation, the bias + ReLU epilogue, and
    /// prefetching, against the definition, at every SIMD level this machine has (AVX-512 and
    /// AVX2 vectors differ in width, so in tiling).
    #[test]
    fn products_of_every_tile_shape_match_the_definition() {
        use pulp::x86::{V3, V4};
        check(pulp::Scalar::new());
        match V3::try_new() {
            Some(simd) => check(simd),
            None => eprintln!("no AVX2+FMA here: that level is untested"),
        }
        match V4::try_new() {
            Some(simd) => check(simd),
            None => eprintln!("no AVX-512 here: that level is untested"),
        }
    }

    fn check<S: Simd>(simd: S) {
        let v = |n: usize, s: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.61 + s).sin()).collect()
        };
        for (m, n, k) in [
            (1, 1, 1),
            (3, 5, 2),
            (4, 8, 7),
            (5, 17, 3),
            (7, 33, 9),
            (8, 40, 6),
            (9, 48, 4),
            (12, 20, 11),
            (13, 50, 16),
            (64, 130, 5),
            (7, 16, 4),
            (8, 20, 3),
            (15, 64, 7),
            (16, 33, 5),
            (23, 70, 3),
            (6, 2, 0),
        ] {
            for (transposed_a, accumulate, fused, gather) in
                (0..16).map(|c| (c & 1 > 0, c & 2 > 0, c & 4 > 0, c & 8 > 0))
            {
                {
                    let a = v(m * k, 0.3);
                    let b = v(k * (n + 3), 0.7);
                    let ldb = n + 3;
                    let ldc = n + 1;
                    let start = v(m * ldc, 1.1);
                    let mut c = start.clone();
                    let (ars, acs) = if transposed_a { (1, m) } else { (k, 1) };
                    // Gathered: the same matrix with its rows and depth steps in another order
                    // (reversed rows, depth steps in a stride-3 order where that is one).
                    let perm = |d: usize| if k % 3 == 0 { d } else { d * 3 % k };
                    let rows: Vec<usize> = (0..m).map(|i| (m - 1 - i) * ars).collect();
                    let offsets: Vec<usize> = (0..k).map(|d| perm(d) * acs).collect();
                    let at = |i: usize, p: usize| {
                        if gather {
                            rows[i] + offsets[p]
                        } else {
                            i * ars + p * acs
                        }
                    };
                    let bias = v(n, 2.3);
                    let strided = Product {
                        m,
                        n,
                        k,
                        c: c.as_mut_ptr(),
                        ldc,
                        accumulate,
                        a: a.as_ptr(),
                        left: Strided { ars, acs },
                        b: b.as_ptr(),
                        ldb,
                        bias: if fused {
                            bias.as_ptr()
                        } else {
                            std::ptr::null()
                        },
                        relu: fused,
                        prefetch: NoPrefetch,
                    };
                    if gather {
                        simd.vectorize(Product {
                            m,
                            n,
                            k,
                            c: strided.c,
                            ldc,
                            accumulate,
                            a: strided.a,
                            left: Gathered {
                                rows: rows.as_ptr(),
                                offsets: offsets.as_ptr(),
                            },
                            b: strided.b,
                            ldb,
                            bias: strided.bias,
                            relu: fused,
                            prefetch: NoPrefetch,
                        });
                    } else {
                        // The same product prefetching (`matmul_prefetching`): the same values,
                        // bit for bit.
                        let mut again = start.clone();
                        simd.vectorize(Product {
                            m,
                            n,
                            k,
                            c: again.as_mut_ptr(),
                            ldc,
                            accumulate,
                            a: strided.a,
                            left: strided.left,
                            b: strided.b,
                            ldb,
                            bias: strided.bias,
                            relu: fused,
                            prefetch: Lines {
                                at: b.as_ptr(),
                                stride: ldb,
                            },
                        });
                        simd.vectorize(strided);
                        assert!(again == c, "{m}x{n}x{k}: prefetching changed the product");
                    }
                    for i in 0..m {
                        for j in 0..ldc {
                            let got = c[i * ldc + j];
                            if j >= n {
                                assert_eq!(got, start[i * ldc + j], "column {j} is outside");
                                continue;
                            }
                            let dot: f32 = (0..k).map(|p| a[at(i, p)] * b[p * ldb + j]).sum();
                            let mut want = if accumulate {
                                start[i * ldc + j] + dot
                            } else {
                                dot
                            };
                            if fused {
                                want = (want + bias[j]).max(0.0);
                            }
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{m}x{n}x{k} (transposed a: {transposed_a}, gathered: \
                                 {gather}, accumulate: {accumulate}, bias and relu: {fused}) \
                                 at ({i}, {j}): {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
