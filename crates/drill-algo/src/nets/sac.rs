//! SAC's networks (CleanRL's `sac_continuous_action`, DI-engine's `QAC` with
//! `reparameterization`): [`SquashedGaussian`] (the actor) and [`TwinQ`] (two critics).

use super::Dense;
use burn::module::Module;
use burn::nn::LinearConfig;
use burn::tensor::activation::tanh;
use burn::tensor::{Device, Tensor};

/// Bounds of the actor's log standard deviation (CleanRL's).
const LOG_STD_MIN: f64 = -5.0;
const LOG_STD_MAX: f64 = 2.0;

/// The layers with ReLU between them, and after the last one too when `relu_out`.
fn mlp(layers: &[Dense], x: Tensor<2>, relu_out: bool) -> Tensor<2> {
    let last = layers.len() - 1;
    layers.iter().enumerate().fold(x, |x, (i, l)| {
        if i < last || relu_out {
            l.forward_relu(x)
        } else {
            l.forward(x)
        }
    })
}

fn linears(sizes: &[usize], device: &Device) -> Vec<Dense> {
    let init = LinearConfig::new(1, 1).initializer;
    super::linears(sizes, &init, device)
}

/// The actor `obs → h → h → (mean, log_std)`; actions are `tanh(mean + std * noise)`
/// scaled to the action box (by the algorithm). PyTorch's default initialisation.
#[derive(Module, Debug)]
pub(crate) struct SquashedGaussian {
    trunk: Vec<Dense>,
    mean: Dense,
    log_std: Dense,
}

impl SquashedGaussian {
    /// Hidden width `hidden`, `act_dim` action dimensions.
    pub(crate) fn new(obs_dim: usize, hidden: usize, act_dim: usize, device: &Device) -> Self {
        Self {
            trunk: linears(&[obs_dim, hidden, hidden], device),
            mean: LinearConfig::new(hidden, act_dim).init(device).into(),
            log_std: LinearConfig::new(hidden, act_dim).init(device).into(),
        }
    }

    /// Mean and log standard deviation (squashed into `[-5, 2]`), both `[batch, act_dim]`.
    pub(crate) fn forward(&self, obs: Tensor<2>) -> (Tensor<2>, Tensor<2>) {
        let h = mlp(&self.trunk, obs, true);
        let log_std = tanh(self.log_std.forward(h.clone()));
        let log_std = log_std
            .add_scalar(1.0)
            .mul_scalar(0.5 * (LOG_STD_MAX - LOG_STD_MIN))
            .add_scalar(LOG_STD_MIN);
        (self.mean.forward(h), log_std)
    }
}

/// Two independent critics `(obs, action) → h → h → 1`, trained by one optimizer.
#[derive(Module, Debug)]
pub(crate) struct TwinQ {
    q1: Vec<Dense>,
    q2: Vec<Dense>,
}

impl TwinQ {
    /// Hidden width `hidden`.
    pub(crate) fn new(obs_dim: usize, act_dim: usize, hidden: usize, device: &Device) -> Self {
        let sizes = [obs_dim + act_dim, hidden, hidden, 1];
        Self {
            q1: linears(&sizes, device),
            q2: linears(&sizes, device),
        }
    }

    /// Both critics' values `[batch]` of `actions` in `obs`.
    pub(crate) fn forward(&self, obs: Tensor<2>, actions: Tensor<2>) -> (Tensor<1>, Tensor<1>) {
        let x = Tensor::cat(vec![obs, actions], 1);
        (
            mlp(&self.q1, x.clone(), false).squeeze_dim::<1>(1),
            mlp(&self.q2, x, false).squeeze_dim::<1>(1),
        )
    }
}
