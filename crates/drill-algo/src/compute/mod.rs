//! Where the tensor work runs, and fast: [`select_device`] (CPU, or a GPU for `policy.cuda`),
//! and [`conv2d`] and [`linear`], each a whole layer (bias and ReLU included) as one
//! operation (`conv2d_frames`: a first layer reading `u8` frames).
//!
//! On the CPU (flex) device with `f32` tensors they run the `drill-kernels` crate's kernels
//! and drill's own backward pass (`ops`: the burn backend extension, with SyncBatchNorm's op
//! and the gradient sink a distributed trainer reads during backward; `packed_weights`:
//! dense weights kept packed between calls). Anywhere else (the GPU, other dtypes) they are
//! burn's own operations. Why: burn-flex 0.22.1 builds convolution patches through NHWC
//! copies, computes the weight gradient as a convolution with the output gradient as kernel,
//! and allocates every matmul output twice; the Nature-DQN update spent most of its time
//! there (`drill bench learner --case nature-cnn-update`).
//!
//! With `policy.precision = "bf16"` their large products run in bf16 (operands rounded to
//! bfloat16, f32 accumulation; on Intel AMX tiles where the CPU has them: `drill_kernels::bf16`).

mod device;
pub(crate) mod ops;
pub(crate) mod packed_weights;

use burn::backend::Dispatch;
use burn::tensor::activation::relu as relu_op;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Device, Int, Tensor};
pub use device::{gpu, select_device};
use ops::FastOps;
pub(crate) use ops::{BatchStats, GradSink, sink_begin, sink_end};

/// Whether `x` goes to drill's kernels: `f32` on the flex device.
pub(crate) fn native<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32 && x.device() == Device::flex()
}

/// An LSTM's recurrence (PyTorch's `nn.LSTM` cell, gates i, f, g, o) over `steps` steps of
/// `state0.dims()[0]` sequences, rows time-major: `xp [steps · rows, 4H]` the input's
/// projection with its bias, `w_hh [H, 4H]`, `b_hh [4H]`, `state0 [rows, 2H]` (`h` then `c`),
/// `ended[t · rows + j]`: sequence `j`'s episode ended at step `t` (its state is zeroed
/// before the next). Every step's `h` and `c` `[steps · rows, 2H]`, before that zeroing. On
/// the CPU one operation (drill-kernels' `lstm`, backward through time); elsewhere burn's
/// element-wise operations, step by step.
pub fn lstm(
    xp: Tensor<2>,
    w_hh: Tensor<2>,
    b_hh: Tensor<1>,
    state0: Tensor<2>,
    ended: &[bool],
) -> Tensor<2> {
    let keep: Vec<f32> = ended.iter().map(|&e| if e { 0.0 } else { 1.0 }).collect();
    if native(&xp) {
        return Tensor::from_dispatch(<Dispatch as FastOps>::fast_lstm(
            xp.into_dispatch(),
            w_hh.into_dispatch(),
            b_hh.into_dispatch(),
            state0.into_dispatch(),
            keep,
        ));
    }
    lstm_steps(xp, w_hh, b_hh, state0, keep)
}

/// [`lstm`] as burn's operations, one step at a time.
fn lstm_steps(
    xp: Tensor<2>,
    w_hh: Tensor<2>,
    b_hh: Tensor<1>,
    state0: Tensor<2>,
    keep: Vec<f32>,
) -> Tensor<2> {
    use burn::tensor::TensorData;
    use burn::tensor::activation::{sigmoid, tanh};
    let [m, w] = state0.dims();
    let (hd, steps) = (w / 2, xp.dims()[0] / m.max(1));
    let device = xp.device();
    let (mut h, mut c) = (state0.clone().narrow(1, 0, hd), state0.narrow(1, hd, hd));
    let mut out = Vec::with_capacity(steps);
    for t in 0..steps {
        let g = xp.clone().narrow(0, t * m, m) + linear(h, w_hh.clone(), b_hh.clone(), false);
        let i = sigmoid(g.clone().narrow(1, 0, hd));
        let f = sigmoid(g.clone().narrow(1, hd, hd));
        let cand = tanh(g.clone().narrow(1, 2 * hd, hd));
        let o = sigmoid(g.narrow(1, 3 * hd, hd));
        c = f * c + i * cand;
        h = o * tanh(c.clone());
        out.push(Tensor::cat(vec![h.clone(), c.clone()], 1));
        let k = &keep[t * m..(t + 1) * m];
        if k.contains(&0.0) {
            let k = Tensor::<2>::from_data(TensorData::new(k.to_vec(), [m, 1]), &device)
                .expand([m, hd]);
            h = h * k.clone();
            c = c * k;
        }
    }
    Tensor::cat(out, 0)
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

/// [`conv2d`] over `u8` frames `x [batch, c_in, h, w]` (an int tensor of dtype `U8`), each
/// byte read as `b / 255` ([`drill_kernels::frames::value`]): a network's first layer. On
/// the CPU device drill's kernels take the bytes, with the same results as [`conv2d`] over
/// the converted batch: they convert each element (or group of them) in cache as they reach
/// it (no float copy of the batch, a quarter of the memory traffic).
/// Anywhere else the batch is converted first.
pub(crate) fn conv2d_frames(
    x: Tensor<4, Int>,
    weight: Tensor<4>,
    bias: Tensor<1>,
    stride: [usize; 2],
    relu: bool,
) -> Tensor<4> {
    if x.dtype() == DType::U8 && native(&weight) {
        return Tensor::from_dispatch(<Dispatch as FastOps>::fast_conv2d_frames(
            x.into_dispatch(),
            weight.into_dispatch(),
            bias.into_dispatch(),
            stride[0],
            stride[1],
            relu,
        ));
    }
    conv2d(x.float().div_scalar(255.0), weight, bias, stride, relu)
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

/// Batch normalisation's training forward over `x [n, c]` with the statistics `stats` (over
/// every rank's rows), scaled by `gamma` and shifted by `beta`, on drill's CPU path: its
/// backward all-reduces over `stats.group` ([`BatchStats`]). Only for [`native`] tensors.
pub(crate) fn batch_norm(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    stats: BatchStats,
) -> Tensor<2> {
    assert!(native(&x), "batch_norm runs drill's CPU path only");
    Tensor::from_dispatch(<Dispatch as FastOps>::fast_batch_norm(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        stats,
    ))
}

/// Note `model`'s float parameters' graph nodes, slot by slot in visit order (a
/// `ParamLayout`'s), for the gradient sink set on this thread ([`sink_begin`]); parameters
/// off the CPU device are not noted.
pub(crate) fn tag_params<M: burn::module::Module>(model: &M) {
    struct Tag(usize);
    impl burn::module::ModuleVisitor for Tag {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            let value = param.val();
            if native(&value) {
                let _ = Tensor::<D>::from_dispatch(<Dispatch as FastOps>::fast_tag_param(
                    value.into_dispatch(),
                    self.0,
                ));
            }
            self.0 += 1;
        }
    }
    model.visit(&mut Tag(0));
}

/// Buffers of at least this many floats (1 MiB) are masked over the rayon pool's threads
/// ([`par_zip`]).
const PARALLEL_FROM: usize = 1 << 18;

/// Floats one thread takes at a time in [`par_zip`].
const BLOCK: usize = 1 << 15;

/// `f(a[i], b[i])` for every `i`, over the rayon pool's threads when `a` is large (each
/// element on its own, so the values are those of one pass).
fn par_zip(a: &mut [f32], b: &[f32], f: impl Fn(&mut f32, f32) + Sync) {
    use rayon::prelude::*;
    assert_eq!(a.len(), b.len());
    if a.len() < PARALLEL_FROM || rayon::current_num_threads() == 1 {
        a.iter_mut().zip(b).for_each(|(a, b)| f(a, *b));
        return;
    }
    a.par_chunks_mut(BLOCK)
        .zip(b.par_chunks(BLOCK))
        .for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(a, b)| f(a, *b)));
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

    /// The split pass gives one pass's values, on one thread and on three (blocks and a
    /// short last one), below and above the size from which it splits.
    #[test]
    fn par_zip_split_over_threads_gives_one_pass_values() {
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            for n in [5, PARALLEL_FROM + 3 * BLOCK + 17] {
                let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut want: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
                let mut got = want.clone();
                want.iter_mut().zip(&b).for_each(|(a, b)| *a = *a * 2.0 + b);
                pool.install(|| par_zip(&mut got, &b, |a, b| *a = *a * 2.0 + b));
                assert!(got == want, "{threads} threads, {n} values");
            }
        }
    }

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

    fn act<const D: usize>(y: Tensor<D>, relu: bool) -> Tensor<D> {
        if relu { relu_op(y) } else { y }
    }

    /// A tracked leaf tensor of `shape` holding `d`.
    fn leaf<const D: usize>(d: &TensorData, shape: [usize; D], device: &Device) -> Tensor<D> {
        Tensor::<1>::from_data(d.clone(), device)
            .reshape(shape)
            .detach()
            .require_grad()
    }

    /// `ours` and `theirs` equal, and so the gradients of `sum(y * r)` for the same random
    /// `r` with respect to the three leaves of each.
    fn same_layer<const D: usize, const W: usize>(
        (ours, theirs): (Tensor<D>, Tensor<D>),
        ours_leaves: (&Tensor<D>, &Tensor<W>, &Tensor<1>),
        theirs_leaves: (&Tensor<D>, &Tensor<W>, &Tensor<1>),
        what: &str,
    ) {
        close(ours.clone().into_data(), theirs.clone().into_data(), what);
        let r = Tensor::<D>::random(
            ours.dims(),
            Distribution::Uniform(-1.0, 1.0),
            &ours.device(),
        );
        let g1 = (ours * r.clone()).sum().backward();
        let g2 = (theirs * r).sum().backward();
        let grad = |t: &Tensor<D>, g| t.grad(g).unwrap().into_data();
        close(
            grad(ours_leaves.0, &g1),
            grad(theirs_leaves.0, &g2),
            &format!("{what} dx"),
        );
        let (w1, w2) = (ours_leaves.1.grad(&g1), theirs_leaves.1.grad(&g2));
        close(
            w1.unwrap().into_data(),
            w2.unwrap().into_data(),
            &format!("{what} dW"),
        );
        let (b1, b2) = (ours_leaves.2.grad(&g1), theirs_leaves.2.grad(&g2));
        close(
            b1.unwrap().into_data(),
            b2.unwrap().into_data(),
            &format!("{what} db"),
        );
    }

    /// The LSTM's one-operation recurrence (drill-kernels, backward through time) equals
    /// burn's operations stepped one by one: the outputs (`h` and `c` of every step, with
    /// episode ends inside) and the gradients of `sum(y * r)` with respect to the input's
    /// projection, `W_hh`, `b_hh` and the initial state.
    #[test]
    fn the_lstm_operation_is_burns_cell_stepped_through_time() {
        let device = Device::flex().autodiff();
        device.seed(11);
        let (steps, m, h) = (5, 3, 4);
        let u = Distribution::Uniform(-1.0, 1.0);
        let data = |shape: &[usize]| {
            Tensor::<1>::random([shape.iter().product::<usize>()], u, &device).into_data()
        };
        let (xp, w, b, s0) = (
            data(&[steps * m, 4 * h]),
            data(&[h, 4 * h]),
            data(&[4 * h]),
            data(&[m, 2 * h]),
        );
        let ended: Vec<bool> = (0..steps * m).map(|k| k == 4 || k == 7 || k == 8).collect();
        let keep: Vec<f32> = ended.iter().map(|&e| if e { 0.0 } else { 1.0 }).collect();
        let leaves = || {
            (
                leaf(&xp, [steps * m, 4 * h], &device),
                leaf(&w, [h, 4 * h], &device),
                leaf(&b, [4 * h], &device),
                leaf(&s0, [m, 2 * h], &device),
            )
        };
        let (a, b_) = (leaves(), leaves());
        let ours = lstm(a.0.clone(), a.1.clone(), a.2.clone(), a.3.clone(), &ended);
        let theirs = lstm_steps(b_.0.clone(), b_.1.clone(), b_.2.clone(), b_.3.clone(), keep);
        close(
            ours.clone().into_data(),
            theirs.clone().into_data(),
            "lstm y",
        );
        let r = Tensor::<2>::random(ours.dims(), u, &device);
        let (g1, g2) = (
            (ours * r.clone()).sum().backward(),
            (theirs * r).sum().backward(),
        );
        close(
            a.0.grad(&g1).unwrap().into_data(),
            b_.0.grad(&g2).unwrap().into_data(),
            "lstm dxp",
        );
        close(
            a.1.grad(&g1).unwrap().into_data(),
            b_.1.grad(&g2).unwrap().into_data(),
            "lstm dW_hh",
        );
        close(
            a.2.grad(&g1).unwrap().into_data(),
            b_.2.grad(&g2).unwrap().into_data(),
            "lstm db_hh",
        );
        close(
            a.3.grad(&g1).unwrap().into_data(),
            b_.3.grad(&g2).unwrap().into_data(),
            "lstm dstate0",
        );
    }

    /// A first layer over frames gives the bits of the layer over their values, `b / 255`:
    /// the output and the weight and bias gradients, with and without the fused ReLU.
    #[test]
    fn frames_layer_matches_the_layer_over_their_values() {
        let device = Device::flex().autodiff();
        device.seed(4);
        let bytes: Vec<u8> = (0..2 * 4 * 21 * 17).map(|i| (i * 73 % 256) as u8).collect();
        let floats: Vec<f32> = bytes
            .iter()
            .map(|&b| drill_kernels::frames::value(b))
            .collect();
        let shape = [2, 4, 21, 17];
        let wd = Tensor::<1>::random([5 * 4 * 8 * 8], Distribution::Uniform(-1.0, 1.0), &device)
            .into_data();
        let bd = Tensor::<1>::random([5], Distribution::Uniform(-1.0, 1.0), &device).into_data();
        for relu in [false, true] {
            let (w1, b1) = (leaf(&wd, [5, 4, 8, 8], &device), leaf(&bd, [5], &device));
            let (w2, b2) = (leaf(&wd, [5, 4, 8, 8], &device), leaf(&bd, [5], &device));
            let x = Tensor::<4, Int>::from_data(
                TensorData::new(bytes.clone(), shape),
                (&device, DType::U8),
            );
            let y1 = conv2d_frames(x, w1.clone(), b1.clone(), [4, 3], relu);
            let x = Tensor::<4>::from_data(TensorData::new(floats.clone(), shape), &device);
            let y2 = conv2d(x, w2.clone(), b2.clone(), [4, 3], relu);
            assert_eq!(
                y1.clone().into_data(),
                y2.clone().into_data(),
                "relu {relu}"
            );
            let r = Tensor::<4>::random(y1.dims(), Distribution::Uniform(-1.0, 1.0), &device);
            let g1 = (y1 * r.clone()).sum().backward();
            let g2 = (y2 * r).sum().backward();
            let grad = |t: &Tensor<4>, g| t.grad(g).unwrap().into_data();
            assert_eq!(grad(&w1, &g1), grad(&w2, &g2), "dW, relu {relu}");
            let grad = |t: &Tensor<1>, g| t.grad(g).unwrap().into_data();
            assert_eq!(grad(&b1, &g1), grad(&b2, &g2), "db, relu {relu}");
        }
    }

    /// drill's layers and burn's own ops, on the same autodiff flex device: the same outputs
    /// and the same gradients for input, weight and bias, with and without the fused ReLU.
    #[test]
    fn layers_match_burns_ops_forward_and_backward() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let rand = |n: usize| -> TensorData {
            Tensor::<1>::random([n], Distribution::Uniform(-1.0, 1.0), &device).into_data()
        };
        for relu in [false, true] {
            let (xd, wd, bd) = (rand(2 * 3 * 13 * 11), rand(4 * 3 * 4 * 3), rand(4));
            let ours = (
                leaf(&xd, [2, 3, 13, 11], &device),
                leaf(&wd, [4, 3, 4, 3], &device),
                leaf(&bd, [4], &device),
            );
            let theirs = (
                leaf(&xd, [2, 3, 13, 11], &device),
                leaf(&wd, [4, 3, 4, 3], &device),
                leaf(&bd, [4], &device),
            );
            assert!(native(&ours.0), "the test must exercise drill's kernels");
            let y1 = conv2d(ours.0.clone(), ours.1.clone(), ours.2.clone(), [3, 2], relu);
            let opts = ConvOptions::new([3, 2], [0, 0], [1, 1], 1);
            let (x, w, b) = (theirs.0.clone(), theirs.1.clone(), theirs.2.clone());
            let y2 = act(burn::tensor::module::conv2d(x, w, Some(b), opts), relu);
            same_layer(
                (y1, y2),
                (&ours.0, &ours.1, &ours.2),
                (&theirs.0, &theirs.1, &theirs.2),
                "conv",
            );

            let (xd, wd, bd) = (rand(5 * 7), rand(7 * 6), rand(6));
            let ours = (
                leaf(&xd, [5, 7], &device),
                leaf(&wd, [7, 6], &device),
                leaf(&bd, [6], &device),
            );
            let theirs = (
                leaf(&xd, [5, 7], &device),
                leaf(&wd, [7, 6], &device),
                leaf(&bd, [6], &device),
            );
            let y1 = linear(ours.0.clone(), ours.1.clone(), ours.2.clone(), relu);
            let y2 = act(
                theirs.0.clone().matmul(theirs.1.clone()) + theirs.2.clone().unsqueeze(),
                relu,
            );
            same_layer(
                (y1, y2),
                (&ours.0, &ours.1, &ours.2),
                (&theirs.0, &theirs.1, &theirs.2),
                "linear",
            );
        }
    }
}
