//! [`NatureCnn`]: the Nature-DQN convolutional Q-network (Mnih et al. 2015) for 4×84×84 frames.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};

/// conv 32×8×8/4 → conv 64×4×4/2 → conv 64×3×3/1 → 512 → actions, ReLU between.
#[derive(Module, Debug)]
pub struct NatureCnn {
    c1: Conv2d,
    c2: Conv2d,
    c3: Conv2d,
    fc: Linear,
    out: Linear,
}

impl NatureCnn {
    /// A new network for `actions` actions.
    pub fn new(actions: usize, device: &Device) -> Self {
        Self {
            c1: Conv2dConfig::new([4, 32], [8, 8])
                .with_stride([4, 4])
                .init(device),
            c2: Conv2dConfig::new([32, 64], [4, 4])
                .with_stride([2, 2])
                .init(device),
            c3: Conv2dConfig::new([64, 64], [3, 3]).init(device),
            fc: LinearConfig::new(64 * 7 * 7, 512).init(device),
            out: LinearConfig::new(512, actions).init(device),
        }
    }

    /// Q-values `[batch, actions]` for frames `[batch, 4, 84, 84]` scaled to `[0, 1]`.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = relu(self.c1.forward(x));
        let x = relu(self.c2.forward(x));
        let x = relu(self.c3.forward(x));
        let x: Tensor<2> = x.flatten(1, 3);
        self.out.forward(relu(self.fc.forward(x)))
    }
}
