//! Neural networks: [`QNet`] for DQN, `Actor` and `Critic` for PPO (with an optional
//! [`Lstm`] core), `SquashedGaussian`
//! and `TwinQ` for SAC, [`ConvEncoder`] (their image trunk: DI-engine's and Nature's) built of `Conv` layers (`Dense` is the fully connected one: both run
//! [`crate::compute`]'s kernels), and the
//! Nature-DQN [`NatureCnn`] used by the learner benchmark;
//! [`input`] turns any observation batch into a network's [`Input`].

mod actor_critic;
mod cnn;
mod conv;
mod dense;
mod encoder;
mod lstm;
mod q;
mod sac;
mod shapes;

pub use actor_critic::ActorCritic;
pub(crate) use actor_critic::{Actor, ActorHead, Critic};
pub use cnn::NatureCnn;
pub(crate) use conv::Conv;
pub(crate) use dense::Dense;
pub use encoder::ConvEncoder;
pub(crate) use encoder::check as check_encoder;
pub use lstm::Lstm;
pub use q::QNet;
pub(crate) use sac::{SquashedGaussian, TwinQ};
pub(crate) use shapes::{ObsShape, check_shapes};

use burn::nn::{Initializer, LinearConfig};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use drill_env::Obs;
use drill_kernels::frames;

/// A network's input batch `[n, dim]`: float features, or `u8` frames, which a
/// convolutional trunk's first layer reads as they are (`conv2d_frames`),
/// each byte as `b / 255` (as DI-engine's and CleanRL's Atari nets scale them).
#[derive(Debug, Clone)]
pub enum Input {
    /// Float features.
    Float(Tensor<2>),
    /// Frame bytes (an int tensor of dtype `U8`).
    Frames(Tensor<2, Int>),
}

impl Input {
    /// The batch as floats: frames scaled to `[0, 1]` (for layers that read floats only).
    pub fn float(self) -> Tensor<2> {
        match self {
            Input::Float(x) => x,
            Input::Frames(x) => x.float().div_scalar(255.0),
        }
    }

    /// `[n, dim]`.
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Input::Float(x) => x.dims(),
            Input::Frames(x) => x.dims(),
        }
    }
}

/// A batch of observations as a network's input `[n, dim]`: `f32` as they are; `u8` frames
/// as bytes on the CPU device, whose kernels read them (a quarter of the floats' memory),
/// elsewhere converted to floats in `[0, 1]` on the host.
pub fn input(obs: Obs<'_>, dim: usize, device: &Device) -> Input {
    let n = obs.len() / dim;
    match obs {
        Obs::F32(x) => Input::Float(Tensor::from_data(
            TensorData::new(x.to_vec(), [n, dim]),
            device,
        )),
        Obs::U8(x) if bytes_on(device) => frames(x.to_vec(), [n, dim], device),
        Obs::U8(x) => {
            // One pass that converts and divides (the values of a division of the float
            // tensor, without its second pass), split over the pool's threads for a large
            // batch.
            let v: Vec<f32> = if split(x.len()) {
                use rayon::prelude::*;
                x.par_iter().map(|&b| frames::value(b)).collect()
            } else {
                x.iter().map(|&b| frames::value(b)).collect()
            };
            Input::Float(Tensor::from_data(TensorData::new(v, [n, dim]), device))
        }
    }
}

/// Whether frames go to `device` as bytes: the CPU device, where its kernels read them.
fn bytes_on(device: &Device) -> bool {
    *device == Device::flex()
}

/// Frame bytes `[n, dim]` as an [`Input::Frames`] on `device`.
fn frames(v: Vec<u8>, shape: [usize; 2], device: &Device) -> Input {
    Input::Frames(Tensor::from_data(
        TensorData::new(v, shape),
        (device, DType::U8),
    ))
}

/// Whether gathering or converting `values` frame values is split over the pool's threads:
/// from 1 M (a learner's minibatch of 256 Atari frames holds 7.2 M), when the pool has
/// threads.
fn split(values: usize) -> bool {
    values >= 1 << 20 && rayon::current_num_threads() > 1
}

/// `out`'s chunks of `dim` cells set to rows `rows` of `x` (each through `cell`), in order,
/// split over the pool's threads for a large batch; returns `out` with its length set.
fn gathered<T: Copy + Send + Sync, U: Send>(
    x: &[T],
    rows: &[usize],
    dim: usize,
    cell: impl Fn(T) -> U + Sync,
) -> Vec<U> {
    let n = rows.len();
    let fill = |out: &mut [std::mem::MaybeUninit<U>], k: usize| {
        for (o, &b) in out.iter_mut().zip(&x[k * dim..(k + 1) * dim]) {
            o.write(cell(b));
        }
    };
    let mut v: Vec<U> = Vec::with_capacity(n * dim);
    let cells = &mut v.spare_capacity_mut()[..n * dim];
    if split(n * dim) {
        use rayon::prelude::*;
        cells
            .par_chunks_mut(dim)
            .zip(rows.par_iter())
            .for_each(|(out, &k)| fill(out, k));
    } else {
        cells
            .chunks_mut(dim)
            .zip(rows)
            .for_each(|(out, &k)| fill(out, k));
    }
    // SAFETY: each of the n chunks of `dim` cells was written whole: `x[k * dim..(k + 1) *
    // dim]` is `dim` values long (or the slicing panicked, and this line is not reached).
    unsafe { v.set_len(n * dim) };
    v
}

/// [`input`] of rows `rows` of `obs` (`dim` values each), in that order: a learner's
/// minibatch gathered (and, where [`input`] converts, converted) in one pass, split over the
/// pool's threads for Atari frames (a separate gather was a 7 MB copy on one thread while
/// the other waited).
pub(crate) fn input_rows(obs: Obs<'_>, rows: &[usize], dim: usize, device: &Device) -> Input {
    let shape = [rows.len(), dim];
    match obs {
        Obs::F32(x) => {
            let v: Vec<f32> = rows
                .iter()
                .flat_map(|&k| &x[k * dim..(k + 1) * dim])
                .copied()
                .collect();
            Input::Float(Tensor::from_data(TensorData::new(v, shape), device))
        }
        Obs::U8(x) if bytes_on(device) => frames(gathered(x, rows, dim, |b| b), shape, device),
        Obs::U8(x) => {
            let v = gathered(x, rows, dim, frames::value);
            Input::Float(Tensor::from_data(TensorData::new(v, shape), device))
        }
    }
}

/// Linear layers `sizes[0] → sizes[1] → …` with the given initializer.
pub(crate) fn linears(sizes: &[usize], init: &Initializer, device: &Device) -> Vec<Dense> {
    sizes
        .windows(2)
        .map(|w| {
            LinearConfig::new(w[0], w[1])
                .with_initializer(init.clone())
                .init(device)
                .into()
        })
        .collect()
}

/// `0.5 ln(2 pi)`: the constant of the Gaussian log-density (PPO's and SAC's policies).
pub(crate) const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

/// The index of the largest value of `row` (the first of equals): the greedy action of
/// Q-values or logits.
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    best
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static LAYERS_BUILT: Cell<u64> = const { Cell::new(0) };
    }

    /// Counts a layer built on this thread (tests only: each test runs on its own thread).
    pub(crate) fn note_layer_built() {
        LAYERS_BUILT.with(|n| n.set(n.get() + 1));
    }

    /// Layers built on this thread so far.
    pub(crate) fn layers_built() -> u64 {
        LAYERS_BUILT.with(Cell::get)
    }

    /// A gathered minibatch is the same tensor as the rows copied out first and then
    /// converted, for u8 frames (one thread and split over three, below and above the size
    /// from which it splits; as bytes and converted on the host) and for f32 rows.
    #[test]
    fn input_rows_is_input_of_the_gathered_rows() {
        let device = Device::default();
        for (n, dim) in [(10, 3), (300, 84 * 84)] {
            let x: Vec<u8> = (0..n * dim).map(|i| (i * 7 % 251) as u8).collect();
            let f: Vec<f32> = x.iter().map(|&b| f32::from(b) * 0.5).collect();
            let rows: Vec<usize> = (0..n).rev().step_by(3).chain([0, 0]).collect();
            let gather = |src: &[u8]| -> Vec<u8> {
                rows.iter()
                    .flat_map(|&k| &src[k * dim..(k + 1) * dim])
                    .copied()
                    .collect()
            };
            let fgather: Vec<f32> = rows
                .iter()
                .flat_map(|&k| &f[k * dim..(k + 1) * dim])
                .copied()
                .collect();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("a thread pool");
                let (got, want, fgot) = pool.install(|| {
                    (
                        input_rows(Obs::U8(&x), &rows, dim, &device)
                            .float()
                            .into_data(),
                        input(Obs::U8(&gather(&x)), dim, &device)
                            .float()
                            .into_data(),
                        input_rows(Obs::F32(&f), &rows, dim, &device)
                            .float()
                            .into_data(),
                    )
                });
                assert_eq!(got, want, "{threads} threads, {n} x {dim}");
                // Frames kept as bytes or converted on the host: the same values.
                let scaled: Vec<f32> = gather(&x).iter().map(|&b| frames::value(b)).collect();
                let host = pool.install(|| gathered(&x, &rows, dim, frames::value));
                assert_eq!(host, scaled);
                assert_eq!(got.as_slice::<f32>().unwrap(), &scaled[..]);
                assert_eq!(fgot.as_slice::<f32>().unwrap(), &fgather[..]);
                assert_eq!(got.num_elements(), rows.len() * dim);
            }
        }
    }
}
