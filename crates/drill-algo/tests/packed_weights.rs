//! `policy.precision = "bf16"` keeps a dense layer's large weight packed when few rows at a
//! time read it (`compute::packed_weights`: an acting batch through the Nature CNN's 3136 x
//! 512 weight): from its third sight the layer gives the bf16 product, bit for bit what
//! packing the weight for the call gives, and a new weight is never read through an old
//! packing. Its own test binary: the precision is process-wide.

use burn::tensor::{Device, Tensor, TensorData};
use drill_algo::compute::bf16::{self, Level};
use drill_algo::compute::gemm::{Epilogue, View};
use drill_algo::compute::linear;

fn values(n: usize, seed: u32) -> Vec<f32> {
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

fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = (got.iter().zip(want))
        .map(|(g, w)| (f64::from(*g) - f64::from(*w)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn a_kept_packing_gives_the_bf16_product_and_only_for_its_own_weight() {
    let device = Device::flex();
    let (n, k, d) = (8, 3136, 512);
    let x = values(n * k, 1);
    let bias = values(d, 2);
    let tensor = |v: &[f32], shape: [usize; 2]| {
        Tensor::<2>::from_data(TensorData::new(v.to_vec(), shape), &device)
    };
    let (xt, bt) = (
        tensor(&x, [n, k]),
        Tensor::<1>::from_data(&bias[..], &device),
    );
    let layer = |w: &Tensor<2>| -> Vec<f32> {
        let y = linear(xt.clone(), w.clone(), bt.clone(), true);
        y.into_data().try_to_vec::<f32>().expect("f32 values")
    };
    // Two weights alive at once, read in turn five times each: neither may be read through
    // the other's packing.
    let weights: Vec<Vec<f32>> = [10, 11].iter().map(|&s| values(k * d, s)).collect();
    let epilogue = Epilogue {
        bias: Some(&bias),
        relu: true,
    };
    for level in Level::available() {
        Level::force(Some(level));
        let held: Vec<Tensor<2>> = weights.iter().map(|w| tensor(w, [k, d])).collect();
        let f32_y: Vec<Vec<f32>> = held.iter().map(&layer).collect();
        bf16::set_enabled(true);
        let sights: Vec<Vec<Vec<f32>>> =
            (0..5).map(|_| held.iter().map(&layer).collect()).collect();
        bf16::set_enabled(false);
        for (j, w) in weights.iter().enumerate() {
            let mut want = vec![0f32; n * d];
            // SAFETY: `want` is a row-major n x d buffer of its own.
            unsafe {
                bf16::gemm(
                    level,
                    want.as_mut_ptr(),
                    (n, d, k),
                    (d, 1),
                    false,
                    View::rows(&x, k),
                    View::rows(w, d),
                    false,
                );
            }
            epilogue.apply(&mut want, d);
            for (i, sight) in sights.iter().enumerate() {
                let (y, expected) = if i < 2 {
                    (&sight[j], &f32_y[j])
                } else {
                    (&sight[j], &want)
                };
                assert!(
                    y == expected,
                    "{level:?}, weight {j}, sight {}: not the {} product",
                    i + 1,
                    if i < 2 { "f32" } else { "bf16" }
                );
            }
            let e = rel_err(&want, &f32_y[j]);
            assert!(
                e > 0.0 && e < 1e-2,
                "{level:?}: bf16 against f32, relative error {e}"
            );
        }
    }
    Level::force(None);
}
