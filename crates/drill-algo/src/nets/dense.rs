//! [`Dense`]: a fully connected layer running [`crate::compute::linear`].

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::Tensor;

/// Weight `[in, out]` and bias `[out]`: burn's `Linear` layout and parameter order, so
/// checkpoints keep their layout. Build one from a `LinearConfig`'s layer (its initialiser).
#[derive(Module, Debug)]
pub(crate) struct Dense {
    /// `[in, out]`.
    pub weight: Param<Tensor<2>>,
    /// `[out]`.
    pub bias: Param<Tensor<1>>,
}

impl From<Linear> for Dense {
    fn from(l: Linear) -> Self {
        #[cfg(test)]
        super::tests::note_layer_built();
        Self {
            weight: l.weight,
            bias: l.bias.expect("LinearConfig has a bias by default"),
        }
    }
}

impl Dense {
    /// `x W + b` for `x` `[n, in]`.
    pub(crate) fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        crate::compute::linear(x, self.weight.val(), self.bias.val(), false)
    }

    /// `relu(x W + b)`, as one operation.
    pub(crate) fn forward_relu(&self, x: Tensor<2>) -> Tensor<2> {
        crate::compute::linear(x, self.weight.val(), self.bias.val(), true)
    }

    /// Output features.
    pub(crate) fn d_out(&self) -> usize {
        self.weight.dims()[1]
    }
}
