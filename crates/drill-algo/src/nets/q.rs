//! [`QNet`]: DI-engine's DQN model — an MLP encoder (vectors) or a [`ConvEncoder`] (frames),
//! and a (dueling) Q head.

use super::ConvEncoder;

use super::{Dense, Input};
use burn::module::Module;
use burn::nn::{Initializer, LinearConfig};
use burn::tensor::{Device, Tensor};

/// Q-network: encoder `obs → h1 → … → hk` (ReLU after each), then either a dueling head
/// (`A`: `hk → hk → actions`, `V`: `hk → hk → 1`, `Q = V + A − mean(A)`, as DI-engine's
/// `DuelingHead`) or a plain linear head `hk → actions`.
#[derive(Module, Debug)]
pub struct QNet {
    trunk: Option<ConvEncoder>,
    encoder: Vec<Dense>,
    advantage: Vec<Dense>,
    value: Vec<Dense>,
}

impl QNet {
    /// A new network with PyTorch's default (Kaiming-uniform) initialisation.
    pub fn new(
        obs_dim: usize,
        hidden: &[usize],
        actions: usize,
        dueling: bool,
        device: &Device,
    ) -> Self {
        let init = LinearConfig::new(1, 1).initializer;
        let mut sizes = vec![obs_dim];
        sizes.extend_from_slice(hidden);
        let h = *sizes.last().unwrap();
        let encoder = super::linears(&sizes, &init, device);
        let (advantage, value) = if dueling {
            (
                super::linears(&[h, h, actions], &init, device),
                super::linears(&[h, h, 1], &init, device),
            )
        } else {
            (super::linears(&[h, actions], &init, device), vec![])
        };
        let _: &Initializer = &init;
        Self {
            trunk: None,
            encoder,
            advantage,
            value,
        }
    }

    /// A network over frames: `trunk`'s features into the (dueling) head, as DI-engine's
    /// DQN with a convolutional encoder.
    pub fn with_trunk(trunk: ConvEncoder, actions: usize, dueling: bool, device: &Device) -> Self {
        let mut net = Self::new(trunk.features(), &[], actions, dueling, device);
        net.trunk = Some(trunk);
        net
    }

    /// Q-values `[batch, actions]` for observations `[batch, obs_dim]`.
    pub fn forward(&self, obs: Input) -> Tensor<2> {
        let mut x = match &self.trunk {
            Some(t) => t.forward(obs),
            None => obs.float(),
        };
        for layer in &self.encoder {
            x = layer.forward_relu(x);
        }
        let head = |layers: &[Dense], x: Tensor<2>| {
            let last = layers.len() - 1;
            layers.iter().enumerate().fold(x, |x, (i, l)| {
                if i < last {
                    l.forward_relu(x)
                } else {
                    l.forward(x)
                }
            })
        };
        if self.value.is_empty() {
            return head(&self.advantage, x);
        }
        let a = head(&self.advantage, x.clone());
        let v = head(&self.value, x);
        let a_mean = a.clone().mean_dim(1);
        v + a - a_mean
    }
}
