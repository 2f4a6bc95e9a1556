//! The machine's f32 fused-multiply-add peak on one thread, measured: the roof that
//! `drill bench learner` compares its cases with (achieved GFLOP/s over this figure).
//!
//! Twelve independent accumulator vectors take one FMA each per loop trip (more chains than
//! the FMA latency times the pipes of any x86 core here, so the pipes, not the chains,
//! bound it), at the widest SIMD level `pulp` finds at run time (AVX-512, AVX2+FMA, or
//! scalar).

use pulp::{Simd, WithSimd};
use std::time::Instant;

/// Independent accumulator chains.
const CHAINS: usize = 12;

/// `trips` trips of one FMA per chain; returns a sum of the chains (so none is dropped) and
/// the f32 lanes of a vector.
struct Chains {
    trips: usize,
}

impl WithSimd for Chains {
    type Output = (f32, usize);

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> Self::Output {
        let a = simd.splat_f32s(0.999_999);
        let b = simd.splat_f32s(1e-7);
        let mut acc = [simd.splat_f32s(1.0); CHAINS];
        for _ in 0..self.trips {
            for x in acc.iter_mut() {
                *x = simd.mul_add_e_f32s(*x, a, b);
            }
        }
        let mut sum = acc[0];
        for x in &acc[1..] {
            sum = simd.add_f32s(sum, *x);
        }
        (simd.reduce_sum_f32s(sum), S::F32_LANES)
    }
}

/// The f32 FMA peak of one thread in GFLOP/s (an FMA counts two): the best of 5 runs of
/// about 2^25 vector FMAs each, after a warm-up.
pub fn fma_peak_gflops() -> f64 {
    let arch = pulp::Arch::new();
    let run = |trips: usize| {
        let t = Instant::now();
        let (sum, lanes) = arch.dispatch(Chains { trips });
        std::hint::black_box(sum);
        (trips * CHAINS * lanes * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    run(1 << 18);
    (0..5).map(|_| run(1 << 21)).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_is_a_positive_finite_rate() {
        let p = super::fma_peak_gflops();
        assert!(p.is_finite() && p > 0.1, "{p} GFLOP/s");
    }
}
