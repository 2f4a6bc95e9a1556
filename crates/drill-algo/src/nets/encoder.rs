//! [`ConvEncoder`]: convolutions over stacked frames, flattened, then one linear layer to a
//! feature vector. Two layouts:
//! - [`ConvEncoder::ding`]: DI-engine's `ConvEncoder` (`ding/model/common/encoder.py`) as its
//!   DQN builds it from `encoder_hidden_size_list`: convs 8x8/4, 4x4/2, 3x3/1 with the first
//!   three sizes as channels, ReLU after each, then `Linear(flat, last size)` with no
//!   activation (its dueling head follows);
//! - [`ConvEncoder::nature`]: the Nature-DQN / CleanRL `ppo_atari` trunk: convs 32, 64, 64
//!   (same kernels), then `Linear(flat, 512)` and ReLU.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};

const KERNELS: [usize; 3] = [8, 4, 3];
const STRIDES: [usize; 3] = [4, 2, 1];

/// Convolutions, flatten, linear (see the module docs).
#[derive(Module, Debug)]
pub struct ConvEncoder {
    convs: Vec<Conv2d>,
    mid: Linear,
    channels: usize,
    height: usize,
    width: usize,
    mid_relu: bool,
}

/// Spatial size after the three convolutions (no padding).
fn out_side(mut side: usize) -> Option<usize> {
    for (k, s) in KERNELS.iter().zip(STRIDES) {
        side = side.checked_sub(*k)? / s + 1;
    }
    Some(side)
}

impl ConvEncoder {
    /// DI-engine's encoder for `shape` = `[channels, height, width]` and `hidden` (at least
    /// three sizes; a fourth and later would be DI-engine's residual blocks, which drill does
    /// not build). PyTorch's default initialisation.
    pub fn ding(shape: [usize; 3], hidden: &[usize], device: &Device) -> Result<Self, String> {
        if hidden.len() != 3 {
            return Err(format!(
                "a convolutional encoder takes 3 sizes (channels of the 3 convolutions, the last also the feature size), got {hidden:?}"
            ));
        }
        Self::build(
            shape,
            [hidden[0], hidden[1], hidden[2]],
            hidden[2],
            false,
            None,
            device,
        )
    }

    /// The Nature-DQN trunk (features 512, ReLU), with CleanRL's orthogonal init (gain √2,
    /// zero biases) when `orthogonal`.
    pub fn nature(shape: [usize; 3], orthogonal: bool, device: &Device) -> Result<Self, String> {
        let init = orthogonal.then_some(Initializer::Orthogonal { gain: 2f64.sqrt() });
        Self::build(shape, [32, 64, 64], 512, true, init, device)
    }

    fn build(
        shape: [usize; 3],
        channels: [usize; 3],
        features: usize,
        mid_relu: bool,
        init: Option<Initializer>,
        device: &Device,
    ) -> Result<Self, String> {
        let [c, h, w] = shape;
        let (Some(oh), Some(ow)) = (out_side(h), out_side(w)) else {
            return Err(format!(
                "frames of {h}x{w} are too small for 8x8/4, 4x4/2, 3x3/1 convolutions (at least 36x36)"
            ));
        };
        let mut input = c;
        let convs = channels
            .iter()
            .zip(KERNELS.iter().zip(STRIDES))
            .map(|(&out, (&k, s))| {
                let mut cfg = Conv2dConfig::new([input, out], [k, k]).with_stride([s, s]);
                if let Some(i) = &init {
                    cfg = cfg.with_initializer(i.clone()).with_bias(false);
                }
                input = out;
                let mut conv = cfg.init(device);
                if init.is_some() {
                    conv.bias = Some(Param::from_tensor(Tensor::zeros([out], device)));
                }
                conv
            })
            .collect();
        let flat = channels[2] * oh * ow;
        let mut mid = LinearConfig::new(flat, features);
        if let Some(i) = &init {
            mid = mid.with_initializer(i.clone()).with_bias(false);
        }
        let mut mid = mid.init(device);
        if init.is_some() {
            mid.bias = Some(Param::from_tensor(Tensor::zeros([features], device)));
        }
        Ok(Self {
            convs,
            mid,
            channels: c,
            height: h,
            width: w,
            mid_relu,
        })
    }

    /// Features `[batch, out]` for flat frames `[batch, c*h*w]` scaled to `[0, 1]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let batch = x.dims()[0];
        let mut x: Tensor<4> = x.reshape([batch, self.channels, self.height, self.width]);
        for conv in &self.convs {
            x = relu(conv.forward(x));
        }
        let y = self.mid.forward(x.flatten(1, 3));
        if self.mid_relu { relu(y) } else { y }
    }

    /// Size of the feature vector.
    pub fn features(&self) -> usize {
        self.mid.weight.dims()[1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dings_pong_encoder_has_its_parameter_count_and_shapes() {
        let device = Device::default();
        let e = ConvEncoder::ding([4, 84, 84], &[128, 128, 512], &device).unwrap();
        // conv 4->128 8x8, 128->128 4x4, 128->512 3x3, Linear(512*7*7, 512).
        let want = (4 * 128 * 64 + 128)
            + (128 * 128 * 16 + 128)
            + (128 * 512 * 9 + 512)
            + (512 * 7 * 7 * 512 + 512);
        assert_eq!(e.num_params(), want);
        let y = e.forward(Tensor::zeros([2, 4 * 84 * 84], &device));
        assert_eq!(y.dims(), [2, 512]);
        let n = ConvEncoder::nature([4, 84, 84], true, &device).unwrap();
        assert_eq!(
            n.num_params(),
            (4 * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64) + (3136 * 512 + 512)
        );
        assert!(ConvEncoder::ding([4, 20, 20], &[8, 8, 8], &device).is_err());
        assert!(ConvEncoder::ding([4, 84, 84], &[8, 8, 8, 8], &device).is_err());
    }
}
