//! Neural networks: [`QNet`] for DQN, [`Actor`] and [`Critic`] for PPO, and the Nature-DQN
//! [`NatureCnn`] used by the learner benchmark.

mod actor_critic;
mod cnn;
mod q;

pub use actor_critic::{Actor, ActorCritic, ActorHead, Critic};
pub use cnn::NatureCnn;
pub use q::QNet;

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::Device;

/// Linear layers `sizes[0] → sizes[1] → …` with the given initializer.
pub(crate) fn linears(sizes: &[usize], init: &Initializer, device: &Device) -> Vec<Linear> {
    sizes
        .windows(2)
        .map(|w| {
            LinearConfig::new(w[0], w[1])
                .with_initializer(init.clone())
                .init(device)
        })
        .collect()
}
