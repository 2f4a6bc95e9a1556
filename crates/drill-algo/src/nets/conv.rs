//! [`Conv`]: a 2-D convolution layer (bias, no padding) running [`crate::compute::conv2d`].

use burn::module::{Module, Param};
use burn::nn::conv::Conv2dConfig;
use burn::tensor::{Device, Int, Tensor};

/// Weight `[c_out, c_in, k, k]` and bias `[c_out]`, applied at a stride; parameters in
/// burn's `Conv2d` order (weight, bias), so checkpoints keep their layout.
#[derive(Module, Debug)]
pub(crate) struct Conv {
    /// Kernel `[c_out, c_in, k, k]`.
    pub weight: Param<Tensor<4>>,
    /// Bias `[c_out]`.
    pub bias: Param<Tensor<1>>,
    stride: [usize; 2],
}

impl Conv {
    /// `c_in → c_out` channels, a `kernel x kernel` kernel at `stride`, with PyTorch's default
    /// initialisation (burn's `Conv2dConfig`'s draws).
    pub(crate) fn new(
        c_in: usize,
        c_out: usize,
        kernel: usize,
        stride: usize,
        device: &Device,
    ) -> Self {
        #[cfg(test)]
        super::tests::note_layer_built();
        let conv = Conv2dConfig::new([c_in, c_out], [kernel, kernel])
            .with_stride([stride, stride])
            .init(device);
        Self {
            weight: conv.weight,
            bias: conv.bias.expect("Conv2dConfig has a bias by default"),
            stride: [stride, stride],
        }
    }

    /// `relu(conv(x / 255))`, `[batch, c_out, oh, ow]`, for `u8` frames `x` (a first layer), as one operation
    /// ([`crate::compute::conv2d_frames`]).
    pub(crate) fn forward_frames_relu(&self, x: Tensor<4, Int>) -> Tensor<4> {
        crate::compute::conv2d_frames(x, self.weight.val(), self.bias.val(), self.stride, true)
    }

    /// `relu(conv(x))`, `[batch, c_out, oh, ow]` for `x` `[batch, c_in, h, w]`, as one
    /// operation.
    pub(crate) fn forward_relu(&self, x: Tensor<4>) -> Tensor<4> {
        crate::compute::conv2d(x, self.weight.val(), self.bias.val(), self.stride, true)
    }
}
