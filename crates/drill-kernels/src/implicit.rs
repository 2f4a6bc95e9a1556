//! Convolutions without a patch matrix (implicit GEMM), in f32: the forward pass and the
//! weight gradient read the input where it lies, through [`super::gemm::gathered`] (the tile kernel of [`super::small_gemm`]), instead of
//! copying every element's patches into a `K x P` matrix first ([`super::im2col`]).
//!
//! With `x` one batch element's contiguous `c_in x h x w` input, the patch value of output
//! position `p = (oy, ox)` at kernel tap `t = (c, ky, kx)` is `x[at[p] + tap[t]]`, where
//! `at[p] = oy sh w + ox sw` (`positions`) and `tap[t] = (c h + ky) w + kx` (`taps`). So:
//! - forward: `y[b]^T (P x c_out) = patches (P x K) * W^T (K x c_out)`, the gathered rows
//!   being positions and the depth taps; bias and ReLU in the product's registers, then one
//!   transposition into `y[b]` (`c_out x P`);
//! - weight gradient: `dW^T (K x c_out) += patches^T (K x nP) * dy^T (nP x c_out)` over groups
//!   of `n` elements, the gathered rows being taps and the depth the group's positions: the
//!   accumulators stay in registers across the group.
//!
//! The input gradient stays with [`super::im2col::backward_input`] (a product, then col2im).
//! A first layer's `u8` frames are converted an element (forward) or a group (weight
//! gradient) at a time into the thread's scratch, in cache, just before its products.
//!
//! Chosen ([`chosen`]) where the CPU has AVX2 and FMA: without the patch matrix's pass over
//! memory the Nature-CNN update ran 1.14-1.25x as fast as im2col with `gemm`, on AVX2 and on
//! AVX-512 (there with the 24-accumulator tile of [`super::small_gemm::tile_shape`];
//! `drill --threads 1 bench learner --case nature-cnn-update`).

use super::gemm;
use super::im2col::{
    Geometry, Source, per_element_from_channels_last, summed_over_threads, with_scratch,
};
use super::small_gemm::Epilogue;
use super::view::View;
use std::sync::OnceLock;

/// Whether this CPU runs convolutions here rather than through im2col: AVX2 and FMA (with
/// AVX-512 or without). Decided once per process.
pub fn chosen() -> bool {
    static CHOSEN: OnceLock<bool> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            pulp::x86::V3::try_new().is_some()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Input offset of each output position's first tap, in `(oy, ox)` order.
fn positions(g: &Geometry) -> Vec<usize> {
    let (oh, ow) = (g.oh(), g.ow());
    (0..oh)
        .flat_map(|oy| (0..ow).map(move |ox| oy * g.sh * g.w + ox * g.sw))
        .collect()
}

/// Input offset of each kernel tap from its position's first, in the weight's `(c, ky, kx)`
/// order.
fn taps(g: &Geometry) -> Vec<usize> {
    let (h, w, kh, kw) = (g.h, g.w, g.kh, g.kw);
    (0..g.c_in)
        .flat_map(|c| (0..kh).flat_map(move |ky| (0..kw).map(move |kx| (c * h + ky) * w + kx)))
        .collect()
}

/// Panics unless every gathered read stays inside one element's input: the last position's
/// offset plus the last tap's is its last value.
fn check_reach(g: &Geometry, positions: &[usize], taps: &[usize]) {
    let (last_p, last_t) = (positions.last(), taps.last());
    if let (Some(p), Some(t)) = (last_p, last_t) {
        assert!(p + t < g.c_in * g.h * g.w, "conv taps reach past the input");
    }
}

/// Forward: `y = conv(x, weight) + bias`, then ReLU when `relu`; `[batch, c_out, oh, ow]`
/// contiguous. One product per batch element, elements split over the rayon pool.
pub fn forward(x: Source<'_>, weight: &[f32], bias: &[f32], g: &Geometry, relu: bool) -> Vec<f32> {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    let in_len = g.in_len();
    assert_eq!(x.len(), g.batch * in_len, "conv input size");
    assert_eq!(weight.len(), co * k, "conv weight size");
    assert_eq!(bias.len(), co, "conv bias size");
    let wt = View::transposed(weight, k).to_row_major(k, co);
    let (at, tap) = (positions(g), taps(g));
    check_reach(g, &at, &tap);
    per_element_from_channels_last(g.batch, (co, p), x.buffer_len(1, in_len), |b, yt, raw| {
        let xb = x.values(b..b + 1, in_len, raw);
        // SAFETY: every gathered read lies in `xb` (check_reach), `wt` is K x c_out, `yt`
        // is P x c_out and this thread's own.
        unsafe {
            gemm::gathered(
                (p, co, k),
                yt.as_mut_ptr(),
                co,
                false,
                xb.as_ptr(),
                (&at, &tap),
                wt.as_ptr(),
                co,
                Epilogue {
                    bias: Some(bias),
                    relu,
                },
            );
        }
    })
}

/// Output-gradient floats a weight-gradient group stacks (`n P x c_out`): 256 KiB, half this
/// box's L2, so that they stay in cache while every tap tile passes over them.
const GROUP_FLOATS: usize = 1 << 16;

/// Weight and bias gradients for output gradient `dy`: `(dW [c_out, K], db [c_out])`, one
/// share of the batch per thread (`im2col::summed_over_threads`), in groups of elements.
pub fn backward_params(x: Source<'_>, dy: &[f32], g: &Geometry) -> (Vec<f32>, Vec<f32>) {
    let (k, p, co) = (g.k(), g.p(), g.c_out);
    let in_len = g.in_len();
    assert_eq!(x.len(), g.batch * in_len, "conv input size");
    assert_eq!(dy.len(), g.batch * co * p, "conv output gradient size");
    let (at, tap) = (positions(g), taps(g));
    check_reach(g, &at, &tap);
    let group = (GROUP_FLOATS / (p * co).max(1)).clamp(1, g.batch.max(1));
    // Depth offsets of a group's positions from its first element's input.
    let depth: Vec<usize> = (0..group)
        .flat_map(|e| at.iter().map(move |a| e * in_len + a))
        .collect();
    summed_over_threads(g.batch, k, co, |share, dwt, db| {
        let (lo, hi) = (share.start, share.end);
        let raw = x.buffer_len(group, in_len);
        with_scratch(group * p * co + raw, |scratch| {
            let (stack, raw) = scratch.split_at_mut(group * p * co);
            for (i, b0) in (lo..hi).step_by(group).enumerate() {
                let n = group.min(hi - b0);
                let xg = x.values(b0..b0 + n, in_len, raw);
                for e in 0..n {
                    let dye = &dy[(b0 + e) * co * p..(b0 + e + 1) * co * p];
                    View::transposed(dye, p).write_row_major(p, co, &mut stack[e * p * co..]);
                    for (d, row) in db.iter_mut().zip(dye.chunks_exact(p)) {
                        *d += row.iter().sum::<f32>();
                    }
                }
                // SAFETY: the group's reads lie in its n elements `xg` (check_reach, and
                // `depth` steps whole elements); `stack` holds their n P x c_out output
                // gradients; `dwt` is K x c_out and this share's own.
                unsafe {
                    gemm::gathered(
                        (k, co, n * p),
                        dwt.as_mut_ptr(),
                        co,
                        i > 0,
                        xg.as_ptr(),
                        (&tap, &depth),
                        stack.as_ptr(),
                        co,
                        Epilogue::default(),
                    );
                }
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::super::{frames, im2col};
    use super::*;

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
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    /// The forward pass and the weight and bias gradients equal im2col's (which its tests hold
    /// to the direct convolution and its derivative) on the Nature CNN's layers, odd shapes
    /// (channel counts that leave masked vectors, a batch that leaves a short last group, a
    /// non-square kernel and strides), on one thread and on three; frames the same bits as
    /// their converted values.
    #[test]
    fn implicit_convolution_matches_im2col() {
        let shape = |batch, c_in, h, w, c_out, kh, kw, sh, sw| Geometry {
            batch,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            sh,
            sw,
        };
        let shapes = [
            shape(3, 4, 84, 84, 32, 8, 8, 4, 4),
            shape(5, 32, 20, 20, 64, 4, 4, 2, 2),
            shape(2, 64, 9, 9, 64, 3, 3, 1, 1),
            shape(21, 3, 9, 11, 5, 4, 3, 2, 1),
            shape(1, 1, 5, 5, 1, 5, 5, 1, 1),
            shape(7, 2, 7, 6, 13, 3, 2, 1, 2),
        ];
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| {
                for g in shapes {
                    let x = values(g.batch * g.c_in * g.h * g.w, 1);
                    let w = values(g.c_out * g.k(), 2);
                    let bias = values(g.c_out, 3);
                    let dy = values(g.batch * g.c_out * g.p(), 4);
                    for relu in [false, true] {
                        close(
                            &forward(Source::F32(&x), &w, &bias, &g, relu),
                            &im2col::forward(Source::F32(&x), &w, &bias, &g, relu),
                            &format!("y of {g:?}, relu {relu}"),
                        );
                    }
                    let (dw, db) = backward_params(Source::F32(&x), &dy, &g);
                    let (want_dw, want_db) = im2col::backward_params(Source::F32(&x), &dy, &g);
                    close(&dw, &want_dw, &format!("dW of {g:?}"));
                    close(&db, &want_db, &format!("db of {g:?}"));
                    // Frames give the bits of their converted values.
                    let bytes: Vec<u8> = (0..x.len()).map(|i| (i * 37 % 256) as u8).collect();
                    let scaled: Vec<f32> = bytes.iter().map(|&b| frames::value(b)).collect();
                    assert_eq!(
                        forward(Source::Frames(&bytes), &w, &bias, &g, true),
                        forward(Source::F32(&scaled), &w, &bias, &g, true),
                        "y of frames, {g:?}"
                    );
                    assert_eq!(
                        backward_params(Source::Frames(&bytes), &dy, &g),
                        backward_params(Source::F32(&scaled), &dy, &g),
                        "dW and db of frames, {g:?}"
                    );
                }
            });
        }
    }
}
