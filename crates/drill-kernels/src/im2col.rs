//! Convolution kernels through a patch matrix: im2col and one GEMM per batch
//! element or per small group of them (the `gemm` crate, with its AVX-512 kernels enabled), on
//! contiguous NCHW `f32`.
//!
//! Per batch element `b`, with `col[b]` the `K x P` patch matrix (`K = c_in * kh * kw` rows
//! in the weight's `(c, ky, kx)` order, `P = oh * ow` output positions):
//! - forward: `y[b] (c_out x P) = W (c_out x K) * col[b] + bias`;
//! - weight gradient: `dW^T (K x c_out) += col[b] * dy[b]^T`, bias gradient: row sums of `dy`;
//! - input gradient: `dcol = W^T * dy[b]`, scattered back (col2im) into `dx[b]`.
//!
//! Where `P` is small (the 9x9 and 7x7 layers), the forward and input-gradient products take
//! a group of elements at once (`group_size`), their patches side by side (`K x nP`): `gemm`
//! packs the weight once per group, not once per element. Working per element or small group
//! keeps the patches in L2 (`K x P` is 400 KB for the Nature-DQN's first layer) instead of
//! materialising the whole batch's, and splits over threads by element or group when the
//! rayon pool has more than one. No padding, no dilation, one group: what the Atari encoders
//! use. Where the CPU has AVX2 and FMA (with AVX-512 or without), f32 forward passes and
//! weight gradients run in [`super::implicit`] instead (no patch matrix); the input gradient
//! and bf16 stay here, but for bf16 on Intel AMX, whose convolutions run in
//! [`super::amx_conv`] (no patch matrix either) where the layer's shape suits its tiles
//! ([`crate::conv`] chooses).

use super::gemm::{View, matmul};
use super::{bf16, frames};
use rayon::prelude::*;

/// A layer's weight as the left operand of every batch element's product: in bf16 precision
/// packed once per layer call, not once per element.
enum Left<'a> {
    F32(View<'a>),
    Bf16(bf16::Level, bf16::PackedLeft),
}

impl<'a> Left<'a> {
    /// `a (m x k)`, packed when this process computes in bf16.
    fn new(a: View<'a>, m: usize, k: usize) -> Self {
        if bf16::enabled() {
            let level = bf16::Level::current();
            Left::Bf16(level, bf16::PackedLeft::new(level, a, m, k))
        } else {
            Left::F32(a)
        }
    }

    /// `dst (m x n, row-major) = [dst +] self * b (k x n)` on this thread.
    fn times(
        &self,
        (m, n, k): (usize, usize, usize),
        dst: &mut [f32],
        accumulate: bool,
        b: View<'_>,
    ) {
        match self {
            Left::F32(a) => matmul((m, n, k), dst, (n, 1), accumulate, *a, b, false),
            Left::Bf16(level, a) => {
                assert!(dst.len() >= m * n, "conv product destination");
                // SAFETY: dst holds the m x n row-major product and is borrowed mutably.
                unsafe {
                    bf16::gemm_left_packed(*level, dst.as_mut_ptr(), (n, 1), accumulate, a, b, n)
                }
            }
        }
    }
}

/// Shapes of one convolution (no padding, no dilation, one group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Batch size.
    pub batch: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Vertical stride.
    pub sh: usize,
    /// Horizontal stride.
    pub sw: usize,
}

impl Geometry {
    /// Output height.
    pub fn oh(&self) -> usize {
        (self.h - self.kh) / self.sh + 1
    }

    /// Output width.
    pub fn ow(&self) -> usize {
        (self.w - self.kw) / self.sw + 1
    }

    /// Rows of the patch matrix: `c_in * kh * kw`.
    pub fn k(&self) -> usize {
        self.c_in * self.kh * self.kw
    }

    /// Output positions per channel: `oh * ow`.
    pub fn p(&self) -> usize {
        self.oh() * self.ow()
    }

    /// Values of one batch element's input: `c_in * h * w`.
    pub(super) fn in_len(&self) -> usize {
        self.c_in * self.h * self.w
    }

    fn out_len(&self) -> usize {
        self.c_out * self.p()
    }
}

/// A convolution's input batch, contiguous `[batch, c_in, h, w]`: `f32` values, or `u8`
/// frames read as [`frames::value`] (a network's first layer over Atari frames: the
/// minibatch's bytes, a quarter of its floats, are all that is read from memory).
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// Values as they are.
    F32(&'a [f32]),
    /// Frame bytes, each `b / 255`.
    Frames(&'a [u8]),
}

impl<'a> Source<'a> {
    /// Values in the batch.
    pub fn len(&self) -> usize {
        match self {
            Source::F32(x) => x.len(),
            Source::Frames(x) => x.len(),
        }
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Floats [`Source::values`] needs in its buffer for `elements` elements of `in_len`
    /// values: frames are converted there, values need none.
    pub(super) fn buffer_len(&self, elements: usize, in_len: usize) -> usize {
        match self {
            Source::F32(_) => 0,
            Source::Frames(_) => elements * in_len,
        }
    }

    /// Batch elements `elements` (of `in_len` values each) as `f32`: values as they are,
    /// frames converted into `buf` (at least as long; unused for values).
    pub(super) fn values<'s>(
        self,
        elements: std::ops::Range<usize>,
        in_len: usize,
        buf: &'s mut [f32],
    ) -> &'s [f32]
    where
        'a: 's,
    {
        let at = elements.start * in_len..elements.end * in_len;
        match self {
            Source::F32(x) => &x[at],
            Source::Frames(x) => {
                let buf = &mut buf[..at.len()];
                frames::to_f32(&x[at], buf);
                buf
            }
        }
    }

    /// Batch element `b` in the split layout ([`split_columns`]; as it lies when the
    /// horizontal stride is 1): `f32` values at stride 1 as they are, else written into `xs`
    /// (`split_len`), frames converted first into `raw` (`in_len`), both in cache.
    fn element<'s>(self, b: usize, g: &Geometry, xs: &'s mut [f32], raw: &'s mut [f32]) -> &'s [f32]
    where
        'a: 's,
    {
        let values = self.values(b..b + 1, g.in_len(), raw);
        if g.sw == 1 {
            return values;
        }
        split_columns(values, g, xs);
        xs
    }
}

/// Width of one phase of a row split by horizontal stride (see [`split_columns`]).
fn phase_width(g: &Geometry) -> usize {
    g.w.div_ceil(g.sw)
}

/// Length of one batch element's input in the split layout.
fn split_len(g: &Geometry) -> usize {
    g.c_in * g.h * g.sw * phase_width(g)
}

/// Per-worker scratch for groups of `group` batch elements: their patch matrix (`K x group P`,
/// and at least the two rows [`im2col_bf16`] stages), their output (or output gradient)
/// side by side (`c_out x group P`), then one element's split input, then one element's
/// input converted from frames ([`Source::element`]).
fn scratch_len(g: &Geometry, group: usize) -> usize {
    (g.k().max(2) + g.c_out) * g.p() * group + split_len(g) + g.in_len()
}

/// Output positions a grouped product aims at: enough that `gemm` packs the weight once for
/// several batch elements and fills its tiles (groups of 4 to 8 frames ran the Nature CNN's
/// forward and input-gradient products 10-35 % faster than one frame at a time).
const GROUP_COLUMNS: usize = 320;

/// Batch elements per product for this layer: at most [`GROUP_COLUMNS`] output positions,
/// in the fewest rounds of one group per thread of the pool that bound allows, the batch
/// spread evenly over them. The 9x9 layer of the collector's batch of 8 on 2 threads ran in
/// groups of 3, 3 and 2, so one thread did two groups while the other did one; now 4 of 2.
fn group_size(g: &Geometry) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let most = (GROUP_COLUMNS / g.p()).max(1);
    let per_thread = g.batch.div_ceil(threads * most);
    g.batch.div_ceil(threads * per_thread).max(1)
}

/// Rearrange one batch element `x` (`c_in x h x w`) so that every horizontal stride phase of a
/// row is contiguous: `xs[c][y][r][j] = x[c][y][j * sw + r]`. Then the input under one kernel
/// tap across a row of outputs is a contiguous run, and im2col is row copies.
fn split_columns(x: &[f32], g: &Geometry, xs: &mut [f32]) {
    match g.sw {
        2 => split_rows::<2>(x, g, xs),
        3 => split_rows::<3>(x, g, xs),
        4 => split_rows::<4>(x, g, xs),
        _ => split_rows_any(x, g, xs),
    }
}

/// [`split_columns`] for a stride known at compile time (unrolled; the Atari strides), the
/// whole groups of a row through AVX-512 permutes where the CPU has them, else through AVX2
/// shuffles (strides 2 and 4; the scalar loop for the rest of a row, and everywhere else).
fn split_rows<const S: usize>(x: &[f32], g: &Geometry, xs: &mut [f32]) {
    split_rows_at::<S>(x, g, xs, split_level());
}

/// The best deinterleave this CPU has: 2 for AVX-512F, 1 for AVX2, 0 for none.
fn split_level() -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return 2;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return 1;
        }
    }
    0
}

/// [`split_rows`] at SIMD level `level` (at most [`split_level`]'s; the tests run each). The
/// SIMD levels take every row of the element in one call, so that the permutation indices
/// are made once per element, not once per row.
fn split_rows_at<const S: usize>(x: &[f32], g: &Geometry, xs: &mut [f32], level: u8) {
    assert!(level <= split_level(), "SIMD level {level} on this CPU");
    let pw = phase_width(g);
    let full = g.w / S;
    #[cfg(target_arch = "x86_64")]
    let done = match (S == 2 || S == 4).then_some(level) {
        // SAFETY: AVX-512F was detected (the level is at most `split_level`'s).
        Some(2) => unsafe { deinterleave_avx512::<S>(x, xs, g.w, pw, full) },
        // SAFETY: AVX2 was detected (the level is at most `split_level`'s).
        Some(1) => unsafe { deinterleave_avx2::<S>(x, xs, g.w, pw, full) },
        _ => 0,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = level;
        0
    };
    for (row, out) in x.chunks_exact(g.w).zip(xs.chunks_exact_mut(S * pw)) {
        for (j, group) in row.chunks_exact(S).enumerate().take(full).skip(done) {
            for r in 0..S {
                out[r * pw + j] = group[r];
            }
        }
        // A last, partial group when the width is not a multiple of the stride.
        if pw > full {
            for r in 0..S {
                out[r * pw + full] = row.get(full * S + r).copied().unwrap_or(0.0);
            }
        }
    }
}

/// `out[r * pw + j] = row[j * S + r]` for the first `full` groups of every row of `x` (rows
/// `w` long; `out` the row's `S pw` values of `xs`), 8 groups a step (the last step
/// overlapping the one before); returns how many groups of each row it did (the caller does
/// the rest): all of them, or none when `full` is under 8. Stride 2: `vshufps` picks the even
/// and odd values of two registers per 128-bit lane, `vpermpd` puts the lanes' halves in
/// order. Stride 4: a 4x4 transpose per lane (`vunpcklps`/`vunpckhps`, then `vshufps`) and
/// `vpermps` joins the lanes. `S` is 2 or 4.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn deinterleave_avx2<const S: usize>(
    x: &[f32],
    xs: &mut [f32],
    w: usize,
    pw: usize,
    full: usize,
) -> usize {
    use std::arch::x86_64::*;
    assert!(S == 2 || S == 4, "stride {S}");
    assert!(
        w >= full * S && full <= pw,
        "row {w}, phase {pw}, groups {full}"
    );
    if full < 8 {
        return 0;
    }
    let order4 = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (row, out) in x.chunks_exact(w).zip(xs.chunks_exact_mut(S * pw)) {
        let at = row.as_ptr();
        let to = out.as_mut_ptr();
        // Whole steps of 8 groups, then, where `full` is not a multiple of 8, one step over
        // the last 8 groups, overlapping the step before (it stores the same values again).
        let starts = (0..full - 7)
            .step_by(8)
            .chain((!full.is_multiple_of(8)).then_some(full - 8));
        for j in starts {
            // SAFETY: this step's `8 S` values lie inside the `full S <= w` values of `row` (j
            // + 8 is at most `full`), and its stores inside lanes `j..j + 8` of each phase
            // (inside `out`, `S pw` long: phase r's first `full` values start at r pw).
            unsafe {
                let load = |k: usize| _mm256_loadu_ps(at.add(j * S + 8 * k));
                if S == 2 {
                    let (a, b) = (load(0), load(1));
                    let even = _mm256_shuffle_ps::<0x88>(a, b);
                    let odd = _mm256_shuffle_ps::<0xDD>(a, b);
                    let order = |v: __m256| {
                        _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(v)))
                    };
                    _mm256_storeu_ps(to.add(j), order(even));
                    _mm256_storeu_ps(to.add(pw + j), order(odd));
                } else {
                    let (a0, a1, a2, a3) = (load(0), load(1), load(2), load(3));
                    let t0 = _mm256_unpacklo_ps(a0, a1);
                    let t1 = _mm256_unpackhi_ps(a0, a1);
                    let t2 = _mm256_unpacklo_ps(a2, a3);
                    let t3 = _mm256_unpackhi_ps(a2, a3);
                    let phases = [
                        _mm256_shuffle_ps::<0x44>(t0, t2),
                        _mm256_shuffle_ps::<0xEE>(t0, t2),
                        _mm256_shuffle_ps::<0x44>(t1, t3),
                        _mm256_shuffle_ps::<0xEE>(t1, t3),
                    ];
                    // Each phase holds groups 0, 2, 4, 6 in its low lane and 1, 3, 5, 7 in
                    // its high one.
                    for (r, v) in phases.into_iter().enumerate() {
                        _mm256_storeu_ps(to.add(r * pw + j), _mm256_permutevar8x32_ps(v, order4));
                    }
                }
            }
        }
    }
    full
}

/// Lane `i` of phase `r`'s permutation index: value `r + S i` of two registers (32 values);
/// all 16 lanes are used for `S = 2`, the first 8 for `S = 4` (the others pick value 0).
#[cfg(target_arch = "x86_64")]
const fn phase_index<const S: usize>(r: usize) -> [i32; 16] {
    let mut lanes = [0; 16];
    let mut i = 0;
    while i < 16 {
        if S * i + r < 32 {
            lanes[i] = (S * i + r) as i32;
        }
        i += 1;
    }
    lanes
}

/// `out[r * pw + j] = row[j * S + r]` for the first `full` groups of every row of `x` (rows
/// `w` long; `out` the row's `S pw` values of `xs`), 16 groups a step (the last step masked):
/// the step's `16 S` values in `S` registers, each phase gathered by `vpermt2ps` (and, for
/// `S = 4`, two halves joined by `vshuff32x4`); returns `full`. `S` is 2 or 4.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn deinterleave_avx512<const S: usize>(
    x: &[f32],
    xs: &mut [f32],
    w: usize,
    pw: usize,
    full: usize,
) -> usize {
    use std::arch::x86_64::*;
    assert!(S == 2 || S == 4, "stride {S}");
    assert!(
        w >= full * S && full <= pw,
        "row {w}, phase {pw}, groups {full}"
    );
    let idx: [__m512i; S] = std::array::from_fn(|r| {
        let lanes = phase_index::<S>(r);
        // SAFETY: 16 i32 are 64 bytes, what an unaligned 512-bit load reads.
        unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) }
    });
    for (row, out) in x.chunks_exact(w).zip(xs.chunks_exact_mut(S * pw)) {
        let mut j = 0;
        while j < full {
            let n = (full - j).min(16);
            let at = row.as_ptr().wrapping_add(j * S);
            // SAFETY: the masks keep every load inside the `n S` values of these groups
            // (inside `row`: `full S <= w` values) and every store inside lanes `j..j + n` of
            // a phase (inside `out`, `S pw` long: phase r's first `full` values start at r
            // pw). A register past the groups (mask 0) reads nothing; its address is only
            // computed (wrapping), never dereferenced.
            unsafe {
                let mut a = [_mm512_setzero_ps(); S];
                for (k, reg) in a.iter_mut().enumerate() {
                    let mask = super::bf16::lanes((n * S).saturating_sub(16 * k));
                    *reg = _mm512_maskz_loadu_ps(mask, at.wrapping_add(16 * k));
                }
                for (r, idx) in idx.iter().enumerate() {
                    let v = if S == 2 {
                        _mm512_permutex2var_ps(a[0], *idx, a[1])
                    } else {
                        let lo = _mm512_permutex2var_ps(a[0], *idx, a[1]);
                        let hi = _mm512_permutex2var_ps(a[2], *idx, a[3]);
                        _mm512_shuffle_f32x4::<0x44>(lo, hi)
                    };
                    _mm512_mask_storeu_ps(
                        out.as_mut_ptr().add(r * pw + j),
                        super::bf16::lanes(n),
                        v,
                    );
                }
            }
            j += 16;
        }
    }
    full
}

/// [`split_columns`] for any stride.
fn split_rows_any(x: &[f32], g: &Geometry, xs: &mut [f32]) {
    let pw = phase_width(g);
    for (row, out) in x.chunks_exact(g.w).zip(xs.chunks_exact_mut(g.sw * pw)) {
        for (r, phase) in out.chunks_exact_mut(pw).enumerate() {
            let valid = (g.w - r.min(g.w)).div_ceil(g.sw);
            for (j, v) in phase[..valid].iter_mut().enumerate() {
                *v = row[j * g.sw + r];
            }
            phase[valid..].fill(0.0);
        }
    }
}

/// The inverse of [`split_columns`], adding nothing: `x[c][y][j * sw + r] = xs[c][y][r][j]`.
fn merge_columns(xs: &[f32], g: &Geometry, x: &mut [f32]) {
    let pw = phase_width(g);
    for (row, src) in x.chunks_exact_mut(g.w).zip(xs.chunks_exact(g.sw * pw)) {
        for (r, phase) in src.chunks_exact(pw).enumerate() {
            let valid = (g.w - r.min(g.w)).div_ceil(g.sw);
            for (j, v) in phase[..valid].iter().enumerate() {
                row[j * g.sw + r] = *v;
            }
        }
    }
}

/// Visit every (patch row, output row) pair of one batch element: `f(r, oy, at)` where `r`
/// is the patch-matrix row (tap `(c, ky, kx)`) and `at` the start, in the split layout, of
/// the `ow` inputs that tap sees along output row `oy`.
#[inline(always)]
fn for_each_run(g: &Geometry, mut f: impl FnMut(usize, usize, usize)) {
    let pw = phase_width(g);
    // Moving one output row down moves `sh` input rows, each `sw` phases of `pw`.
    let row_step = g.sh * g.sw * pw;
    let mut r = 0;
    for c in 0..g.c_in {
        for ky in 0..g.kh {
            let row_base = (c * g.h + ky) * g.sw * pw;
            for kx in 0..g.kw {
                let mut at = row_base + (kx % g.sw) * pw + kx / g.sw;
                for oy in 0..g.oh() {
                    f(r, oy, at);
                    at += row_step;
                }
                r += 1;
            }
        }
    }
}

/// Where, in the split layout, tap `r` (patch-matrix row `(c, ky, kx)`) sees output row 0's
/// inputs; each further output row is [`row_step`] on.
fn tap_start(g: &Geometry, r: usize) -> usize {
    let pw = phase_width(g);
    let (c, rest) = (r / (g.kh * g.kw), r % (g.kh * g.kw));
    let (ky, kx) = (rest / g.kw, rest % g.kw);
    (c * g.h + ky) * g.sw * pw + (kx % g.sw) * pw + kx / g.sw
}

/// How far one output row moves a tap's inputs in the split layout.
fn row_step(g: &Geometry) -> usize {
    g.sh * g.sw * phase_width(g)
}

/// The patch matrix of one batch element (given in the split layout) written straight into a
/// bf16 right operand (`data`, [`bf16::PackedRight::build`]'s layout `lay`): taps `2p` and
/// `2p + 1` make depth pair `p`, output positions the columns. The two taps' rows are gathered
/// into `stage` (`2 * P` floats, in L1), then converted into that pair's row of every panel in
/// one call; no f32 patch matrix in between.
fn im2col_bf16(
    level: bf16::Level,
    xs: &[f32],
    g: &Geometry,
    stage: &mut [f32],
    data: &mut [u32],
    lay: bf16::Layout,
) {
    let (k, p, ow) = (g.k(), g.p(), g.ow());
    let kp = k.div_ceil(2);
    let step = row_step(g);
    let (lo_row, hi_row) = stage[..2 * p].split_at_mut(p);
    for pair in 0..kp {
        let has_hi = 2 * pair + 1 < k;
        for (tap, row) in [(2 * pair, &mut *lo_row), (2 * pair + 1, &mut *hi_row)] {
            if tap < k {
                let start = tap_start(g, tap);
                for (oy, out) in row.chunks_exact_mut(ow).enumerate() {
                    let at = start + oy * step;
                    copy_short(out, &xs[at..at + ow]);
                }
            }
        }
        let hi = has_hi.then_some(&*hi_row);
        let panels = (lay.w, lay.kpp * lay.w);
        bf16::pairs_across(level, lo_row, hi, &mut data[pair * lay.w..], panels);
    }
}

/// `dst.copy_from_slice(src)` for the short runs of im2col (7 to 20 floats on Atari frames)
/// as fixed-size block moves, the last block overlapping the one before: a `memcpy` call per
/// run (which is what a loop or `copy_from_slice` of a run-time length becomes) cost more
/// than the copy.
#[inline(always)]
fn copy_short(dst: &mut [f32], src: &[f32]) {
    #[inline(always)]
    fn blocks<const B: usize>(dst: &mut [f32], src: &[f32]) {
        let n = dst.len();
        let mut i = 0;
        while i + B < n {
            let block: [f32; B] = src[i..i + B].try_into().expect("B floats");
            dst[i..i + B].copy_from_slice(&block);
            i += B;
        }
        let block: [f32; B] = src[n - B..n].try_into().expect("B floats");
        dst[n - B..n].copy_from_slice(&block);
    }
    assert_eq!(dst.len(), src.len());
    match dst.len() {
        n if n >= 8 => blocks::<8>(dst, src),
        n if n >= 4 => blocks::<4>(dst, src),
        _ => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
    }
}

/// Fill `col` (`K x P`, rows `ld` apart) with the patches of one batch element, given in the
/// split layout.
fn im2col(xs: &[f32], g: &Geometry, col: &mut [f32], ld: usize) {
    let ow = g.ow();
    for_each_run(g, |r, oy, at| {
        let start = r * ld + oy * ow;
        copy_short(&mut col[start..start + ow], &xs[at..at + ow]);
    });
}

/// Add the patch gradients `dcol` (`K x P`, rows `ld` apart) into one batch element's
/// gradient, in the split layout.
fn col2im_add(dcol: &[f32], g: &Geometry, dxs: &mut [f32], ld: usize) {
    let ow = g.ow();
    for_each_run(g, |r, oy, at| {
        let start = r * ld + oy * ow;
        dxs[at..at + ow]
            .iter_mut()
            .zip(&dcol[start..start + ow])
            .for_each(|(d, s)| *d += s);
    });
}

/// `col` (`K x P`, rows `ld` apart) for batch element `b` of `x`, through `stage` (the
/// split layout's scratch, then the converted frames': [`Source::element`]).
fn patches(x: Source<'_>, b: usize, g: &Geometry, stage: &mut [f32], col: &mut [f32], ld: usize) {
    let (xs, raw) = stage.split_at_mut(split_len(g));
    im2col(x.element(b, g, xs, raw), g, col, ld);
}

/// Run `f(b, chunk, scratch)` for every group of `group` batch elements (fewer in the last):
/// `b` its first element, `chunk` their `chunk_len`-long slices of `out`, `scratch` the
/// thread's [`with_scratch`] buffer of `scratch_len`; in parallel when the rayon pool has
/// threads.
pub(super) fn per_group<T: Send>(
    out: &mut [T],
    chunk_len: usize,
    group: usize,
    scratch_len: usize,
    f: impl Fn(usize, &mut [T], &mut [f32]) + Sync + Send,
) {
    let len = chunk_len * group;
    if rayon::current_num_threads() > 1 && out.len() > len {
        out.par_chunks_mut(len)
            .enumerate()
            .for_each(|(i, chunk)| with_scratch(scratch_len, |s| f(i * group, chunk, s)));
    } else {
        with_scratch(scratch_len, |s| {
            for (i, chunk) in out.chunks_mut(len).enumerate() {
                f(i * group, chunk, s);
            }
        });
    }
}

/// [`per_group`] over a new buffer of `n` floats, each group's chunk set to zeros by its own
/// thread just before `f` gets it, in cache: a `memset` of the whole buffer first (13 MB for
/// the first Nature-CNN layer's output at batch 256) would be a pass over memory of its own.
fn per_group_zeroed(
    n: usize,
    chunk_len: usize,
    group: usize,
    scratch_len: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let mut out: Vec<f32> = Vec::with_capacity(n);
    per_group(
        &mut out.spare_capacity_mut()[..n],
        chunk_len,
        group,
        scratch_len,
        |b0, chunk, scratch| {
            chunk.fill(std::mem::MaybeUninit::new(0.0));
            // SAFETY: every value of `chunk` was written on the line above, and
            // `MaybeUninit<f32>` has the layout of `f32`.
            let chunk = unsafe { &mut *(chunk as *mut [std::mem::MaybeUninit<f32>] as *mut [f32]) };
            f(b0, chunk, scratch);
        },
    );
    // SAFETY: `per_group` handed every chunk of the `n` values to the closure, which zeroed
    // it first (as `per_element_from_channels_last` sets its output's length after `per_group`).
    unsafe { out.set_len(n) };
    out
}

/// A new `[batch, channels, positions]` buffer computed one batch element at a time, channels
/// last: `f(b, t, scratch)` fills `t` with element `b` as `positions x channels` (row-major),
/// which is then transposed into the element's place; `scratch` is the rest of the thread's
/// [`with_scratch`] buffer, `scratch_len` floats. Elements split over the rayon pool
/// ([`per_group`]); the buffer is not zeroed first, since the transposition writes all of it
/// (a `memset` of 2.7 MB per forward pass of the Nature CNN's batch of 32 otherwise).
pub(super) fn per_element_from_channels_last(
    batch: usize,
    (channels, positions): (usize, usize),
    scratch_len: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
) -> Vec<f32> {
    let (each, n) = (channels * positions, batch * channels * positions);
    let mut out: Vec<f32> = Vec::with_capacity(n);
    per_group(
        &mut out.spare_capacity_mut()[..n],
        each,
        1,
        each + scratch_len,
        |b, element, scratch| {
            let (t, scratch) = scratch.split_at_mut(each);
            f(b, t, scratch);
            View::transposed(t, channels).write_row_major_uninit(channels, positions, element);
        },
    );
    // SAFETY: `per_group` handed every element's `channels * positions` values to the
    // closure, which wrote all of them (`write_row_major_uninit`).
    unsafe { out.set_len(n) };
    out
}

thread_local! {
    /// This thread's scratch for the kernels, kept from call to call (see [`with_scratch`]).
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Run `f` on `len` floats of this thread's scratch, grown when too short. Its contents are
/// whatever the last user left: every user writes each element before it reads it. A fresh
/// zeroed buffer per call cost the collector's batch-8 forward pass about 6 % of its time in
/// `memset` and page faults. A nested call on the same thread gets a buffer of its own.
pub(super) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH.take();
    if buf.len() < len {
        buf = vec![0f32; len];
    }
    let r = f(&mut buf[..len]);
    SCRATCH.set(buf);
    r
}

/// Forward: `y = conv(x, weight) + bias`, then ReLU when `relu`; `[batch, c_out, oh, ow]`
/// contiguous. In f32, one product per group of batch elements (`group_size`), their
/// patches side by side; in bf16, one per element, its patches written straight into the
/// packed operand.
pub fn forward(x: Source<'_>, weight: &[f32], bias: &[f32], g: &Geometry, relu: bool) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    assert_eq!(x.len(), g.batch * g.in_len(), "conv input size");
    assert_eq!(weight.len(), co * k, "conv weight size");
    assert_eq!(bias.len(), co, "conv bias size");
    let w = Left::new(View::rows(weight, k), co, k);
    let group = match w {
        Left::F32(_) => group_size(g),
        Left::Bf16(..) => 1,
    };
    per_group_zeroed(
        g.batch * g.out_len(),
        g.out_len(),
        group,
        scratch_len(g, group),
        |b0, yg, scratch| {
            let n = yg.len() / g.out_len();
            let (col, rest) = scratch.split_at_mut(k.max(2) * p * group);
            let (out, xs) = rest.split_at_mut(co * p * group);
            if let Left::Bf16(level, packed) = &w {
                for (row, &bv) in yg.chunks_exact_mut(p).zip(bias) {
                    row.fill(bv);
                }
                let (xs, raw) = xs.split_at_mut(split_len(g));
                let xs = x.element(b0, g, xs, raw);
                // SAFETY: yg is this element's c_out x P output, row-major, borrowed mutably.
                unsafe {
                    bf16::gemm_built(
                        *level,
                        yg.as_mut_ptr(),
                        (p, 1),
                        true,
                        packed,
                        p,
                        |data, lay| im2col_bf16(*level, xs, g, col, data, lay),
                    )
                };
            } else {
                // The group's patches side by side (`K x nP`), one product added to the bias in
                // `c_out x nP`, then each element's block moved to its place.
                let np = n * p;
                for e in 0..n {
                    patches(x, b0 + e, g, xs, &mut col[e * p..], np);
                }
                // A group of one element (a layer of more than `GROUP_COLUMNS` positions)
                // has its `c_out x P` output as the product's destination: nothing to move.
                let one = n == 1;
                let dst: &mut [f32] = if one { &mut *yg } else { &mut out[..co * np] };
                for (row, &bv) in dst.chunks_exact_mut(np).zip(bias) {
                    row.fill(bv);
                }
                w.times((co, np, k), dst, true, View::rows(&col[..k * np], np));
                if !one {
                    for (e, ye) in yg.chunks_exact_mut(g.out_len()).enumerate() {
                        for (row, src) in ye.chunks_exact_mut(p).zip(out.chunks_exact(np)) {
                            row.copy_from_slice(&src[e * p..(e + 1) * p]);
                        }
                    }
                }
            }
            if relu {
                super::relu_in_place(yg);
            }
        },
    )
}

/// Weight and bias gradients for output gradient `dy`: `(dW [c_out, K], db [c_out])`.
pub fn backward_params(x: Source<'_>, dy: &[f32], g: &Geometry) -> (Vec<f32>, Vec<f32>) {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    assert_eq!(x.len(), g.batch * g.in_len(), "conv input size");
    assert_eq!(dy.len(), g.batch * g.out_len(), "conv output gradient size");
    // Each share of the batch accumulates its own dW^T and db ([`summed_over_threads`]).
    // dW^T is accumulated row-major (`K x c_out`): `gemm` ran the Nature CNN's weight
    // gradients at 70-106 GFLOP/s that way against 53-86 writing `dW` (`c_out x K`) directly.
    let one = |b: usize, dwt: &mut [f32], db: &mut [f32], scratch: &mut [f32], first: bool| {
        let (col, xs) = scratch.split_at_mut(k * p);
        patches(x, b, g, xs, col, p);
        let dyb = &dy[b * g.out_len()..(b + 1) * g.out_len()];
        // dW^T (K x c_out) += col (K x P) * dy[b]^T (P x c_out).
        matmul(
            (k, co, p),
            dwt,
            (co, 1),
            !first,
            View::rows(col, p),
            View::transposed(dyb, p),
            false,
        );
        for (d, row) in db.iter_mut().zip(dyb.chunks_exact(p)) {
            *d += row.iter().sum::<f32>();
        }
    };
    summed_over_threads(g.batch, k, co, |share, dwt, db| {
        with_scratch(scratch_len(g, 1), |scratch| {
            for (i, b) in share.enumerate() {
                one(b, dwt, db, scratch, i == 0);
            }
        });
    })
}

/// Weight and bias gradients summed from one contiguous share of the batch per thread of the
/// rayon pool (at most one share per element; one runs on this thread): `share(elements, dwt,
/// db)` adds its elements' `dW^T` (`K x c_out`, row-major) and `db` into zeroed buffers of
/// its own. The shares' sums are added, then `dW^T` is transposed once: `(dW [c_out, K], db
/// [c_out])`.
pub(super) fn summed_over_threads(
    batch: usize,
    k: usize,
    co: usize,
    share: impl Fn(std::ops::Range<usize>, &mut [f32], &mut [f32]) + Sync,
) -> (Vec<f32>, Vec<f32>) {
    let mut acc = summed_shares(batch, k * co + co, |elements, acc| {
        let (dwt, db) = acc.split_at_mut(k * co);
        share(elements, dwt, db);
    });
    let db = acc.split_off(k * co);
    (View::transposed(&acc, co).to_row_major(co, k), db)
}

/// The sum of `len` floats over one contiguous share of the batch per thread of the rayon
/// pool (at most one share per element; one runs on this thread): `share(elements, acc)`
/// adds its elements' terms into a zeroed buffer of its own.
pub(super) fn summed_shares(
    batch: usize,
    len: usize,
    share: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
) -> Vec<f32> {
    let threads = rayon::current_num_threads().min(batch).max(1);
    let per = batch.div_ceil(threads);
    let worker = |t: usize| {
        let mut acc = vec![0f32; len];
        share(t * per..((t + 1) * per).min(batch), &mut acc);
        acc
    };
    if threads == 1 {
        return worker(0);
    }
    let partials: Vec<Vec<f32>> = (0..threads).into_par_iter().map(worker).collect();
    let mut it = partials.into_iter();
    let mut sum = it.next().expect("one worker at least");
    for part in it {
        sum.iter_mut().zip(&part).for_each(|(s, v)| *s += v);
    }
    sum
}

/// Input gradient for output gradient `dy`: `dx [batch, c_in, h, w]`, one product per
/// group of batch elements (`group_size`).
pub fn backward_input(weight: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    assert_eq!(dy.len(), g.batch * g.out_len(), "conv output gradient size");
    let wt = Left::new(View::transposed(weight, k), k, co);
    let group = group_size(g);
    per_group_zeroed(
        g.batch * g.in_len(),
        g.in_len(),
        group,
        scratch_len(g, group),
        |b0, dxg, scratch| {
            let (n, np) = (dxg.len() / g.in_len(), dxg.len() / g.in_len() * p);
            let (dcol, rest) = scratch.split_at_mut(k.max(2) * p * group);
            let (dyg, dxs) = rest.split_at_mut(co * p * group);
            // The group's output gradients side by side (`c_out x nP`), then
            // dcol (K x nP) = W^T (K x c_out) * dy.
            for e in 0..n {
                let dye = &dy[(b0 + e) * g.out_len()..(b0 + e + 1) * g.out_len()];
                for (c, row) in dye.chunks_exact(p).enumerate() {
                    dyg[c * np + e * p..c * np + (e + 1) * p].copy_from_slice(row);
                }
            }
            wt.times(
                (k, np, co),
                &mut dcol[..k * np],
                false,
                View::rows(&dyg[..co * np], np),
            );
            for (e, dxb) in dxg.chunks_exact_mut(g.in_len()).enumerate() {
                let dcol = &dcol[e * p..];
                if g.sw == 1 {
                    col2im_add(dcol, g, dxb, np);
                } else {
                    dxs.fill(0.0);
                    col2im_add(dcol, g, dxs, np);
                    merge_columns(dxs, g, dxb);
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct convolution, the definition.
    fn reference(x: &[f32], w: &[f32], bias: &[f32], g: &Geometry) -> Vec<f32> {
        let (oh, ow) = (g.oh(), g.ow());
        let mut y = vec![0f32; g.batch * g.c_out * oh * ow];
        for b in 0..g.batch {
            for co in 0..g.c_out {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = f64::from(bias[co]);
                        for c in 0..g.c_in {
                            for ky in 0..g.kh {
                                for kx in 0..g.kw {
                                    let xi = ((b * g.c_in + c) * g.h + oy * g.sh + ky) * g.w
                                        + ox * g.sw
                                        + kx;
                                    let wi = ((co * g.c_in + c) * g.kh + ky) * g.kw + kx;
                                    s += f64::from(x[xi]) * f64::from(w[wi]);
                                }
                            }
                        }
                        y[((b * g.c_out + co) * oh + oy) * ow + ox] = s as f32;
                    }
                }
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (v % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: length");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-3 * (1.0 + y.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    const SHAPES: [Geometry; 4] = [
        // Nature-DQN's first layer on a small frame, a stride-2 and a stride-1 layer, a
        // non-square one, and one whose batch splits into groups with a shorter last group
        // (121 output positions: `GROUP_COLUMNS / 121` elements a group, 2 today).
        Geometry {
            batch: 3,
            c_in: 4,
            h: 20,
            w: 41,
            c_out: 5,
            kh: 8,
            kw: 8,
            sh: 4,
            sw: 4,
        },
        Geometry {
            batch: 2,
            c_in: 3,
            h: 9,
            w: 11,
            c_out: 4,
            kh: 4,
            kw: 4,
            sh: 2,
            sw: 2,
        },
        Geometry {
            batch: 2,
            c_in: 2,
            h: 7,
            w: 6,
            c_out: 3,
            kh: 3,
            kw: 2,
            sh: 1,
            sw: 2,
        },
        Geometry {
            batch: 5,
            c_in: 1,
            h: 12,
            w: 13,
            c_out: 2,
            kh: 2,
            kw: 3,
            sh: 1,
            sw: 1,
        },
    ];

    /// The split layout, by its definition, for the widths and strides of every path (each
    /// SIMD level this CPU has, AVX-512's masked last step, AVX2's overlapping one, a partial
    /// last group).
    #[test]
    fn split_columns_matches_its_definition() {
        for sw in 1..=5 {
            for w in 1..=70 {
                let g = Geometry {
                    batch: 1,
                    c_in: 2,
                    h: 3,
                    w,
                    c_out: 1,
                    kh: 1,
                    kw: 1,
                    sh: 1,
                    sw,
                };
                let x = values(g.in_len(), 9);
                for level in 0..=split_level() {
                    let mut xs = vec![f32::NAN; split_len(&g)];
                    match sw {
                        2 => split_rows_at::<2>(&x, &g, &mut xs, level),
                        4 => split_rows_at::<4>(&x, &g, &mut xs, level),
                        _ => split_columns(&x, &g, &mut xs),
                    }
                    check_split(&x, &xs, &g, level);
                }
            }
        }
    }

    /// `xs` is `x` split by its definition, and merging it gives `x` back.
    fn check_split(x: &[f32], xs: &[f32], g: &Geometry, level: u8) {
        let (w, sw, pw) = (g.w, g.sw, phase_width(g));
        for (y, row) in x.chunks_exact(w).enumerate() {
            for r in 0..sw {
                for j in 0..pw {
                    let want = row.get(j * sw + r).copied().unwrap_or(0.0);
                    let got = xs[(y * sw + r) * pw + j];
                    assert_eq!(got, want, "w {w} sw {sw} level {level}");
                }
            }
        }
        let mut back = vec![0.0; x.len()];
        merge_columns(xs, g, &mut back);
        assert_eq!(back, x, "w {w} sw {sw} level {level}");
    }

    /// Run `f` on one thread and on three (the serial and the parallel split).
    fn on_pools(f: impl Fn() + Sync) {
        for threads in [1, 3] {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool")
                .install(&f);
        }
    }

    #[test]
    fn forward_matches_the_direct_convolution() {
        // Also a layer of more positions than `GROUP_COLUMNS` (616), one element a group on
        // any pool: its product writes the output in place.
        let wide = Geometry {
            batch: 2,
            c_in: 2,
            h: 24,
            w: 30,
            c_out: 3,
            kh: 3,
            kw: 3,
            sh: 1,
            sw: 1,
        };
        assert!(wide.p() > GROUP_COLUMNS);
        on_pools(|| {
            for g in SHAPES.into_iter().chain([wide]) {
                let x = values(g.batch * g.in_len(), 1);
                let w = values(g.c_out * g.k(), 2);
                let bias = values(g.c_out, 3);
                close(
                    &forward(Source::F32(&x), &w, &bias, &g, false),
                    &reference(&x, &w, &bias, &g),
                    "y",
                );
                let relu: Vec<f32> = reference(&x, &w, &bias, &g)
                    .iter()
                    .map(|v| v.max(0.0))
                    .collect();
                close(
                    &forward(Source::F32(&x), &w, &bias, &g, true),
                    &relu,
                    "relu(y)",
                );
            }
        });
    }

    /// Frames give the bits their values give: the forward pass and the weight gradient, at
    /// every stride of the test shapes, on one thread and on three.
    #[test]
    fn frames_give_what_their_values_give() {
        on_pools(|| {
            for g in SHAPES {
                let bytes: Vec<u8> = (0..g.batch * g.in_len())
                    .map(|i| (i * 37 % 256) as u8)
                    .collect();
                let x: Vec<f32> = bytes.iter().map(|&b| frames::value(b)).collect();
                let w = values(g.c_out * g.k(), 8);
                let bias = values(g.c_out, 9);
                let dy = values(g.batch * g.out_len(), 10);
                let (frames, floats) = (Source::Frames(&bytes), Source::F32(&x));
                assert!(
                    forward(frames, &w, &bias, &g, true) == forward(floats, &w, &bias, &g, true),
                    "{g:?}"
                );
                assert!(
                    backward_params(frames, &dy, &g) == backward_params(floats, &dy, &g),
                    "{g:?}"
                );
            }
        });
    }

    /// Gradients of `sum(y * r)` for a fixed `r`, against finite differences of the reference
    /// (exact for a linear map: central differences with step 1 in f64 terms).
    #[test]
    fn gradients_match_the_derivative_of_the_direct_convolution() {
        on_pools(|| {
            for g in SHAPES {
                let x = values(g.batch * g.in_len(), 4);
                let w = values(g.c_out * g.k(), 5);
                let bias = values(g.c_out, 6);
                let r = values(g.batch * g.out_len(), 7);
                let objective = |x: &[f32], w: &[f32], bias: &[f32]| -> f64 {
                    reference(x, w, bias, &g)
                        .iter()
                        .zip(&r)
                        .map(|(y, r)| f64::from(*y) * f64::from(*r))
                        .sum()
                };
                // The objective is linear in each argument, so (f(v+1) - f(v-1)) / 2 is exact
                // up to float rounding.
                let numeric = |v: &[f32], at: &dyn Fn(&[f32]) -> f64| -> Vec<f32> {
                    (0..v.len())
                        .map(|i| {
                            let mut up = v.to_vec();
                            up[i] += 1.0;
                            let mut down = v.to_vec();
                            down[i] -= 1.0;
                            ((at(&up) - at(&down)) / 2.0) as f32
                        })
                        .collect()
                };
                let (dw, db) = backward_params(Source::F32(&x), &r, &g);
                let dx = backward_input(&w, &r, &g);
                close(&dw, &numeric(&w, &|w| objective(&x, w, &bias)), "dW");
                close(&db, &numeric(&bias, &|b| objective(&x, &w, b)), "db");
                close(&dx, &numeric(&x, &|x| objective(x, &w, &bias)), "dx");
            }
        });
    }

    /// Groups hold at most `GROUP_COLUMNS` output positions (or one element), and every
    /// thread of the pool gets the same number of groups where the batch allows it: the
    /// collector's batch of 8 on 2 threads runs the 9x9 layer in 4 groups of 2, not 3, 3, 2.
    #[test]
    fn groups_fill_every_thread_alike() {
        for threads in 1..=4 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| {
                for (side, batch) in (1..=12).flat_map(|s| (1..=64).map(move |b| (s, b))) {
                    let g = Geometry {
                        batch,
                        c_in: 1,
                        h: side,
                        w: side,
                        c_out: 1,
                        kh: 1,
                        kw: 1,
                        sh: 1,
                        sw: 1,
                    };
                    let (n, most) = (group_size(&g), (GROUP_COLUMNS / g.p()).max(1));
                    let groups = batch.div_ceil(n);
                    assert!((1..=most).contains(&n), "{n} of at most {most}");
                    // The fewest rounds of groups the size bound allows, each round a group
                    // for every thread.
                    let rounds = batch.div_ceil(threads * most);
                    assert!(groups <= rounds * threads, "{batch} on {threads}: {groups}");
                    assert!(
                        groups > (rounds - 1) * threads,
                        "{batch} on {threads}: {groups}"
                    );
                }
                let nine = Geometry {
                    batch: 8,
                    c_in: 32,
                    h: 20,
                    w: 20,
                    c_out: 64,
                    kh: 4,
                    kw: 4,
                    sh: 2,
                    sw: 2,
                };
                let want = [3, 2, 3, 2][threads - 1];
                assert_eq!(group_size(&nine), want, "{threads} thread(s)");
            });
        }
    }
}
