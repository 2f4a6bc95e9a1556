//! A dense layer on the CPU: `y = x W + b` (burn's `Linear` layout: `W` is
//! `[in, out]`) and its gradients, each one GEMM on the batch, threaded by `gemm` itself.

use super::bf16::{Level, PackedRight};
use super::gemm::{Epilogue, View, product, product_then};
use super::small_gemm::MAX_MACS;

/// Shapes of one dense layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Rows of the batch.
    pub n: usize,
    /// Input features.
    pub d_in: usize,
    /// Output features.
    pub d_out: usize,
}

/// Forward: `y [n, d_out] = x W + b`, then ReLU when `relu`: bias and ReLU applied as the
/// product is stored (see [`Epilogue`]).
pub fn forward(x: &[f32], weight: &[f32], bias: &[f32], d: Dims, relu: bool) -> Vec<f32> {
    assert_eq!(x.len(), d.n * d.d_in, "linear input size");
    assert_eq!(weight.len(), d.d_in * d.d_out, "linear weight size");
    assert_eq!(bias.len(), d.d_out, "linear bias size");
    product_then(
        (d.n, d.d_out, d.d_in),
        View::rows(x, d.d_in),
        View::rows(weight, d.d_out),
        Epilogue {
            bias: Some(bias),
            relu,
        },
        true,
    )
}

/// A dense layer's weight (`k x n`) packed once, for layers that read the same weight again
/// and again through products of few rows ([`reads_weight_once`]): in f32 as contiguous
/// panels (the same bits as [`forward`]), or for bf16 products at a kernel level.
#[derive(Debug)]
pub enum Packing {
    /// f32 values as `gemm::panels`.
    F32(Vec<f32>),
    /// Packed for bf16 products at `level`.
    Bf16 {
        /// The packed weight.
        weight: PackedRight,
        /// The kernel level it was packed for.
        level: Level,
    },
}

impl Packing {
    /// `weight` (`k x n`, row-major) packed for f32 products (`precision` `None`) or for bf16
    /// ones at a level.
    pub fn new(weight: &[f32], (k, n): (usize, usize), precision: Option<Level>) -> Self {
        match precision {
            None => Packing::F32(super::gemm::panels(weight, n, (k, n))),
            Some(level) => Packing::Bf16 {
                weight: PackedRight::new(level, View::rows(weight, n), k, n, true),
                level,
            },
        }
    }
}

/// Whether a dense layer over `m` rows through a `k x n` weight reads the whole weight from
/// memory on every call (a few rows through a weight larger than L2): where keeping it packed
/// ([`Packing`]) pays.
pub fn reads_weight_once(m: usize, k: usize, n: usize) -> bool {
    super::gemm::reads_right_once(m, n, k)
}

/// [`forward`] through a weight kept packed ([`Packing`]): f32 panels (the same
/// bits as [`forward`]) or bf16 (at the level it was packed for).
pub fn forward_packed(x: &[f32], weight: &Packing, bias: &[f32], d: Dims, relu: bool) -> Vec<f32> {
    assert_eq!(x.len(), d.n * d.d_in, "linear input size");
    assert_eq!(bias.len(), d.d_out, "linear bias size");
    let mut y = vec![0f32; d.n * d.d_out];
    let epilogue = Epilogue {
        bias: Some(bias),
        relu,
    };
    let a = View::rows(x, d.d_in);
    match weight {
        // SAFETY: `y` is a row-major n x d_out buffer of its own; the panels are a kept
        // d_in x d_out weight's.
        Packing::F32(panels) => unsafe {
            super::gemm::few_rows_panels(
                y.as_mut_ptr(),
                (d.n, d.d_out, d.d_in),
                d.d_out,
                a,
                panels,
                epilogue,
            );
        },
        Packing::Bf16 { weight, level } => {
            // SAFETY: `y` is a row-major n x d_out buffer of its own, aliasing neither operand.
            unsafe {
                super::bf16::gemm_right_packed(
                    *level,
                    y.as_mut_ptr(),
                    (d.d_out, 1),
                    false,
                    a,
                    d.n,
                    weight,
                    true,
                );
            }
            epilogue.apply(&mut y, d.d_out);
        }
    }
    y
}

/// Weight and bias gradients for output gradient `dy`: `(dW [d_in, d_out], db [d_out])`.
pub fn backward_params(x: &[f32], dy: &[f32], d: Dims) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(dy.len(), d.n * d.d_out, "linear output gradient size");
    let dw = product(
        (d.d_in, d.d_out, d.n),
        View::transposed(x, d.d_in),
        View::rows(dy, d.d_out),
        true,
    );
    let mut db = vec![0f32; d.d_out];
    for row in dy.chunks_exact(d.d_out) {
        db.iter_mut().zip(row).for_each(|(s, g)| *s += g);
    }
    (dw, db)
}

/// Input gradient for output gradient `dy`: `dx [n, d_in] = dy W^T`.
pub fn backward_input(weight: &[f32], dy: &[f32], d: Dims) -> Vec<f32> {
    assert_eq!(dy.len(), d.n * d.d_out, "linear output gradient size");
    if d.n * d.d_in * d.d_out <= MAX_MACS {
        return product(
            (d.n, d.d_in, d.d_out),
            View::rows(dy, d.d_out),
            View::transposed(weight, d.d_out),
            true,
        );
    }
    // A large product is computed transposed, `dx^T = W dy^T`, into a row-major buffer,
    // then transposed: that way `gemm` reads the weight as it is stored. Asked for `dy W^T`
    // directly (or for a column-major `dx^T`), it packs the transposed weight one element at
    // a time: the Nature CNN's 3136x512 input gradient took 4.2 ms (25 GFLOP/s) against
    // 1.0 ms this way, the transposition included.
    let dxt = product(
        (d.d_in, d.n, d.d_out),
        View::rows(weight, d.d_out),
        View::transposed(dy, d.d_out),
        true,
    );
    View::transposed(&dxt, d.n).to_row_major(d.n, d.d_in)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_and_gradients_match_the_definition() {
        let d = Dims {
            n: 3,
            d_in: 5,
            d_out: 4,
        };
        let v = |n: usize, s: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect()
        };
        let (x, w, b, dy) = (v(15, 0.1), v(20, 0.2), v(4, 0.3), v(12, 0.4));
        let y = forward(&x, &w, &b, d, false);
        let yr = forward(&x, &w, &b, d, true);
        let (dw, db) = backward_params(&x, &dy, d);
        let dx = backward_input(&w, &dy, d);
        for i in 0..d.n {
            for o in 0..d.d_out {
                let want: f32 = b[o]
                    + (0..d.d_in)
                        .map(|k| x[i * 5 + k] * w[k * 4 + o])
                        .sum::<f32>();
                assert!((y[i * 4 + o] - want).abs() < 1e-5);
                assert!((yr[i * 4 + o] - want.max(0.0)).abs() < 1e-5);
            }
            for k in 0..d.d_in {
                let want: f32 = (0..d.d_out).map(|o| dy[i * 4 + o] * w[k * 4 + o]).sum();
                assert!((dx[i * 5 + k] - want).abs() < 1e-5);
            }
        }
        for k in 0..d.d_in {
            for o in 0..d.d_out {
                let want: f32 = (0..d.n).map(|i| x[i * 5 + k] * dy[i * 4 + o]).sum();
                assert!((dw[k * 4 + o] - want).abs() < 1e-5);
            }
        }
        for o in 0..d.d_out {
            let want: f32 = (0..d.n).map(|i| dy[i * 4 + o]).sum();
            assert!((db[o] - want).abs() < 1e-5);
        }
    }

    /// A forward pass over few rows and a weight past `MAX_MACS` (the collector's batch
    /// through the Nature CNN's dense layer): bias and ReLU on the last depth step only, the
    /// columns split over threads (one and three), every row and column as the definition.
    #[test]
    fn a_few_rows_forward_matches_the_definition() {
        // The last two: up to 32 rows through a right operand larger than L2.
        for (n, threads, d_in, d_out) in [
            (1, 1, 700, 330),
            (5, 1, 700, 330),
            (8, 3, 700, 330),
            (5, 3, 700, 330),
            (32, 1, 2100, 500),
            (20, 3, 2100, 500),
        ] {
            let d = Dims { n, d_in, d_out };
            assert!(d.n * d.d_in * d.d_out > MAX_MACS || n < 5);
            let v = |len: usize, s: f32| -> Vec<f32> {
                (0..len).map(|i| (i as f32 * 0.37 + s).sin()).collect()
            };
            let (x, w, b) = (
                v(n * d.d_in, 0.1),
                v(d.d_in * d.d_out, 0.2),
                v(d.d_out, 0.3),
            );
            let y = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool")
                .install(|| forward(&x, &w, &b, d, true));
            for i in 0..n {
                for o in 0..d.d_out {
                    let want: f32 = b[o]
                        + (0..d.d_in)
                            .map(|k| x[i * d.d_in + k] * w[k * d.d_out + o])
                            .sum::<f32>();
                    let got = y[i * d.d_out + o];
                    assert!(
                        (got - want.max(0.0)).abs() < 1e-4 * (1.0 + want.abs()),
                        "rows {n}, threads {threads}: y[{i}][{o}] {got} vs {}",
                        want.max(0.0)
                    );
                }
            }
        }
    }

    /// A product over `MAX_MACS` takes the transposed route: still `dy W^T`.
    #[test]
    fn a_large_input_gradient_matches_the_definition() {
        let d = Dims {
            n: 5,
            d_in: 700,
            d_out: 320,
        };
        assert!(d.n * d.d_in * d.d_out > MAX_MACS);
        let v = |n: usize, s: f32| -> Vec<f32> {
            (0..n).map(|i| (i as f32 * 0.37 + s).sin()).collect()
        };
        let (w, dy) = (v(d.d_in * d.d_out, 0.2), v(d.n * d.d_out, 0.4));
        let dx = backward_input(&w, &dy, d);
        for i in 0..d.n {
            for k in 0..d.d_in {
                let want: f32 = (0..d.d_out)
                    .map(|o| dy[i * d.d_out + o] * w[k * d.d_out + o])
                    .sum();
                let got = dx[i * d.d_in + k];
                assert!(
                    (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "dx[{i}][{k}]: {got} vs {want}"
                );
            }
        }
    }
}
