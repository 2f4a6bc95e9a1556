//! `u8` frames as the networks read them: `b / 255` in `f32` ([`value`]), and [`to_f32`],
//! the same values for a whole run of bytes, through AVX-512 or AVX2 where the CPU has them.
//!
//! The SIMD levels divide without a division: `q = b * (1/255)`, then one Newton step
//! through the remainder, `q + (b - 255 q) / 255` (two FMAs). For every one of the 256 byte
//! values that is the correctly rounded quotient, the same bits as `b / 255` (the test checks
//! all of them at every level), so a convolution reading frames through here gives the
//! results of one reading the converted batch.

/// A frame byte as a network reads it, in `[0, 1]`.
#[inline(always)]
pub fn value(b: u8) -> f32 {
    f32::from(b) / 255.0
}

/// `1 / 255`, rounded to `f32`.
const INV: f32 = 1.0 / 255.0;

/// [`value`] through a multiplication and two FMAs (see the module docs); exact only where
/// `mul_add` is a fused instruction, which [`to_f32`]'s SIMD levels enable.
#[inline(always)]
fn value_fma(b: u8) -> f32 {
    let x = f32::from(b);
    let q = x * INV;
    let rest = (-q).mul_add(255.0, x);
    rest.mul_add(INV, q)
}

/// The best level this CPU has: 2 for AVX-512F, 1 for AVX2 with FMA, 0 for none.
fn level() -> u8 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return 2;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return 1;
        }
    }
    0
}

/// `dst[i] = value(src[i])` for every `i` (equal lengths).
pub fn to_f32(src: &[u8], dst: &mut [f32]) {
    to_f32_at(src, dst, level());
}

/// [`to_f32`] at SIMD level `level` (at most [`level`]'s; the tests run each).
fn to_f32_at(src: &[u8], dst: &mut [f32], level: u8) {
    assert_eq!(src.len(), dst.len(), "frame bytes and floats");
    assert!(level <= self::level(), "SIMD level {level} on this CPU");
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F was detected (the level is at most `level()`'s).
        2 => unsafe { to_f32_avx512(src, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA were detected.
        1 => unsafe { to_f32_avx2(src, dst) },
        _ => dst.iter_mut().zip(src).for_each(|(d, &b)| *d = value(b)),
    }
}

/// [`to_f32`] with AVX-512 (the compiler vectorises the loop: widen, convert, three
/// arithmetic instructions).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn to_f32_avx512(src: &[u8], dst: &mut [f32]) {
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, &b)| *d = value_fma(b));
}

/// [`to_f32`] with AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn to_f32_avx2(src: &[u8], dst: &mut [f32]) {
    dst.iter_mut()
        .zip(src)
        .for_each(|(d, &b)| *d = value_fma(b));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte value, at every level this CPU has, gives the bits of `b / 255`, in runs
    /// long and short enough for the vector loops and their tails.
    #[test]
    fn every_level_gives_the_quotient_of_every_byte() {
        let src: Vec<u8> = (0..1000).map(|i| (i * 7 % 256) as u8).collect();
        let want: Vec<u32> = src
            .iter()
            .map(|&b| (f32::from(b) / 255.0).to_bits())
            .collect();
        assert!((0..=255u8).all(|b| src.contains(&b)));
        for level in 0..=level() {
            for n in [0, 1, 15, 16, 17, 63, 64, 65, 1000] {
                let mut dst = vec![f32::NAN; n];
                to_f32_at(&src[..n], &mut dst, level);
                let got: Vec<u32> = dst.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[..n], "level {level}, {n} values");
            }
        }
    }
}
