//! [`Actor`] and [`Critic`]: CleanRL's PPO networks (separate MLPs, orthogonal init), with
//! ReLU (DI-engine's default) or tanh (CleanRL's) hidden activations; [`ActorCritic`] puts
//! them behind an optional image trunk and an optional LSTM core.

use super::{Dense, Input, Lstm};
use burn::module::{Module, Param};
use burn::nn::{Initializer, LinearConfig};
use burn::tensor::activation::tanh;
use burn::tensor::{Device, Tensor, TensorData};
use drill_config::Activation;

fn mlp_forward(layers: &[Dense], use_tanh: bool, x: Tensor<2>) -> Tensor<2> {
    let last = layers.len() - 1;
    layers
        .iter()
        .enumerate()
        .fold(x, |x, (i, l)| match (i < last, use_tanh) {
            (false, _) => l.forward(x),
            (true, true) => tanh(l.forward(x)),
            (true, false) => l.forward_relu(x),
        })
}

/// Orthogonal weights (gain √2, the last layer `out_gain`) and zero biases, as CleanRL's
/// `layer_init`.
fn mlp(sizes: &[usize], out_gain: f64, device: &Device) -> Vec<Dense> {
    let n = sizes.len() - 1;
    sizes
        .windows(2)
        .enumerate()
        .map(|(i, w)| {
            let gain = if i + 1 == n { out_gain } else { 2f64.sqrt() };
            let mut layer = LinearConfig::new(w[0], w[1])
                .with_bias(false)
                .with_initializer(Initializer::Orthogonal { gain })
                .init(device);
            layer.bias = Some(Param::from_tensor(Tensor::zeros([w[1]], device)));
            Dense::from(layer)
        })
        .collect()
}

/// How the actor parameterises its distribution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorHead {
    /// Categorical over `n` actions: the MLP outputs logits.
    Categorical,
    /// Gaussian with a learned state-independent log-std.
    GaussianIndependent,
    /// Gaussian whose log-std is a second output of the MLP.
    GaussianConditioned,
}

/// The policy network: logits, or a Gaussian's mean and log-std.
#[derive(Module, Debug)]
pub struct Actor {
    layers: Vec<Dense>,
    /// State-independent log-std (`[act_dim]`); unused (size 0) otherwise.
    log_std: Param<Tensor<1>>,
    act_dim: usize,
    conditioned: bool,
    use_tanh: bool,
}

impl Actor {
    /// `obs → hidden… → out`, orthogonal init (gain √2, output 0.01, as CleanRL).
    pub fn new(
        obs_dim: usize,
        hidden: &[usize],
        act_dim: usize,
        head: ActorHead,
        activation: Activation,
        init_log_std: f64,
        device: &Device,
    ) -> Self {
        let conditioned = head == ActorHead::GaussianConditioned;
        let mut sizes = vec![obs_dim];
        sizes.extend_from_slice(hidden);
        sizes.push(if conditioned { 2 * act_dim } else { act_dim });
        let n_std = if head == ActorHead::GaussianIndependent {
            act_dim
        } else {
            0
        };
        let log_std =
            Param::from_tensor(Tensor::<1>::ones([n_std], device).mul_scalar(init_log_std));
        Self {
            layers: mlp(&sizes, 0.01, device),
            log_std,
            act_dim,
            conditioned,
            use_tanh: activation == Activation::Tanh,
        }
    }

    /// Categorical logits `[batch, n]`.
    pub fn logits(&self, obs: Tensor<2>) -> Tensor<2> {
        mlp_forward(&self.layers, self.use_tanh, obs)
    }

    /// Gaussian mean and log-std, both `[batch, act_dim]`.
    pub(crate) fn gaussian(&self, obs: Tensor<2>) -> (Tensor<2>, Tensor<2>) {
        let out = mlp_forward(&self.layers, self.use_tanh, obs);
        let batch = out.dims()[0];
        if self.conditioned {
            let mean = out.clone().narrow(1, 0, self.act_dim);
            let log_std = out.narrow(1, self.act_dim, self.act_dim).clamp(-20.0, 2.0);
            (mean, log_std)
        } else {
            let log_std = self
                .log_std
                .val()
                .unsqueeze_dim::<2>(0)
                .expand([batch, self.act_dim]);
            (out, log_std)
        }
    }
}

/// Actor and critic trained together by one optimizer (as CleanRL's `Agent`); for frames,
/// both read the features of one shared convolutional trunk (CleanRL's `ppo_atari`); with an
/// LSTM core, both read its output (CleanRL's `ppo_atari_lstm`).
#[derive(Module, Debug)]
pub struct ActorCritic {
    /// The shared image trunk (frames only).
    pub trunk: Option<super::ConvEncoder>,
    /// The recurrent core between the trunk (or the observations) and the heads.
    pub lstm: Option<Lstm>,
    /// The policy.
    pub actor: Actor,
    /// The value function.
    pub critic: Critic,
}

impl ActorCritic {
    /// The trunk's features, or the observations (what the LSTM core or the heads read).
    pub fn features(&self, obs: Input) -> Tensor<2> {
        match &self.trunk {
            Some(t) => t.forward(obs),
            None => obs.float(),
        }
    }

    /// Floats per row of the recurrent state (0: feed-forward).
    pub fn state_width(&self) -> usize {
        self.lstm.as_ref().map_or(0, Lstm::state_width)
    }

    /// What the actor and the critic read for one step of a batch: the features, through
    /// the LSTM core from `state` (`[rows, state_width]` row-major, overwritten with the
    /// next state) when there is one.
    pub(crate) fn step(&self, obs: Input, state: &mut [f32]) -> Tensor<2> {
        let x = self.features(obs);
        let Some(lstm) = &self.lstm else {
            return x;
        };
        let (n, w) = (x.dims()[0], lstm.state_width());
        let t = Tensor::from_data(TensorData::new(state.to_vec(), [n, w]), &x.device());
        let (out, t) = lstm.step(x, t);
        state.copy_from_slice(t.into_data().as_slice::<f32>().expect("f32 state"));
        out
    }

    /// What the actor and the critic read for `steps` steps of `state0.dims()[0]` sequences
    /// (rows time-major, [`Lstm::sequence`]): the features through the LSTM core from
    /// `state0`, or the features alone.
    pub(crate) fn sequence(
        &self,
        obs: Input,
        state0: Tensor<2>,
        ended: &[bool],
        steps: usize,
    ) -> Tensor<2> {
        let x = self.features(obs);
        match &self.lstm {
            Some(lstm) => lstm.sequence(x, state0, ended, steps),
            None => x,
        }
    }
}

/// The value network `obs → hidden… → 1`.
#[derive(Module, Debug)]
pub struct Critic {
    layers: Vec<Dense>,
    use_tanh: bool,
}

impl Critic {
    /// Orthogonal init (gain √2, output 1.0, as CleanRL).
    pub fn new(obs_dim: usize, hidden: &[usize], activation: Activation, device: &Device) -> Self {
        let mut sizes = vec![obs_dim];
        sizes.extend_from_slice(hidden);
        sizes.push(1);
        Self {
            layers: mlp(&sizes, 1.0, device),
            use_tanh: activation == Activation::Tanh,
        }
    }

    /// Values `[batch]`.
    pub fn forward(&self, obs: Tensor<2>) -> Tensor<1> {
        mlp_forward(&self.layers, self.use_tanh, obs).squeeze_dim::<1>(1)
    }
}
