//! [`NatureCnn`]: the Nature-DQN convolutional Q-network (Mnih et al. 2015) for 4×84×84 frames.

use super::{Conv, Dense};
use burn::module::Module;
use burn::nn::LinearConfig;
use burn::tensor::{Device, Tensor};

/// conv 32×8×8/4 → conv 64×4×4/2 → conv 64×3×3/1 → 512 → actions, ReLU between.
#[derive(Module, Debug)]
pub struct NatureCnn {
    c1: Conv,
    c2: Conv,
    c3: Conv,
    fc: Dense,
    out: Dense,
}

impl NatureCnn {
    /// A new network for `actions` actions.
    pub fn new(actions: usize, device: &Device) -> Self {
        Self {
            c1: Conv::new(4, 32, 8, 4, device),
            c2: Conv::new(32, 64, 4, 2, device),
            c3: Conv::new(64, 64, 3, 1, device),
            fc: LinearConfig::new(64 * 7 * 7, 512).init(device).into(),
            out: LinearConfig::new(512, actions).init(device).into(),
        }
    }

    /// Q-values `[batch, actions]` for frames `[batch, 4, 84, 84]` scaled to `[0, 1]`.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.c1.forward_relu(x);
        let x = self.c2.forward_relu(x);
        let x = self.c3.forward_relu(x);
        let x: Tensor<2> = x.flatten(1, 3);
        self.out.forward(self.fc.forward_relu(x))
    }
}
