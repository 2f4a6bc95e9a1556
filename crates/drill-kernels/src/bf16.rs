//! bf16 matrix products (`policy.precision = "bf16"`): both operands rounded to bfloat16
//! (round to nearest even), products accumulated in f32, the destination f32.
//!
//! The operands are packed into pairs of bf16 along the depth (one `u32` holds rows `2p` and
//! `2p + 1` of a column of the right operand, or columns `2p`, `2p + 1` of a row of the left):
//! once per product in [`gemm()`]; a layer's weight once per layer call ([`PackedLeft`],
//! [`gemm_left_packed`]), and im2col's patches straight into the packed layout
//! ([`PackedRight::build`], [`gemm_built`]). It is the layout of AVX-512 BF16's `vdpbf16ps`,
//! which adds two products per f32 lane, twice the f32 FMA rate on CPUs that have it (AMD Zen
//! 4, Intel Cooper Lake and Sapphire Rapids), and of Intel AMX's `tdpbf16ps` (a 16 x 16 x 32
//! block of products an instruction, [`super::amx`]), whose panels are shaped for its tiles
//! ([`Layout`]). The [`Level`] is chosen at run time: AMX where the CPU has it and Linux lets
//! the process use it, else AVX-512 BF16, else [`Level::Portable`], the same arithmetic on
//! the same packed operands in plain Rust (no speed-up there, the same results to f32
//! rounding). Why hand-written: the `gemm` crate (under burn-flex) has f32 and f16 kernels but
//! no bf16 dot products, and no other crate found offers them on stable Rust.
//!
//! A product of two bf16 values is exact in f32, so the levels differ only in how the
//! products meet the accumulator (the CPU's rounding, or two f32 adds a pair here), and in
//! subnormals: the CPUs' instructions take subnormal operands as zero (a difference of less
//! than 2^-126 a product).

use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use super::amx;
use super::view::View;

/// Rows of the left operand per tile.
const MR: usize = 6;
/// Vectors of 16 columns per tile.
const NV: usize = 4;
/// Columns per tile: the right operand's panel width.
pub const NR: usize = NV * 16;

static ENABLED: AtomicBool = AtomicBool::new(false);
/// A level forced for this process (tests, comparisons): 0 none, else `1 + ` its index.
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Whether large products run in bf16 in this process (`policy.precision`; set by
/// the caller from `policy.precision` at start-up).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Run this process's large products in bf16 (`true`) or f32.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Why bf16 products would be slower than f32 ones on this CPU, if they would: without
/// AVX-512 BF16 they run on [`Level::Portable`], about a third of f32's speed
/// (`drill bench learner --case nature-cnn-update` prints both).
pub fn slow_here() -> Option<&'static str> {
    (Level::detect() == Level::Portable).then_some(
        "this CPU has no AVX-512 BF16, so bf16 products run on the portable kernel, several \
         times slower than f32 (learning is the same); keep \"f32\" on this machine",
    )
}

/// Which kernel computes the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Intel AMX (`tdpbf16ps` on tiles, [`super::amx`]), with AVX-512 BF16 converting the
    /// operands.
    Amx,
    /// AVX-512 BF16 `vdpbf16ps`: two bf16 products per f32 lane and instruction.
    Avx512Bf16,
    /// Plain Rust on the same packed operands.
    Portable,
}

const LEVELS: [Level; 3] = [Level::Amx, Level::Avx512Bf16, Level::Portable];

impl Level {
    /// The level products run at: [`Level::detect`], unless [`Level::force`] said otherwise.
    pub fn current() -> Level {
        match FORCED.load(Ordering::Relaxed) {
            0 => Level::detect(),
            i => LEVELS[usize::from(i) - 1],
        }
    }

    /// Run every product at `level` (one of [`Level::available`]) even where the CPU has a
    /// faster one, or (`None`) at the fastest again.
    pub fn force(level: Option<Level>) {
        let i = level.map_or(0, |l| {
            assert!(
                Level::available().contains(&l),
                "bf16 level {l:?} not on this CPU"
            );
            LEVELS.iter().position(|x| *x == l).expect("a level") as u8 + 1
        });
        FORCED.store(i, Ordering::Relaxed);
    }

    /// The fastest level this CPU has.
    pub fn detect() -> Level {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            return if super::amx::available() {
                Level::Amx
            } else {
                Level::Avx512Bf16
            };
        }
        Level::Portable
    }

    /// Every level this CPU can run (for tests), the portable one first.
    pub fn available() -> Vec<Level> {
        let mut levels = vec![Level::Portable];
        match Level::detect() {
            Level::Amx => levels.extend([Level::Avx512Bf16, Level::Amx]),
            Level::Avx512Bf16 => levels.push(Level::Avx512Bf16),
            Level::Portable => {}
        }
        levels
    }

    /// Whether this level converts operands with AVX-512 BF16's `vcvtne2ps2bf16`.
    fn avx512(self) -> bool {
        self != Level::Portable
    }
}

/// `x` rounded to the nearest bfloat16, ties to even (as `vcvtne2ps2bf16`; NaN stays NaN).
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bfloat16.
#[inline(always)]
pub fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Two bf16 values in one `u32`: `lo` in the low half (the even depth index).
#[inline(always)]
fn pair(lo: f32, hi: f32) -> u32 {
    u32::from(to_bf16(lo)) | (u32::from(to_bf16(hi)) << 16)
}

/// `dst[p] = pair(src[2p], src[2p + 1])` (a missing last odd value is 0): a run that is
/// contiguous along the depth.
pub(super) fn pairs_along(level: Level, src: &[f32], dst: &mut [u32]) {
    debug_assert_eq!(dst.len(), src.len().div_ceil(2));
    #[cfg(target_arch = "x86_64")]
    if level.avx512() {
        // SAFETY: the level is chosen only where the CPU has these features.
        return unsafe { pairs_along_avx512(src, dst) };
    }
    let _ = level;
    for (d, x) in dst.iter_mut().zip(src.chunks(2)) {
        *d = pair(x[0], x.get(1).copied().unwrap_or(0.0));
    }
}

/// `pair(lo[c], hi[c])` (`hi` missing: 0) for two runs at consecutive depths, lane `c` at
/// `dst[(c / w) * stride + c % w]` (panels of `w` lanes, `stride` apart: one row of a packed
/// operand's panels), the lanes past the run up to a whole panel zero. `w` is a multiple of
/// 16 or the run fits in one panel.
pub fn pairs_across(
    level: Level,
    lo: &[f32],
    hi: Option<&[f32]>,
    dst: &mut [u32],
    (w, stride): (usize, usize),
) {
    let n = lo.len();
    let end = n.next_multiple_of(w);
    assert!(
        (w % 16 == 0 || end == w) && hi.is_none_or(|h| h.len() >= n),
        "bf16 pairs: {n} lanes in panels of {w}"
    );
    assert!(
        end == 0 || (end / w - 1) * stride + w <= dst.len(),
        "bf16 pairs: destination"
    );
    #[cfg(target_arch = "x86_64")]
    if level.avx512() {
        // SAFETY: the level is chosen only where the CPU has these features; the asserts
        // above are its contract.
        return unsafe { pairs_across_avx512(lo, hi, dst, (w, stride)) };
    }
    let _ = level;
    for c in 0..end {
        dst[(c / w) * stride + c % w] = if c < n {
            pair(lo[c], hi.map_or(0.0, |h| h[c]))
        } else {
            0
        };
    }
}

/// [`pairs_along`] with `vcvtne2ps2bf16`: 32 values a step, the last step masked.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512 BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pairs_along_avx512(src: &[f32], dst: &mut [u32]) {
    use std::arch::x86_64::*;
    assert!(dst.len() >= src.len().div_ceil(2));
    let mut i = 0;
    while i < src.len() {
        let left = src.len() - i;
        let (m0, m1) = (lanes(left), lanes(left.saturating_sub(16)));
        // SAFETY: the masks keep the loads inside `src` and the store inside `dst` (16
        // pairs, or the masked rest: pairs (i / 2)..).
        unsafe {
            let x0 = _mm512_maskz_loadu_ps(m0, src.as_ptr().add(i));
            let x1 = _mm512_maskz_loadu_ps(m1, src.as_ptr().add(i + 16));
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(x1, x0));
            _mm512_mask_storeu_epi32(
                dst.as_mut_ptr().add(i / 2) as *mut i32,
                lanes(left.div_ceil(2)),
                v,
            );
        }
        i += 32;
    }
}

/// [`pairs_across`] with `vcvtne2ps2bf16` and a word interleave: 16 lanes a step.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512BW and AVX-512 BF16; [`pairs_across`]'s asserts hold.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pairs_across_avx512(
    lo: &[f32],
    hi: Option<&[f32]>,
    dst: &mut [u32],
    (w, stride): (usize, usize),
) {
    use std::arch::x86_64::*;
    let n = lo.len();
    let end = n.next_multiple_of(w);
    // Word 2j of the result is word j of the converted `lo` half, word 2j + 1 word j of `hi`.
    let idx = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    let mut c = 0;
    while c < end {
        let m = lanes(n.saturating_sub(c));
        // SAFETY: the mask keeps the loads inside the first n values; the store writes
        // lanes c.. of one panel (w is a multiple of 16, or one panel holds them all), inside
        // `dst` by the caller's assert.
        unsafe {
            let x0 = _mm512_maskz_loadu_ps(m, lo.as_ptr().add(c));
            let x1 = match hi {
                Some(h) => _mm512_maskz_loadu_ps(m, h.as_ptr().add(c)),
                None => _mm512_setzero_ps(),
            };
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(x1, x0));
            let v = _mm512_permutexvar_epi16(idx, v);
            let at = (c / w) * stride + c % w;
            _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(at) as *mut i32, lanes(end - c), v);
        }
        c += 16;
    }
}

/// A mask of the first `min(n, 16)` lanes (of 16-lane AVX-512 operations, here and in the
/// convolution kernels).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn lanes(n: usize) -> u16 {
    if n >= 16 { u16::MAX } else { (1u16 << n) - 1 }
}

/// Element `(i, j)` of a view.
#[inline(always)]
fn at(v: &View<'_>, i: usize, j: usize) -> f32 {
    v.data[i * v.rs + j * v.cs]
}

/// An operand packed in panels of `w` rows (the left operand) or columns (the right), `kpp`
/// depth pairs each: panel `t`, depth pair `p`, lane `r` at `(t * kpp + p) * w + r`; lanes
/// past the matrix and pairs past the depth are zero. The shape follows the [`Level`]
/// ([`Layout::of`]): `MR` rows or [`NR`] columns a panel with `kpp` the depth's pairs for the
/// vector kernels; for AMX, one row a panel (so the left operand is row-major: a tile is 16
/// rows `kpp` apart) or 16 columns, `kpp` a whole number of tile steps and the panels a
/// whole number of 32-lane blocks.
#[derive(Debug, Default)]
pub struct Packed<const LEFT: bool> {
    data: Vec<u32>,
    /// Rows (left) or columns (right).
    len: usize,
    /// Depth.
    k: usize,
    layout: Layout,
}

/// A packed left operand.
pub type PackedLeft = Packed<true>;
/// A packed right operand.
pub type PackedRight = Packed<false>;

/// The panel shape of a packed operand.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Lanes (rows or columns) a panel.
    pub w: usize,
    /// Depth pairs a panel, padding included.
    pub kpp: usize,
    /// Panels, padding included.
    pub panels: usize,
}

impl Layout {
    /// The shape of a `len`-lane, `k`-deep left (`left`) or right operand at `level`.
    pub fn of(level: Level, left: bool, len: usize, k: usize) -> Layout {
        let kp = k.div_ceil(2);
        match (level, left) {
            (Level::Amx, _) => {
                let w = if left { 1 } else { amx::TILE };
                Layout {
                    w,
                    kpp: kp.next_multiple_of(amx::TILE),
                    panels: len.next_multiple_of(amx::BLOCK) / w,
                }
            }
            (_, true) => Layout {
                w: MR,
                kpp: kp,
                panels: len.div_ceil(MR),
            },
            (_, false) => Layout {
                w: NR,
                kpp: kp,
                panels: len.div_ceil(NR),
            },
        }
    }

    fn size(&self) -> usize {
        self.panels * self.kpp * self.w
    }
}

impl<const LEFT: bool> Packed<LEFT> {
    fn kp(&self) -> usize {
        self.k.div_ceil(2)
    }

    fn panel(&self, t: usize) -> &[u32] {
        let size = self.layout.kpp * self.layout.w;
        &self.data[t * size..(t + 1) * size]
    }

    /// Pack the `len` lanes by `k` depth of `x`, where `x(lane, depth)` is the operand's
    /// element: `at(v, lane, depth)` for the left operand, the transposed view for the right.
    fn pack(&mut self, level: Level, v: View<'_>, len: usize, k: usize, parallel: bool) {
        assert!(k > 0, "bf16 product: empty depth");
        let kp = k.div_ceil(2);
        let layout = Layout::of(level, LEFT, len, k);
        let (w, kpp) = (layout.w, layout.kpp);
        self.len = len;
        self.k = k;
        self.layout = layout;
        // Every element is written below (padding included), so a reused buffer needs no
        // zeroing.
        self.data.resize(layout.size(), 0);
        if w == 1 {
            return self.pack_rows(level, v);
        }
        let size = kpp * w;
        let pack_panel = |(t, panel): (usize, &mut [u32])| {
            let lanes = w.min(len.saturating_sub(t * w));
            let (body, pad) = panel.split_at_mut(kp * w);
            pad.fill(0);
            if lanes == 0 {
                body.fill(0);
            } else if v.cs == 1 {
                // Each lane is contiguous along the depth: convert up to 256 pairs of it at a
                // time, then scatter them down the panel.
                let mut run = [0u32; 256];
                for r in 0..lanes {
                    let i = t * w + r;
                    for start in (0..kp).step_by(run.len()) {
                        let pairs = run.len().min(kp - start);
                        let d = 2 * start;
                        let src = &v.data[i * v.rs + d..i * v.rs + k.min(d + 2 * pairs)];
                        pairs_along(level, src, &mut run[..pairs]);
                        for (p, x) in run[..pairs].iter().enumerate() {
                            body[(start + p) * w + r] = *x;
                        }
                    }
                }
                if lanes < w {
                    for row in body.chunks_exact_mut(w) {
                        row[lanes..].fill(0);
                    }
                }
            } else if v.rs == 1 {
                // The lanes are contiguous at each depth: two depths make a row of pairs.
                for (p, row) in body.chunks_exact_mut(w).enumerate() {
                    let at_depth = |d: usize| &v.data[d * v.cs + t * w..][..lanes];
                    let hi = (2 * p + 1 < k).then(|| at_depth(2 * p + 1));
                    pairs_across(level, at_depth(2 * p), hi, row, (w, w));
                }
            } else {
                for (p, row) in body.chunks_exact_mut(w).enumerate() {
                    for (r, x) in row.iter_mut().enumerate() {
                        let i = t * w + r;
                        *x = if r < lanes {
                            let hi = if 2 * p + 1 < k {
                                at(&v, i, 2 * p + 1)
                            } else {
                                0.0
                            };
                            pair(at(&v, i, 2 * p), hi)
                        } else {
                            0
                        };
                    }
                }
            }
        };
        // Panels in groups of at least 256 lanes: a job of the pool, and where the lanes are
        // contiguous at each depth and panels are whole vectors wide, one conversion a depth
        // pair for the whole group (AMX's panels are 16 lanes: a call per panel and pair cost
        // more than the conversion).
        let group = (256 / w).max(1);
        let by_group = v.cs != 1 && v.rs == 1 && w % 16 == 0;
        let pack = |(g, chunk): (usize, &mut [u32])| {
            let first = g * group * w;
            let lanes = (group * w).min(len.saturating_sub(first));
            if !by_group || lanes == 0 {
                for (t, panel) in chunk.chunks_exact_mut(size).enumerate() {
                    pack_panel((g * group + t, panel));
                }
                return;
            }
            for p in 0..kp {
                let at_depth = |d: usize| &v.data[d * v.cs + first..][..lanes];
                let hi = (2 * p + 1 < k).then(|| at_depth(2 * p + 1));
                pairs_across(level, at_depth(2 * p), hi, &mut chunk[p * w..], (w, size));
            }
            let used = lanes.div_ceil(w);
            for panel in chunk.chunks_exact_mut(size).take(used) {
                panel[kp * w..].fill(0);
            }
            chunk[used * size..].fill(0);
        };
        if parallel && layout.panels > group {
            self.data
                .par_chunks_mut(group * size)
                .enumerate()
                .for_each(pack);
        } else {
            self.data
                .chunks_mut(group * size)
                .enumerate()
                .for_each(pack);
        }
    }

    /// [`Packed::pack`] for one lane a panel (AMX's row-major left operand): each lane's
    /// pairs in a row of `kpp`, the rows past `len` zero.
    fn pack_rows(&mut self, level: Level, v: View<'_>) {
        let (len, k, kpp) = (self.len, self.k, self.layout.kpp);
        let kp = k.div_ceil(2);
        let (body, pad_rows) = self.data.split_at_mut(len * kpp);
        pad_rows.fill(0);
        if v.cs == 1 {
            for (i, row) in body.chunks_exact_mut(kpp).enumerate() {
                pairs_along(level, &v.data[i * v.rs..i * v.rs + k], &mut row[..kp]);
                row[kp..].fill(0);
            }
        } else if v.rs == 1 {
            // Each depth is contiguous over the lanes: convert two depths' runs of up to 256
            // lanes, then scatter the pairs down the rows.
            let mut run = [0u32; 256];
            for p in 0..kp {
                let at_depth = |d: usize, i: usize, n: usize| &v.data[d * v.cs + i..][..n];
                for i in (0..len).step_by(run.len()) {
                    let n = run.len().min(len - i);
                    let hi = (2 * p + 1 < k).then(|| at_depth(2 * p + 1, i, n));
                    pairs_across(level, at_depth(2 * p, i, n), hi, &mut run[..n], (n, n));
                    for (r, x) in run[..n].iter().enumerate() {
                        body[(i + r) * kpp + p] = *x;
                    }
                }
            }
            for row in body.chunks_exact_mut(kpp) {
                row[kp..].fill(0);
            }
        } else {
            for (i, row) in body.chunks_exact_mut(kpp).enumerate() {
                for (p, x) in row.iter_mut().enumerate() {
                    *x = if p < kp {
                        let hi = if 2 * p + 1 < k {
                            at(&v, i, 2 * p + 1)
                        } else {
                            0.0
                        };
                        pair(at(&v, i, 2 * p), hi)
                    } else {
                        0
                    };
                }
            }
        }
    }
}

impl PackedLeft {
    /// `a (m x k)` packed for [`gemm_packed`]'s left side.
    pub fn new(level: Level, a: View<'_>, m: usize, k: usize) -> Self {
        let mut p = Self::default();
        p.pack(level, a, m, k, false);
        p
    }
}

impl PackedRight {
    /// `b (k x n)` packed for [`gemm_packed`]'s right side, on the rayon pool when
    /// `parallel`.
    pub fn new(level: Level, b: View<'_>, k: usize, n: usize, parallel: bool) -> Self {
        let mut p = Self::default();
        p.repack(level, b, k, n, parallel);
        p
    }

    /// Fill this buffer for a `k x n` right operand at `level` with `f(data, layout)`, which
    /// must write the depth's pairs of every panel that holds columns (panel `t`, depth pair
    /// `p < k.div_ceil(2)`, column `c` at `(t * layout.kpp + p) * layout.w + c`; zeros past
    /// `n`): e.g. im2col writing patches straight into it. The padding (pairs past the depth,
    /// panels past the columns) is zeroed here.
    pub fn build(&mut self, level: Level, k: usize, n: usize, f: impl FnOnce(&mut [u32], Layout)) {
        assert!(k > 0, "bf16 product: empty depth");
        let layout = Layout::of(level, false, n, k);
        self.len = n;
        self.k = k;
        self.layout = layout;
        self.data.resize(layout.size(), 0);
        f(&mut self.data, layout);
        let (kp, size) = (k.div_ceil(2), layout.kpp * layout.w);
        let used = n.div_ceil(layout.w);
        for panel in self.data[..used * size].chunks_exact_mut(size) {
            panel[kp * layout.w..].fill(0);
        }
        self.data[used * size..].fill(0);
    }

    /// Pack `b (k x n)` into this buffer (keeping its allocation).
    pub fn repack(&mut self, level: Level, b: View<'_>, k: usize, n: usize, parallel: bool) {
        self.pack(level, b.t(), n, k, parallel);
    }
}

/// Where the product goes: `(i, j)` at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
struct Dst {
    ptr: *mut f32,
    rs: usize,
    cs: usize,
    accumulate: bool,
}

// SAFETY: tiles write disjoint cells (each tile owns its rows x columns), so sharing the
// pointer between threads that take different tiles is sound.
unsafe impl Send for Dst {}
// SAFETY: as for Send: threads sharing a `Dst` write disjoint tiles.
unsafe impl Sync for Dst {}

impl Dst {
    /// Store the `rows x cols` corner of a tile's accumulators (`acc`, rows `ld` apart) at
    /// `(i, j)`.
    ///
    /// # Safety
    /// The cells must lie inside the destination the caller of [`gemm`] vouched for.
    #[inline(always)]
    unsafe fn store(
        &self,
        acc: &[f32],
        ld: usize,
        (i, j): (usize, usize),
        (rows, cols): (usize, usize),
    ) {
        for (r, row) in acc.chunks(ld).enumerate().take(rows) {
            let row = &row[..cols];
            if self.cs == 1 {
                // SAFETY: row i + r, columns j.. j + cols are inside the destination, which
                // no other tile writes.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(self.ptr.add((i + r) * self.rs + j), cols)
                };
                if self.accumulate {
                    for (o, v) in out.iter_mut().zip(row) {
                        *o += v;
                    }
                } else {
                    out.copy_from_slice(row);
                }
                continue;
            }
            for (c, v) in row.iter().enumerate() {
                // SAFETY: (i + r, j + c) is inside the m x n destination.
                unsafe {
                    let cell = self.ptr.add((i + r) * self.rs + (j + c) * self.cs);
                    *cell = if self.accumulate { *cell + v } else { *v };
                }
            }
        }
    }
}

/// One tile in plain Rust: per depth pair, the odd product then the even one, each added in
/// f32 (the order of Intel's description of `vdpbf16ps`).
fn tile_portable(
    ap: &[u32],
    bp: &[u32],
    kp: usize,
    dst: &Dst,
    (i, j): (usize, usize),
    (rows, cols): (usize, usize),
) {
    let mut acc = [[0.0; NR]; MR];
    for p in 0..kp {
        let b = &bp[p * NR..(p + 1) * NR];
        for (r, row) in acc.iter_mut().enumerate() {
            let a = ap[p * MR + r];
            let (a0, a1) = (from_bf16(a as u16), from_bf16((a >> 16) as u16));
            for (v, &bv) in row.iter_mut().zip(b) {
                let (b0, b1) = (from_bf16(bv as u16), from_bf16((bv >> 16) as u16));
                *v += a1 * b1;
                *v += a0 * b0;
            }
        }
    }
    // SAFETY: the tile lies inside the destination (the caller's contract).
    unsafe { dst.store(acc.as_flattened(), NR, (i, j), (rows, cols)) };
}

/// One tile with `vdpbf16ps`: [`MR`] x [`NV`] accumulator vectors in registers over the whole
/// depth, stored (masked, added to the destination when accumulating) straight from them
/// into a row-major destination.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512 BF16; `ap` must hold `kp * MR` and `bp` `kp * NR`
/// values; the tile must lie inside the destination.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile_avx512(
    ap: &[u32],
    bp: &[u32],
    kp: usize,
    dst: &Dst,
    (i, j): (usize, usize),
    (rows, cols): (usize, usize),
) {
    use std::arch::x86_64::*;
    assert!(ap.len() >= kp * MR && bp.len() >= kp * NR);
    let mut c = [[_mm512_setzero_ps(); NV]; MR];
    let (mut a, mut b) = (ap.as_ptr(), bp.as_ptr());
    for _ in 0..kp {
        // SAFETY: `b` and `a` step through the panels, which hold kp rows of NR and MR pairs.
        unsafe {
            let mut bv = [_mm512_setzero_si512(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(b.add(v * 16) as *const _);
            }
            for (r, row) in c.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(r) as i32));
                for (x, bv) in row.iter_mut().zip(bv) {
                    *x = _mm512_dpbf16_ps(*x, av, std::mem::transmute::<__m512i, __m512bh>(bv));
                }
            }
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    if dst.cs == 1 {
        for (r, row) in c.iter().enumerate().take(rows) {
            for (v, x) in row.iter().enumerate() {
                let c0 = v * 16;
                if c0 >= cols {
                    break;
                }
                let m = lanes(cols - c0);
                // SAFETY: row i + r, columns j + c0.. (masked to the tile's columns) are
                // inside the destination.
                unsafe {
                    let cell = dst.ptr.add((i + r) * dst.rs + j + c0);
                    let y = if dst.accumulate {
                        _mm512_add_ps(_mm512_maskz_loadu_ps(m, cell), *x)
                    } else {
                        *x
                    };
                    _mm512_mask_storeu_ps(cell, m, y);
                }
            }
        }
    } else {
        let mut acc = [[0f32; NR]; MR];
        for (out, row) in acc.iter_mut().zip(c) {
            for (v, x) in row.into_iter().enumerate() {
                // SAFETY: 16 floats at v * 16 of a row of NR.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(v * 16), x) };
            }
        }
        // SAFETY: the tile lies inside the destination (the caller's contract).
        unsafe { dst.store(acc.as_flattened(), NR, (i, j), (rows, cols)) };
    }
}

/// `dst (m x n) = [dst +] a * b` for packed operands (`a`: `m x k`, `b`: `k x n`) at `level`,
/// on the rayon pool when `parallel` (tiles split by column panel).
///
/// # Safety
/// `dst` must be valid for writes (and reads, when `accumulate`) at every element of the
/// `m x n` matrix its strides describe, and must not alias the operands.
pub unsafe fn gemm_packed(
    level: Level,
    dst: *mut f32,
    (rs, cs): (usize, usize),
    accumulate: bool,
    a: &PackedLeft,
    b: &PackedRight,
    parallel: bool,
) {
    assert_eq!(a.k, b.k, "bf16 product: depths differ");
    assert!(
        a.layout == Layout::of(level, true, a.len, a.k)
            && b.layout == Layout::of(level, false, b.len, b.k),
        "bf16 product: operands packed for another level than {level:?}"
    );
    let (m, n, kp) = (a.len, b.len, a.kp());
    let dst = Dst {
        ptr: dst,
        rs,
        cs,
        accumulate,
    };
    let parallel = parallel && rayon::current_num_threads() > 1;
    #[cfg(target_arch = "x86_64")]
    if level == Level::Amx {
        return gemm_amx(&dst, a, b, parallel);
    }
    let panel = |t: usize| {
        let (j, cols) = (t * NR, NR.min(n - t * NR));
        let bpanel = b.panel(t);
        for s in 0..m.div_ceil(MR) {
            let tile = (s * MR, j);
            let size = (MR.min(m - s * MR), cols);
            match level {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: this level is only chosen where the CPU has the features; the
                // panels hold kp pairs per lane; the tile is inside the destination.
                Level::Avx512Bf16 => unsafe {
                    tile_avx512(a.panel(s), bpanel, kp, &dst, tile, size)
                },
                _ => tile_portable(a.panel(s), bpanel, kp, &dst, tile, size),
            }
        }
    };
    let panels = n.div_ceil(NR);
    if parallel && panels > 1 {
        (0..panels).into_par_iter().for_each(panel);
    } else {
        (0..panels).for_each(panel);
    }
}

/// [`gemm_packed`] on AMX tiles, in 32 x 32 blocks, each computed on the tiles from the
/// left operand's 32 rows and two right panels: a job per 32 columns walking the rows, or
/// (more rows than columns, as a dense layer's weight gradient) per 32 rows walking the
/// columns, so the destination is written in its own order. The tiles are loaded once per
/// thread's run of jobs; a whole block of a row-major destination is read and written in
/// place, any other goes through a 32 x 32 buffer.
#[cfg(target_arch = "x86_64")]
fn gemm_amx(dst: &Dst, a: &PackedLeft, b: &PackedRight, parallel: bool) {
    const BLOCK: usize = amx::BLOCK;
    let (m, n, kpp) = (a.len, b.len, a.layout.kpp);
    let steps = kpp / amx::TILE;
    let by_rows = m > n;
    let (row_blocks, col_blocks) = (m.div_ceil(BLOCK), n.div_ceil(BLOCK));
    // The tiles and a 32 x 32 buffer, set up once per run of jobs on a thread (once for a
    // product on one thread: a convolution's per-element products are 13 jobs each).
    let init = || {
        // SAFETY: Level::Amx is only detected where amx::available() said yes.
        (unsafe { amx::Tiles::load() }, [0f32; BLOCK * BLOCK])
    };
    let job = |(tiles, c): &mut (amx::Tiles, [f32; BLOCK * BLOCK]), outer: usize| {
        let inner = if by_rows { col_blocks } else { row_blocks };
        for x in 0..inner {
            let (s, u) = if by_rows { (outer, x) } else { (x, outer) };
            let (i, rows) = (s * BLOCK, BLOCK.min(m - s * BLOCK));
            let (j, cols) = (u * BLOCK, BLOCK.min(n - u * BLOCK));
            let left = a.data[i * kpp..(i + BLOCK) * kpp].as_ptr();
            let right = (b.panel(2 * u).as_ptr(), b.panel(2 * u + 1).as_ptr());
            // The left block holds 32 rows of kpp pairs (rows padded to 32), each right panel
            // kpp pairs of 16 columns (panels padded to pairs); kpp = 16 * steps.
            if dst.cs == 1 && rows == BLOCK && cols == BLOCK {
                // SAFETY: as said above; a whole block of a row-major destination, read and
                // written in place, inside it by the caller's contract.
                unsafe {
                    let at = dst.ptr.add(i * dst.rs + j);
                    tiles.block(left, kpp, right, steps, at, dst.rs, dst.accumulate);
                }
            } else {
                // SAFETY: as said above; `c` is 32 x 32, and the tile's corner is inside the
                // destination by the caller's contract.
                unsafe {
                    tiles.block(left, kpp, right, steps, c.as_mut_ptr(), BLOCK, false);
                    dst.store(&c[..], BLOCK, (i, j), (rows, cols));
                }
            }
        }
    };
    let jobs = if by_rows { row_blocks } else { col_blocks };
    if parallel && jobs > 1 {
        (0..jobs).into_par_iter().for_each_init(init, job);
    } else {
        let mut state = init();
        (0..jobs).for_each(|outer| job(&mut state, outer));
    }
}

/// `dst = [dst +] a * b` with `a` packed already and `b` built by `fill` (see
/// [`PackedRight::build`]) into this thread's buffer, for a `k x n` right operand; one thread.
///
/// # Safety
/// As for [`gemm()`].
pub unsafe fn gemm_built(
    level: Level,
    dst: *mut f32,
    strides: (usize, usize),
    accumulate: bool,
    a: &PackedLeft,
    n: usize,
    fill: impl FnOnce(&mut [u32], Layout),
) {
    if a.len == 0 || n == 0 {
        return;
    }
    with_right(|bp| {
        bp.build(level, a.k, n, fill);
        // SAFETY: forwarded from the caller.
        unsafe { gemm_packed(level, dst, strides, accumulate, a, bp, false) };
    });
}

/// `dst (m x n) = [dst +] a * b (k x n)` in bf16 at `level` with `a` packed already (e.g. a
/// layer's weight, packed once for every batch element) and `b` packed into this thread's
/// buffer; one thread.
///
/// # Safety
/// As for [`gemm()`].
pub unsafe fn gemm_left_packed(
    level: Level,
    dst: *mut f32,
    strides: (usize, usize),
    accumulate: bool,
    a: &PackedLeft,
    b: View<'_>,
    n: usize,
) {
    if a.len == 0 || n == 0 {
        return;
    }
    with_right(|bp| {
        bp.repack(level, b, a.k, n, false);
        // SAFETY: forwarded from the caller.
        unsafe { gemm_packed(level, dst, strides, accumulate, a, bp, false) };
    });
}

/// `dst (m x n) = [dst +] a (m x k) * b` in bf16 at `b`'s level with `b` packed already (a
/// dense layer's weight kept packed: [`crate::dense::Packing`]) and `a` packed into this
/// thread's buffer, on the rayon pool when `parallel`.
///
/// # Safety
/// As for [`gemm()`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_right_packed(
    level: Level,
    dst: *mut f32,
    strides: (usize, usize),
    accumulate: bool,
    a: View<'_>,
    m: usize,
    b: &PackedRight,
    parallel: bool,
) {
    if m == 0 || b.len == 0 {
        return;
    }
    let mut ap = LEFT.with_borrow_mut(std::mem::take);
    ap.pack(level, a, m, b.k, false);
    // SAFETY: forwarded from the caller.
    unsafe { gemm_packed(level, dst, strides, accumulate, &ap, b, parallel) };
    LEFT.with_borrow_mut(|cache| *cache = ap);
}

/// `f` with this thread's right-operand buffer, taken out of the cache for the call (so a
/// rayon worker that steals another product meanwhile packs into a buffer of its own).
fn with_right(f: impl FnOnce(&mut PackedRight)) {
    let mut bp = RIGHT.with_borrow_mut(std::mem::take);
    f(&mut bp);
    RIGHT.with_borrow_mut(|cache| *cache = bp);
}

thread_local! {
    /// This thread's packing buffers, kept between products.
    static LEFT: std::cell::RefCell<PackedLeft> = Default::default();
    static RIGHT: std::cell::RefCell<PackedRight> = Default::default();
}

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)` in bf16 at `level`: both operands packed
/// (into this thread's buffers), then [`gemm_packed`]. A column-major destination is
/// computed as the transposed product, so its tiles store whole rows.
///
/// # Safety
/// `dst` must be valid for writes (and reads, when `accumulate`) at every element of the
/// `m x n` matrix its strides describe, and must not alias `a` or `b`; the operands' elements
/// must lie inside their slices.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm(
    level: Level,
    dst: *mut f32,
    (m, n, k): (usize, usize, usize),
    (rs, cs): (usize, usize),
    accumulate: bool,
    a: View<'_>,
    b: View<'_>,
    parallel: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    // SAFETY: (i, j) is inside the destination (the caller's contract).
                    unsafe { *dst.add(i * rs + j * cs) = 0.0 };
                }
            }
        }
        return;
    }
    if rs == 1 && cs != 1 {
        // SAFETY: the same cells, seen transposed.
        return unsafe {
            gemm(
                level,
                dst,
                (n, m, k),
                (cs, rs),
                accumulate,
                b.t(),
                a.t(),
                parallel,
            )
        };
    }
    // Taken out of the thread's cache for the product, so a rayon worker that steals another
    // product while this one waits packs into buffers of its own.
    let (mut ap, mut bp) = (
        LEFT.with_borrow_mut(std::mem::take),
        RIGHT.with_borrow_mut(std::mem::take),
    );
    let parallel = parallel && rayon::current_num_threads() > 1;
    ap.pack(level, a, m, k, false);
    bp.repack(level, b, k, n, parallel);
    // SAFETY: forwarded from the caller.
    unsafe { gemm_packed(level, dst, (rs, cs), accumulate, &ap, &bp, parallel) };
    LEFT.with_borrow_mut(|cache| *cache = ap);
    RIGHT.with_borrow_mut(|cache| *cache = bp);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and the next bf16: ties to even (1.0).
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3 * 2^-8 is halfway too: up to the even 1 + 2^-6.
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The definition on bf16-rounded operands, in f64.
    fn reference(a: &View<'_>, b: &View<'_>, (m, n, k): (usize, usize, usize)) -> Vec<f64> {
        let r = |x: f32| f64::from(from_bf16(to_bf16(x)));
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| r(at(a, i, p)) * r(at(b, p, j))).sum();
            }
        }
        out
    }

    /// Every level against the definition on rounded operands (within f32 summation error),
    /// and against f32 within bf16's rounding (2^-8 relative per operand): shapes with edge
    /// tiles, odd depths, transposed and strided operands and destinations, accumulation.
    #[test]
    fn every_level_computes_the_product_of_the_rounded_operands() {
        for (m, n, k) in [
            (1, 1, 1),
            (6, 64, 2),
            (7, 65, 3),
            (13, 130, 257),
            (32, 49, 576),
        ] {
            for transposed in [false, true] {
                let (av, bv) = (values(m * k, 1), values(k * n, 2));
                let a = if transposed {
                    View::transposed(&av, m)
                } else {
                    View::rows(&av, k)
                };
                let b = if transposed {
                    View::transposed(&bv, k)
                } else {
                    View::rows(&bv, n)
                };
                let want = reference(&a, &b, (m, n, k));
                let exact: Vec<f64> = (0..m * n)
                    .map(|c| {
                        (0..k)
                            .map(|p| f64::from(at(&a, c / n, p)) * f64::from(at(&b, p, c % n)))
                            .sum()
                    })
                    .collect();
                for level in Level::available() {
                    for parallel in [false, true] {
                        // Column-major destination, accumulating onto 1.0.
                        let mut dst = vec![1.0f32; m * n];
                        // SAFETY: dst is m x n column-major; the operands are their views.
                        unsafe {
                            gemm(
                                level,
                                dst.as_mut_ptr(),
                                (m, n, k),
                                (1, m),
                                true,
                                a,
                                b,
                                parallel,
                            )
                        };
                        for c in 0..m * n {
                            let (i, j) = (c / n, c % n);
                            let got = f64::from(dst[j * m + i]) - 1.0;
                            let tol = 1e-5 * (1.0 + k as f64);
                            assert!(
                                (got - want[c]).abs() <= tol,
                                "{level:?} {m}x{n}x{k} t={transposed} ({i},{j}): {got} vs {}",
                                want[c]
                            );
                            // Each operand is within 2^-9 relative of its f32 value.
                            let bound = 2.0 * k as f64 / 256.0 + tol;
                            assert!((got - exact[c]).abs() <= bound, "{level:?}: vs f32");
                        }
                    }
                }
            }
        }
    }

    /// A run of pairs lands lane by lane in panels of `w` lanes `stride` apart, the rest of the
    /// last panel zero and nothing else written, at every level (`hi` given or not).
    #[test]
    fn pairs_across_fills_whole_panel_rows() {
        const SENTINEL: u32 = 0xdead_beef;
        let (lo, hi) = (values(37, 5), values(37, 6));
        for level in Level::available() {
            for (w, stride) in [(16, 40), (64, 70), (37, 37)] {
                for hi in [None, Some(&hi[..])] {
                    let mut dst = vec![SENTINEL; 3 * stride];
                    pairs_across(level, &lo, hi, &mut dst, (w, stride));
                    let end = lo.len().next_multiple_of(w);
                    for (at, &x) in dst.iter().enumerate() {
                        let (t, r) = (at / stride, at % stride);
                        let c = t * w + r;
                        let want = if r >= w || c >= end {
                            SENTINEL
                        } else if c < lo.len() {
                            pair(lo[c], hi.map_or(0.0, |h| h[c]))
                        } else {
                            0
                        };
                        assert_eq!(x, want, "{level:?} w {w} stride {stride} at {at}");
                    }
                }
            }
        }
    }

    /// A right operand built by a callback gets its padding zeroed: pairs past the depth and,
    /// for AMX, the panel that completes a 32-column block.
    #[test]
    fn a_built_right_operand_is_padded_with_zeros() {
        for level in Level::available() {
            let (k, n) = (5, 20);
            let mut b = PackedRight::default();
            b.build(level, k, n, |data, lay| {
                data.fill(u32::MAX);
                for t in 0..n.div_ceil(lay.w) {
                    for p in 0..k.div_ceil(2) {
                        for c in 0..lay.w {
                            data[(t * lay.kpp + p) * lay.w + c] = 7;
                        }
                    }
                }
            });
            let lay = Layout::of(level, false, n, k);
            assert_eq!(b.data.len(), lay.panels * lay.kpp * lay.w);
            for (at, &x) in b.data.iter().enumerate() {
                let (t, p) = (at / (lay.kpp * lay.w), at / lay.w % lay.kpp);
                let inside = t < n.div_ceil(lay.w) && p < k.div_ceil(2);
                assert_eq!(x, if inside { 7 } else { 0 }, "{level:?} at {at}");
            }
        }
    }

    /// The AMX and AVX-512 BF16 kernels and the portable one give the same sums to f32
    /// rounding (a row-major destination, overwritten: whole 32 x 32 blocks and edges).
    #[test]
    fn the_levels_agree() {
        let levels = Level::available();
        let (m, n, k) = (40, 100, 300);
        let (av, bv) = (values(m * k, 3), values(k * n, 4));
        let (a, b) = (View::rows(&av, k), View::rows(&bv, n));
        let outs: Vec<Vec<f32>> = levels
            .iter()
            .map(|&l| {
                let mut d = vec![0.0; m * n];
                // SAFETY: row-major m x n destination.
                unsafe { gemm(l, d.as_mut_ptr(), (m, n, k), (n, 1), false, a, b, false) };
                d
            })
            .collect();
        for o in &outs[1..] {
            for (x, y) in o.iter().zip(&outs[0]) {
                assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
            }
        }
    }
}
