//! A dense layer's large weight read by few rows at a time is kept packed from its third
//! sight (`compute::packed_weights`: an acting batch through the Nature CNN's 3136 x 512
//! weight). In f32 the layer gives the same bits throughout; with `policy.precision =
//! "bf16"` it gives the bf16 product from then on, bit for bit what packing the weight for
//! the call gives; a weight is never read through another's packing. Its own test binary:
//! the precision is process-wide.

use burn::tensor::{Device, Tensor, TensorData};
use drill_algo::compute::linear;
use drill_kernels::dense::{self, Dims, Packing};
use drill_kernels::precision::{self, Level};

// The kernels' test helpers: the same inputs and error measure as their own tests.
#[path = "../../drill-kernels/tests/common/mod.rs"]
mod common;
use common::{rel_err, values};

#[test]
fn a_kept_packing_gives_its_own_weight_s_product() {
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
    let dims = Dims {
        n,
        d_in: k,
        d_out: d,
    };
    let f32_y: Vec<Vec<f32>> = (weights.iter())
        .map(|w| dense::forward(&x, w, &bias, dims, true))
        .collect();
    // f32 first (`None`), then every bf16 level this CPU has.
    let precisions = std::iter::once(None).chain(Level::available().into_iter().map(Some));
    for precision in precisions {
        if let Some(level) = precision {
            Level::force(Some(level));
        }
        let held: Vec<Tensor<2>> = weights.iter().map(|w| tensor(w, [k, d])).collect();
        precision::set_enabled(precision.is_some());
        let sights: Vec<Vec<Vec<f32>>> =
            (0..5).map(|_| held.iter().map(&layer).collect()).collect();
        precision::set_enabled(false);
        for (j, w) in weights.iter().enumerate() {
            let bf16_y = precision.map(|level| {
                // The same weight packed for this call alone.
                let packing = Packing::new(w, (k, d), Some(level));
                let y = dense::forward_packed(&x, &packing, &bias, dims, true);
                let e = rel_err(&y, &f32_y[j]);
                assert!(
                    e > 0.0 && e < 1e-2,
                    "{level:?}: bf16 against f32, relative error {e}"
                );
                y
            });
            for (i, sight) in sights.iter().enumerate() {
                let want = match &bf16_y {
                    Some(y) if i >= 2 => y,
                    _ => &f32_y[j],
                };
                assert!(
                    sight[j] == *want,
                    "{precision:?}, weight {j}, sight {}: not the {} product",
                    i + 1,
                    if want == &f32_y[j] { "f32" } else { "bf16" }
                );
            }
        }
    }
    Level::force(None);
}
