//! What the precision tests share: seeded operands and a relative error.

/// `n` values in `[-1, 1]` from an xorshift generator seeded by `seed`.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(7);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20001) as f32 / 10000.0 - 1.0
        })
        .collect()
}

/// Relative error of `got` against `want` in the 2-norm.
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - f64::from(*w)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}
