//! bf16 convolutions on Intel AMX tiles that read their operands where they lie, with no
//! patch matrix: [`super::im2col`]'s bf16 forward pass, weight and input gradients where the
//! process runs bf16 products on AMX and the layer's shape suits the tiles ([`chosen`];
//! [`crate::conv`] chooses).
//!
//! Each batch element's input is first written channels-last in bf16 (`h x w x c_in`,
//! `channels_last`). Then the `kw * c_in` inputs under one kernel row at one output position
//! are contiguous, and with the depth ordered `(ky, kx, c)` (the weight permuted to match, once
//! per call) the patches of `R` output positions of one output row over 32 depth values are a
//! tile that one `tileloadd` reads, the positions `sw * c_in` values apart:
//! - forward: `y[b]^T (P x c_out) = patches (P x K) * W^T (K x c_out)`, two such row tiles by
//!   32 output channels a block, the accumulators starting from the bias; ReLU, then one
//!   transposition into `y[b]` (`c_out x P`);
//! - weight gradient: `dW (c_out x K) += dy[b] (c_out x P) * patches (P x K)`, the output
//!   gradient in pairs of positions (its rows as they lie), the patches packed in pairs of
//!   positions from the channels-last input (two positions' kernel rows interleaved): a pass
//!   of 64-byte rows, where im2col gathered runs of 4 to 20 values;
//! - input gradient: `dpatch (P x K) = dy[b]^T (P x c_out) * W (c_out x K)`, the output
//!   gradient channels last in bf16 (16 positions a tile, as it lies), added back into the
//!   channels-last input gradient a kernel row (`kw * c_in` values) at a time, then one
//!   transposition into `dx[b]`.
//!
//! x86_64 only. Where the CPU has no AMX, or a layer's kernel rows or output channels are not
//! whole multiples of 32 values, im2col computes the bf16 products as before.

use super::amx;
use super::bf16::{self, Level, lanes};
use super::im2col::{
    Geometry, Source, per_element_from_channels_last, summed_shares, with_scratch,
};
use super::view::View;

/// Depth values a tile step takes: 16 bf16 pairs, 64 bytes.
const STEP: usize = 2 * amx::TILE;

/// Whether this convolution runs here: bf16 products on AMX in this process, kernel rows
/// (`kw * c_in` values) and output channels whole multiples of 32 (a tile step's depth).
pub fn chosen(g: &Geometry) -> bool {
    bf16::enabled()
        && Level::current() == Level::Amx
        && (g.kw * g.c_in).is_multiple_of(STEP)
        && g.c_in.is_multiple_of(2)
        && g.c_out.is_multiple_of(STEP)
        && g.p() > 0
}

/// Values under one kernel row at one position: `kw * c_in`.
fn run(g: &Geometry) -> usize {
    g.kw * g.c_in
}

/// Index in the weight's `(c, ky, kx)` order of depth `q` in the `(ky, kx, c)` order.
fn weight_index(g: &Geometry, q: usize) -> usize {
    let (ky, rest) = (q / run(g), q % run(g));
    let (kx, c) = (rest / g.c_in, rest % g.c_in);
    (c * g.kh + ky) * g.kw + kx
}

/// Channels-last offset of output position `p`'s first input (kernel tap `(0, 0, 0)`).
fn origin(g: &Geometry, p: usize) -> usize {
    let (oy, ox) = (p / g.ow(), p % g.ow());
    (oy * g.sh * g.w + ox * g.sw) * g.c_in
}

/// `dst (h x w x c_in)` = batch element `b` of `x` (`c_in x h x w`) in bf16, channels last:
/// 16 positions at a time, each pair of channels converted into one vector of 16 pairs, then
/// transposed into the positions' rows.
fn channels_last(x: Source<'_>, b: usize, g: &Geometry, dst: &mut [u16]) {
    let (hw, len) = (g.h * g.w, g.in_len());
    assert!(
        g.c_in.is_multiple_of(2) && dst.len() >= len,
        "channels-last bf16 of {g:?}"
    );
    let dst: &mut [u32] = bytemuck::cast_slice_mut(&mut dst[..len]);
    // SAFETY: AMX CPUs have AVX-512F, BW and BF16 (`Level::detect`); the sizes were checked.
    unsafe {
        match x {
            Source::F32(v) => channels_last_avx512(Planes::F32(&v[b * len..][..len]), hw, dst),
            Source::Frames(v) => {
                channels_last_avx512(Planes::Frames(&v[b * len..][..len]), hw, dst)
            }
        }
    }
}

/// One batch element's planes (`c_in x hw`).
#[derive(Clone, Copy)]
enum Planes<'a> {
    F32(&'a [f32]),
    Frames(&'a [u8]),
}

/// [`channels_last`] with AVX-512: `dst[i * c_in / 2 + c]` = channels `2c` and `2c + 1` of
/// position `i` as a bf16 pair.
///
/// # Safety
/// The CPU must have AVX-512F, BW and BF16; `planes` holds an even number of planes of `hw`
/// values and `dst` their pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,fma")]
unsafe fn channels_last_avx512(planes: Planes<'_>, hw: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    let m = dst.len() / hw;
    // Word 2j of a pair vector is word j of the lower channel, 2j + 1 word j of the upper.
    let words = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    let (inv, n255) = (_mm512_set1_ps(1.0 / 255.0), _mm512_set1_ps(255.0));
    // Channel `c`'s 16 values from position `i` (masked to `mask`) as f32.
    let load = |c: usize, i: usize, mask: u16| -> __m512 {
        // SAFETY: the mask keeps the load inside plane c.
        unsafe {
            match planes {
                Planes::F32(v) => _mm512_maskz_loadu_ps(mask, v.as_ptr().add(c * hw + i)),
                Planes::Frames(v) => {
                    let bytes = _mm_maskz_loadu_epi8(mask, v.as_ptr().add(c * hw + i) as *const i8);
                    // b / 255 without a division (`frames`' method: a product, then one
                    // Newton step through the remainder): the bits of `frames::value`.
                    let b = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes));
                    let q = _mm512_mul_ps(b, inv);
                    _mm512_fmadd_ps(_mm512_fnmadd_ps(q, n255, b), inv, q)
                }
            }
        }
    };
    let pairs = |c: usize, i: usize, mask: u16| -> __m512i {
        let (lo, hi) = (load(2 * c, i, mask), load(2 * c + 1, i, mask));
        // SAFETY: register-only operations, AVX-512 BF16 and BW present.
        unsafe {
            _mm512_permutexvar_epi16(
                words,
                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)),
            )
        }
    };
    let out = dst.as_mut_ptr();
    let mut i = 0;
    while i < hw {
        let n = (hw - i).min(16);
        let mask = lanes(n);
        if m == 2 {
            // Two pairs a position: positions i.. i + 7 from the first halves, then the rest.
            let (v0, v1) = (pairs(0, i, mask), pairs(1, i, mask));
            let first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            let second =
                _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
            // SAFETY: 2n pairs from position i, inside dst.
            unsafe {
                _mm512_mask_storeu_epi32(
                    out.add(2 * i) as *mut i32,
                    lanes(2 * n),
                    _mm512_permutex2var_epi32(v0, first, v1),
                );
                if n > 8 {
                    _mm512_mask_storeu_epi32(
                        out.add(2 * i + 16) as *mut i32,
                        lanes(2 * n - 16),
                        _mm512_permutex2var_epi32(v0, second, v1),
                    );
                }
            }
        } else {
            for c0 in (0..m).step_by(16) {
                let width = (m - c0).min(16);
                let mut rows = [_mm512_setzero_si512(); 16];
                for (c, row) in rows.iter_mut().enumerate().take(width) {
                    *row = pairs(c0 + c, i, mask);
                }
                let cols = transpose16(rows);
                for (j, col) in cols.iter().enumerate().take(n) {
                    // SAFETY: position i + j's pairs c0.. c0 + width, inside dst.
                    unsafe {
                        _mm512_mask_storeu_epi32(
                            out.add((i + j) * m + c0) as *mut i32,
                            lanes(width),
                            *col,
                        )
                    };
                }
            }
        }
        i += 16;
    }
}

/// The transpose of 16 vectors of 16 32-bit lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    // Within each 128-bit lane `l`: t[2g] and t[2g + 1] interleave rows 2g and 2g + 1.
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    // u[4g + c], lane l: column 4l + c of rows 4g.. 4g + 3.
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let (g, c) = (i / 4, i % 4);
        let (a, b) = (t[4 * g + c / 2], t[4 * g + 2 + c / 2]);
        if c % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // v[c] and v[4 + c] gather rows 0-7 of columns c, 8 + c and 4 + c, 12 + c; w likewise
    // rows 8-15.
    let half = |x: __m512i, y: __m512i, odd: bool| {
        if odd {
            _mm512_shuffle_i32x4::<0xdd>(x, y)
        } else {
            _mm512_shuffle_i32x4::<0x88>(x, y)
        }
    };
    let v: [__m512i; 8] = std::array::from_fn(|i| half(u[i % 4], u[4 + i % 4], i >= 4));
    let w: [__m512i; 8] = std::array::from_fn(|i| half(u[8 + i % 4], u[12 + i % 4], i >= 4));
    // Column j = 4l + c: l = 0 and 2 from v[c], w[c]; l = 1 and 3 from v[4 + c], w[4 + c].
    std::array::from_fn(|j| {
        let (l, c) = (j / 4, j % 4);
        let s = c + 4 * (l % 2);
        half(v[s], w[s], l >= 2)
    })
}

/// The weight (`c_out x K`, `(c, ky, kx)` order) transposed, its depth in the `(ky, kx, c)`
/// order: `K x c_out`, a depth's channels contiguous (written a row at a time: packing it is
/// part of every forward pass, a collector's batch of 4 included).
fn permuted_weight_t(weight: &[f32], g: &Geometry) -> Vec<f32> {
    let (k, co) = (g.k(), g.c_out);
    let mut wt = vec![0f32; k * co];
    for (q, row) in wt.chunks_exact_mut(co).enumerate() {
        let from = weight_index(g, q);
        for (o, v) in row.iter_mut().enumerate() {
            *v = weight[o * k + from];
        }
    }
    wt
}

/// The weight (`c_out x K`, `(c, ky, kx)` order) as the forward product's right operand: panels
/// of 16 output channels, in each the depth pairs of the `(ky, kx, c)` order one after another
/// (pair `p`, channel `j` of panel `t` at `(t * K / 2 + p) * 16 + j`).
fn packed_weight(weight: &[f32], g: &Geometry) -> Vec<u32> {
    row_pairs_in_panels(&permuted_weight_t(weight, g), g.k() / 2, g.c_out)
}

/// `rows` (`2 * pairs` rows of `width` values) in bf16 as a right operand: panels of 16
/// columns, in each the pairs of rows `(2i, 2i + 1)` one after another (pair `i`, column `j`
/// of panel `t` at `(t * pairs + i) * 16 + j`).
fn row_pairs_in_panels(rows: &[f32], pairs: usize, width: usize) -> Vec<u32> {
    let mut packed = vec![0u32; pairs * width];
    for (i, two) in rows.chunks_exact(2 * width).take(pairs).enumerate() {
        let (lo, hi) = two.split_at(width);
        bf16::pairs_across(
            Level::Amx,
            lo,
            Some(hi),
            &mut packed[i * amx::TILE..],
            (amx::TILE, pairs * amx::TILE),
        );
    }
    packed
}

/// Output rows split into tiles of at most 16 positions: `(rows a tile, tiles a row)`.
fn row_tiles(g: &Geometry) -> (usize, usize) {
    let per_row = g.ow().div_ceil(amx::TILE);
    (g.ow().div_ceil(per_row), per_row)
}

/// Forward: `y = conv(x, weight) + bias`, then ReLU when `relu`; `[batch, c_out, oh, ow]`
/// contiguous. One batch element a job, elements split over the rayon pool.
pub fn forward(x: Source<'_>, weight: &[f32], bias: &[f32], g: &Geometry, relu: bool) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    assert!(chosen(g), "AMX convolution for {g:?}");
    assert_eq!(x.len(), g.batch * g.in_len(), "conv input size");
    assert_eq!(weight.len(), co * k, "conv weight size");
    assert_eq!(bias.len(), co, "conv bias size");
    let packed = packed_weight(weight, g);
    let (rows, per_row) = row_tiles(g);
    // Each tile's first position: the last tile of a row ends at the row's end (overlapping
    // the one before when the row does not divide; both write the same values).
    let starts: Vec<usize> = (0..g.oh())
        .flat_map(|oy| (0..per_row).map(move |t| oy * g.ow() + (t * rows).min(g.ow() - rows)))
        .collect();
    let in_floats = (g.h * g.w * g.c_in).div_ceil(2);
    per_element_from_channels_last(g.batch, (co, p), in_floats, |b, yt, xs| {
        let xs: &mut [u16] = &mut bytemuck::cast_slice_mut(xs)[..g.h * g.w * g.c_in];
        channels_last(x, b, g, xs);
        // SAFETY: AMX is there (`chosen`); every tile read lies in `xs` (a tile's rows are
        // positions of one output row, each reading `run` values per kernel row from its
        // origin), in `packed` (c_out x K / 2 pairs) and in `bias`; every store in `yt`
        // (P x c_out).
        unsafe {
            let tiles = amx::Tiles::load_rows(rows);
            let steps = run(g) / STEP;
            let sa = g.sw * g.c_in * 2;
            for pair in starts.chunks(2) {
                let (p0, p1) = (pair[0], *pair.last().expect("a tile"));
                for ob in (0..co).step_by(STEP) {
                    let bias = bias.as_ptr().add(ob);
                    tiles.start_from_rows(bias, bias.add(amx::TILE));
                    let panel = |t: usize| packed.as_ptr().add(t * k / 2 * amx::TILE);
                    let (b0, b1) = (panel(ob / amx::TILE), panel(ob / amx::TILE + 1));
                    for ky in 0..g.kh {
                        let at = ky * g.w * g.c_in;
                        let a0 = xs.as_ptr().add(origin(g, p0) + at);
                        let a1 = xs.as_ptr().add(origin(g, p1) + at);
                        let skip = ky * run(g) / 2 * amx::TILE;
                        tiles.accumulate((a0, a1), sa, (b0.add(skip), b1.add(skip)), steps);
                    }
                    tiles.store(amx::corners(yt.as_mut_ptr(), (p0, p1), ob, co), co);
                }
            }
        }
        if relu {
            super::relu_in_place(yt);
        }
    })
}

/// The weight (`c_out x K`, `(c, ky, kx)` order) as the input gradient's right operand:
/// panels of 16 depth values of the `(ky, kx, c)` order, in each the pairs of output
/// channels one after another (pair `i`, depth `j` of panel `t` at `(t * c_out / 2 + i) * 16
/// + j`).
fn packed_weight_by_channel(weight: &[f32], g: &Geometry) -> Vec<u32> {
    let (k, co) = (g.k(), g.c_out);
    // W in the (ky, kx, c) order: c_out x K, a channel's depths contiguous.
    let wq = View::transposed(&permuted_weight_t(weight, g), co).to_row_major(co, k);
    row_pairs_in_panels(&wq, co / 2, k)
}

/// Input gradient for output gradient `dy`: `dx [batch, c_in, h, w]`. Per element, the patch
/// gradients `dpatch (P x K) = dy[b]^T (P x c_out) * W (c_out x K)` (the output gradient
/// channels last in bf16: 16 positions a tile, read where they lie), added back into the
/// channels-last input gradient a kernel row at a time (`kw * c_in` contiguous values), then
/// one transposition into `dx[b]`.
pub fn backward_input(weight: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    assert!(chosen(g), "AMX convolution for {g:?}");
    assert_eq!(weight.len(), co * k, "conv weight size");
    assert_eq!(dy.len(), g.batch * co * p, "conv output gradient size");
    let packed = packed_weight_by_channel(weight, g);
    let rows = p.min(amx::TILE);
    let starts: Vec<usize> = (0..p.div_ceil(rows))
        .map(|t| (t * rows).min(p - rows))
        .collect();
    let dy_floats = (p * co).div_ceil(2);
    let zeros = [0f32; amx::TILE];
    per_element_from_channels_last(
        g.batch,
        (g.c_in, g.h * g.w),
        dy_floats + p * k,
        |b, dxn, scratch| {
            let (dys, dpatch) = scratch.split_at_mut(dy_floats);
            let dys: &mut [u32] = &mut bytemuck::cast_slice_mut(dys)[..p * co / 2];
            let dyb = &dy[b * co * p..(b + 1) * co * p];
            // SAFETY: AMX CPUs have AVX-512F, BW and BF16; c_out x P values, their pairs.
            unsafe { channels_last_avx512(Planes::F32(dyb), p, dys) };
            // SAFETY: AMX is there (`chosen`); a tile's rows are 16 (or P) consecutive
            // positions of `dys` (P x c_out bf16, rows 2 c_out bytes apart), each step 32
            // channels further (c_out / 32 steps); `packed` holds K / 16 panels of c_out / 2
            // pairs; every store lies in `dpatch` (P x K).
            unsafe {
                let tiles = amx::Tiles::load_rows(rows);
                let a = dys.as_ptr() as *const u16;
                for pair in starts.chunks(2) {
                    let (p0, p1) = (pair[0], *pair.last().expect("a tile"));
                    for kb in (0..k).step_by(STEP) {
                        tiles.start_from_rows(zeros.as_ptr(), zeros.as_ptr());
                        let panel = |t: usize| packed.as_ptr().add(t * co / 2 * amx::TILE);
                        tiles.accumulate(
                            (a.add(p0 * co), a.add(p1 * co)),
                            co * 2,
                            (panel(kb / amx::TILE), panel(kb / amx::TILE + 1)),
                            co / STEP,
                        );
                        tiles.store(amx::corners(dpatch.as_mut_ptr(), (p0, p1), kb, k), k);
                    }
                }
            }
            // col2im, channels last: each position's kernel rows are runs of the input.
            dxn.fill(0.0);
            let r = run(g);
            for (q, grads) in dpatch.chunks_exact(k).enumerate() {
                let at = origin(g, q);
                for (ky, row) in grads.chunks_exact(r).enumerate() {
                    let to = &mut dxn[at + ky * g.w * g.c_in..][..r];
                    to.iter_mut().zip(row).for_each(|(d, s)| *d += s);
                }
            }
        },
    )
}

/// Floats of patch pairs a weight-gradient group packs (1 MiB).
const RIGHT_FLOATS: usize = 1 << 18;

/// Weight and bias gradients for output gradient `dy`: `(dW [c_out, K], db [c_out])`, one
/// contiguous share of the batch per thread of the rayon pool, summed.
pub fn backward_params(x: Source<'_>, dy: &[f32], g: &Geometry) -> (Vec<f32>, Vec<f32>) {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    assert!(chosen(g), "AMX convolution for {g:?}");
    assert_eq!(x.len(), g.batch * g.in_len(), "conv input size");
    assert_eq!(dy.len(), g.batch * co * p, "conv output gradient size");
    // Pairs of positions a row of either operand, padded to whole tile steps.
    let pp = p.div_ceil(2).next_multiple_of(amx::TILE);
    let in_floats = (g.h * g.w * g.c_in).div_ceil(2);
    // Elements a pass of the products takes, side by side along the depth: the accumulators
    // are loaded and stored once a group, not once an element (2 or 3 depth steps an element
    // on the 9x9 and 7x7 layers). The group's patch pairs stay within 1 MiB, half this L2.
    let group =
        (RIGHT_FLOATS / (k * pp)).clamp(1, g.batch.div_ceil(rayon::current_num_threads()).max(1));
    let gp = group * pp;
    let mut acc = summed_shares(g.batch, co * k + co, |range, acc| {
        let (dw, db) = acc.split_at_mut(co * k);
        with_scratch(in_floats + (co + k) * gp, |scratch| {
            let (xs, rest) = scratch.split_at_mut(in_floats);
            let xs: &mut [u16] = &mut bytemuck::cast_slice_mut(xs)[..g.h * g.w * g.c_in];
            let (left, right) = rest.split_at_mut(co * gp);
            let left: &mut [u32] = bytemuck::cast_slice_mut(left);
            let right: &mut [u32] = bytemuck::cast_slice_mut(right);
            // SAFETY: AMX is there (`chosen`).
            let tiles = unsafe { amx::Tiles::load() };
            for b0 in range.clone().step_by(group) {
                let n = group.min(range.end - b0);
                for e in 0..n {
                    let b = b0 + e;
                    channels_last(x, b, g, xs);
                    let dyb = &dy[b * co * p..(b + 1) * co * p];
                    for ((row, d), out) in dyb
                        .chunks_exact(p)
                        .zip(db.iter_mut())
                        .zip(left.chunks_exact_mut(gp))
                    {
                        *d += row.iter().sum::<f32>();
                        let out = &mut out[e * pp..(e + 1) * pp];
                        bf16::pairs_along(Level::Amx, row, &mut out[..p.div_ceil(2)]);
                        out[p.div_ceil(2)..].fill(0);
                    }
                    position_pairs(xs, g, pp, &mut right[e * pp * amx::TILE..], gp * amx::TILE);
                }
                // SAFETY: `left` holds c_out rows of gp pairs (the first n pp of each
                // written), `right` K / 16 panels of gp pairs by 16 columns (likewise), `dw`
                // c_out x K floats; blocks of 32 x 32 stay inside (c_out and K are multiples
                // of 32, `chosen`).
                unsafe {
                    for ob in (0..co).step_by(STEP) {
                        for kb in (0..k).step_by(STEP) {
                            let panel = |t: usize| right.as_ptr().add(t * gp * amx::TILE);
                            tiles.block(
                                left.as_ptr().add(ob * gp),
                                gp,
                                (panel(kb / amx::TILE), panel(kb / amx::TILE + 1)),
                                n * pp / amx::TILE,
                                dw.as_mut_ptr().add(ob * k + kb),
                                k,
                                true,
                            );
                        }
                    }
                }
            }
        });
    });
    let db = acc.split_off(co * k);
    let mut dw = vec![0f32; co * k];
    for (out, row) in dw.chunks_exact_mut(k).zip(acc.chunks_exact(k)) {
        for (q, &v) in row.iter().enumerate() {
            out[weight_index(g, q)] = v;
        }
    }
    (dw, db)
}

/// The patches of one element (`xs`, channels last) as the weight gradient's right operand:
/// panels of 16 depth values `(ky, kx, c)`, in each the pairs of positions `(2i, 2i + 1)` one
/// after another (pair `i`, depth `j` of panel `t` at `t * panel + i * 16 + j`), a missing odd
/// position and the pairs past `P` zero; the panels `panel` values apart (`pp * 16`, or more
/// where a group's elements lie side by side). 32 depth values (two panels) a step: two
/// 64-byte loads, two word interleaves.
fn position_pairs(xs: &[u16], g: &Geometry, pp: usize, right: &mut [u32], panel: usize) {
    let (p, r) = (g.p(), run(g));
    assert!(
        xs.len() >= g.in_len()
            && panel >= pp * amx::TILE
            && right.len() >= (g.k() / amx::TILE - 1) * panel + pp * amx::TILE,
        "patch pairs of {g:?}"
    );
    for i in 0..pp {
        let at = |q: usize| (q < p).then(|| origin(g, q));
        let (o0, o1) = (at(2 * i), at(2 * i + 1));
        for ky in 0..g.kh {
            let row = ky * g.w * g.c_in;
            for j in (0..r).step_by(STEP) {
                let t = (ky * r + j) / amx::TILE;
                // SAFETY: every position's kernel rows lie inside the input (`origin`, and
                // `xs` holds it all); panels t and t + 1 hold row i (t + 1 < K / 16).
                unsafe {
                    interleave_avx512(
                        o0.map(|o| xs.as_ptr().add(o + row + j)),
                        o1.map(|o| xs.as_ptr().add(o + row + j)),
                        right.as_mut_ptr().add(t * panel + i * amx::TILE),
                        panel,
                    )
                };
            }
        }
    }
}

/// `dst[j] = lo[j] | hi[j] << 16` for `j < 16`, and `dst[stride + j]` the same for values
/// `16 + j`; a missing side zero.
///
/// # Safety
/// The CPU must have AVX-512F and BW; `lo` and `hi` readable for 32 values, `dst` writable at
/// `j` and `stride + j`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn interleave_avx512(
    lo: Option<*const u16>,
    hi: Option<*const u16>,
    dst: *mut u32,
    stride: usize,
) {
    use std::arch::x86_64::*;
    // SAFETY: the caller vouches for 32 values at each side and the two destinations.
    unsafe {
        let load = |v: Option<*const u16>| {
            v.map_or(_mm512_setzero_si512(), |v| {
                _mm512_loadu_si512(v as *const _)
            })
        };
        let (a, b) = (load(lo), load(hi));
        let first = _mm512_set_epi16(
            47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36,
            4, 35, 3, 34, 2, 33, 1, 32, 0,
        );
        let second = _mm512_set_epi16(
            63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54, 22, 53, 21,
            52, 20, 51, 19, 50, 18, 49, 17, 48, 16,
        );
        _mm512_storeu_si512(dst as *mut _, _mm512_permutex2var_epi16(a, first, b));
        _mm512_storeu_si512(
            dst.add(stride) as *mut _,
            _mm512_permutex2var_epi16(a, second, b),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avx512_bf16() -> bool {
        std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }

    fn shape(c_in: usize, h: usize, w: usize, kh: usize, kw: usize, s: usize) -> Geometry {
        Geometry {
            batch: 2,
            c_in,
            h,
            w,
            c_out: 32,
            kh,
            kw,
            sh: s,
            sw: s,
        }
    }

    /// Says on the log, past the test harness's capture (which shows a passing test's output
    /// to nobody), that `test` did not run here and why.
    fn skip(test: &str) {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP {test}: this CPU has no AVX-512 BF16"
        );
    }

    /// Channels last in bf16 is the definition, bit for bit, from values and from frames, for
    /// 1, 2, 4, 16, 17 and 32 pairs of channels and planes that end in part of a vector.
    #[test]
    fn channels_last_matches_the_definition() {
        if !avx512_bf16() {
            skip("channels_last_matches_the_definition");
            return;
        }
        for (c_in, h, w) in [
            (2, 5, 7),
            (4, 84, 84),
            (4, 3, 5),
            (8, 9, 9),
            (32, 20, 20),
            (34, 4, 5),
            (64, 9, 9),
        ] {
            let g = shape(c_in, h, w, 1, 1, 1);
            let n = g.batch * g.in_len();
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let bytes: Vec<u8> = (0..n).map(|i| (i * 37 % 256) as u8).collect();
            for b in 0..g.batch {
                let mut got = vec![0u16; g.in_len()];
                channels_last(Source::F32(&x), b, &g, &mut got);
                let mut from_frames = vec![0u16; g.in_len()];
                channels_last(Source::Frames(&bytes), b, &g, &mut from_frames);
                for c in 0..c_in {
                    for i in 0..h * w {
                        let at = b * g.in_len() + c * h * w + i;
                        assert_eq!(
                            got[i * c_in + c],
                            bf16::to_bf16(x[at]),
                            "{g:?} value ({c}, {i})"
                        );
                        assert_eq!(
                            from_frames[i * c_in + c],
                            bf16::to_bf16(super::super::frames::value(bytes[at])),
                            "{g:?} frame ({c}, {i})"
                        );
                    }
                }
            }
        }
    }

    /// The weight gradient's right operand holds each pair of positions' patch values at the
    /// documented places, zeros past the positions.
    #[test]
    fn position_pairs_match_the_definition() {
        if !avx512_bf16() {
            skip("position_pairs_match_the_definition");
            return;
        }
        for g in [
            shape(4, 84, 84, 8, 8, 4),
            shape(16, 7, 9, 2, 2, 1),
            shape(32, 5, 8, 3, 1, 2),
        ] {
            let xs: Vec<u16> = (0..g.in_len()).map(|i| (i * 31 % 65521) as u16).collect();
            let (p, k) = (g.p(), g.k());
            let pp = p.div_ceil(2).next_multiple_of(amx::TILE);
            let mut right = vec![u32::MAX; k * pp];
            position_pairs(&xs, &g, pp, &mut right, pp * amx::TILE);
            let patch = |q: usize, d: usize| -> u32 {
                if q >= p {
                    return 0;
                }
                let (ky, j) = (d / run(&g), d % run(&g));
                u32::from(xs[origin(&g, q) + ky * g.w * g.c_in + j])
            };
            for d in 0..k {
                for i in 0..pp {
                    let want = patch(2 * i, d) | patch(2 * i + 1, d) << 16;
                    let at = (d / amx::TILE * pp + i) * amx::TILE + d % amx::TILE;
                    assert_eq!(right[at], want, "{g:?}: depth {d}, pair {i}");
                }
            }
        }
    }
}
