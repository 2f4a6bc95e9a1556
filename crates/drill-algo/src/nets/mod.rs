//! Neural networks: [`QNet`] for DQN, [`Actor`] and [`Critic`] for PPO, [`SquashedGaussian`]
//! and [`TwinQ`] for SAC, [`ConvEncoder`] (their image trunk: DI-engine's and Nature's) built of [`Conv`] layers ([`Dense`] is the fully connected one: both run
//! [`crate::compute`]'s kernels), and the
//! Nature-DQN [`NatureCnn`] used by the learner benchmark;
//! [`input`] turns any observation batch into a network's float input.

mod actor_critic;
mod cnn;
mod conv;
mod dense;
mod encoder;
mod q;
mod sac;

pub use actor_critic::{Actor, ActorCritic, ActorHead, Critic};
pub use cnn::NatureCnn;
pub use conv::Conv;
pub use dense::Dense;
pub use encoder::ConvEncoder;
pub use q::QNet;
pub use sac::{SquashedGaussian, TwinQ};

use burn::nn::{Initializer, LinearConfig};
use burn::tensor::{Device, Tensor, TensorData};
use drill_env::Obs;

/// A batch of observations as a network's float input `[n, dim]`: `f32` as they are, `u8`
/// frames scaled to `[0, 1]` (on the batch, as DI-engine's and CleanRL's Atari nets do).
pub fn input(obs: Obs<'_>, dim: usize, device: &Device) -> Tensor<2> {
    let n = obs.len() / dim;
    match obs {
        Obs::F32(x) => Tensor::from_data(TensorData::new(x.to_vec(), [n, dim]), device),
        Obs::U8(x) => {
            // One pass that converts and divides (the values of a division of the float
            // tensor, without its second pass), split over the pool's threads for a
            // learner's minibatch (256 Atari frames: 7.2 M values).
            let scale = |&b: &u8| f32::from(b) / 255.0;
            let v: Vec<f32> = if x.len() >= 1 << 20 && rayon::current_num_threads() > 1 {
                use rayon::prelude::*;
                x.par_iter().map(scale).collect()
            } else {
                x.iter().map(scale).collect()
            };
            Tensor::from_data(TensorData::new(v, [n, dim]), device)
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
pub const HALF_LN_2PI: f64 = 0.918_938_533_204_672_8;

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
