//! Where the tensor work runs, and fast: [`select_device`] (CPU, or a GPU for `policy.cuda`),
//! and [`conv2d`] and [`linear`], each a whole layer (bias and ReLU included) as one
//! operation.
//!
//! On the CPU (flex) device with `f32` tensors they run drill's own kernels and backward
//! pass ([`ops`]: the burn backend extension; [`im2col`], [`dense`]: the kernels; [`gemm`]: the
//! matrix product under both). Anywhere else (the GPU, other dtypes) they are burn's own
//! operations. Why: burn-flex 0.22.1 builds convolution patches through NHWC copies, computes
//! the weight gradient as a convolution with the output gradient as kernel, and allocates
//! every matmul output twice; the Nature-DQN update spent most of its time there
//! (`drill bench learner --case nature-cnn-update`).

pub mod dense;
pub mod device;
pub mod gemm;
pub mod im2col;
pub mod ops;

use burn::backend::Dispatch;
use burn::tensor::activation::relu as relu_op;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Tensor};
pub use device::select_device;
use ops::FastOps;

/// Whether `x` goes to drill's kernels: `f32` on the flex device.
fn native<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32 && x.device() == Device::flex()
}

/// `x [batch, c_in, h, w]` convolved with `weight [c_out, c_in, kh, kw]` at `stride`, plus
/// `bias [c_out]`, then ReLU when `relu`: `[batch, c_out, oh, ow]`. No padding, no dilation,
/// one group.
pub fn conv2d(
    x: Tensor<4>,
    weight: Tensor<4>,
    bias: Tensor<1>,
    stride: [usize; 2],
    relu: bool,
) -> Tensor<4> {
    if native(&x) {
        return Tensor::from_dispatch(<Dispatch as FastOps>::fast_conv2d(
            x.into_dispatch(),
            weight.into_dispatch(),
            bias.into_dispatch(),
            stride[0],
            stride[1],
            relu,
        ));
    }
    let options = ConvOptions::new(stride, [0, 0], [1, 1], 1);
    let y = burn::tensor::module::conv2d(x, weight, Some(bias), options);
    if relu { relu_op(y) } else { y }
}

/// `x [n, in] weight [in, out] + bias [out]`, then ReLU when `relu`: `[n, out]`.
pub fn linear(x: Tensor<2>, weight: Tensor<2>, bias: Tensor<1>, relu: bool) -> Tensor<2> {
    if native(&x) {
        return Tensor::from_dispatch(<Dispatch as FastOps>::fast_linear(
            x.into_dispatch(),
            weight.into_dispatch(),
            bias.into_dispatch(),
            relu,
        ));
    }
    let y = x.matmul(weight) + bias.unsqueeze();
    if relu { relu_op(y) } else { y }
}

/// ReLU over a buffer, as burn-flex's (NaN stays NaN). Written as a select, not a branch:
/// the sign of a pre-activation is a coin flip, and a mispredicted branch per element cost
/// more than the layer's GEMM.
fn relu_in_place(v: &mut [f32]) {
    for x in v {
        *x = if *x > 0.0 || x.is_nan() { *x } else { 0.0 };
    }
}

/// Have the C allocator keep freed memory for reuse instead of handing it back to the
/// kernel: an update frees and reallocates the same multi-megabyte tensors every step, and
/// glibc's defaults (map every block over its adaptive threshold afresh, trim the heap top)
/// turned that into page faults, 4 per KB touched (measured: 92k faults over 22 Nature-CNN
/// updates, 18k with this). Call once at start-up; a no-op off glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; it is called before the
    // process starts its worker threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, TensorData};

    fn close(a: TensorData, b: TensorData, what: &str) {
        let (a, b) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
        assert_eq!(a.len(), b.len(), "{what}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                "{what}[{i}]: {x} vs {y}"
            );
        }
    }

    /// drill's layers and burn's own ops, on the same autodiff flex device: the same outputs
    /// and the same gradients for input, weight and bias, with and without the fused ReLU.
    #[test]
    fn layers_match_burns_ops_forward_and_backward() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let rand = |dims: &[usize]| -> TensorData {
            Tensor::<1>::random(
                [dims.iter().product::<usize>()],
                Distribution::Uniform(-1.0, 1.0),
                &device,
            )
            .into_data()
        };
        for relu in [false, true] {
            let (xd, wd, bd) = (rand(&[2, 3, 13, 11]), rand(&[4, 3, 4, 3]), rand(&[4]));
            let leaf = |d: &TensorData, shape: [usize; 4]| {
                Tensor::<1>::from_data(d.clone(), &device)
                    .reshape(shape)
                    .detach()
                    .require_grad()
            };
            let (x1, w1) = (leaf(&xd, [2, 3, 13, 11]), leaf(&wd, [4, 3, 4, 3]));
            let b1 = Tensor::<1>::from_data(bd.clone(), &device).require_grad();
            let (x2, w2) = (leaf(&xd, [2, 3, 13, 11]), leaf(&wd, [4, 3, 4, 3]));
            let b2 = Tensor::<1>::from_data(bd.clone(), &device).require_grad();
            assert!(native(&x1), "the test must exercise drill's kernels");
            let ours = conv2d(x1.clone(), w1.clone(), b1.clone(), [3, 2], relu);
            let opts = ConvOptions::new([3, 2], [0, 0], [1, 1], 1);
            let mut theirs =
                burn::tensor::module::conv2d(x2.clone(), w2.clone(), Some(b2.clone()), opts);
            if relu {
                theirs = relu_op(theirs);
            }
            close(
                ours.clone().into_data(),
                theirs.clone().into_data(),
                "conv y",
            );
            let r = Tensor::<4>::random(ours.dims(), Distribution::Uniform(-1.0, 1.0), &device);
            let g1 = (ours * r.clone()).sum().backward();
            let g2 = (theirs * r).sum().backward();
            for (a, b, what) in [(&x1, &x2, "conv dx"), (&w1, &w2, "conv dW")] {
                close(
                    a.grad(&g1).unwrap().into_data(),
                    b.grad(&g2).unwrap().into_data(),
                    what,
                );
            }
            close(
                b1.grad(&g1).unwrap().into_data(),
                b2.grad(&g2).unwrap().into_data(),
                "conv db",
            );

            let (xd, wd, bd) = (rand(&[5, 7]), rand(&[7, 6]), rand(&[6]));
            let leaf2 = |d: &TensorData, shape: [usize; 2]| {
                Tensor::<1>::from_data(d.clone(), &device)
                    .reshape(shape)
                    .detach()
                    .require_grad()
            };
            let (x1, w1) = (leaf2(&xd, [5, 7]), leaf2(&wd, [7, 6]));
            let (x2, w2) = (leaf2(&xd, [5, 7]), leaf2(&wd, [7, 6]));
            let b1 = Tensor::<1>::from_data(bd.clone(), &device).require_grad();
            let b2 = Tensor::<1>::from_data(bd.clone(), &device).require_grad();
            let ours = linear(x1.clone(), w1.clone(), b1.clone(), relu);
            let mut theirs = x2.clone().matmul(w2.clone()) + b2.clone().unsqueeze();
            if relu {
                theirs = relu_op(theirs);
            }
            close(
                ours.clone().into_data(),
                theirs.clone().into_data(),
                "linear y",
            );
            let r = Tensor::<2>::random([5, 6], Distribution::Uniform(-1.0, 1.0), &device);
            let g1 = (ours * r.clone()).sum().backward();
            let g2 = (theirs * r).sum().backward();
            for (a, b, what) in [(&x1, &x2, "linear dx"), (&w1, &w2, "linear dW")] {
                close(
                    a.grad(&g1).unwrap().into_data(),
                    b.grad(&g2).unwrap().into_data(),
                    what,
                );
            }
            close(
                b1.grad(&g1).unwrap().into_data(),
                b2.grad(&g2).unwrap().into_data(),
                "linear db",
            );
        }
    }
}
