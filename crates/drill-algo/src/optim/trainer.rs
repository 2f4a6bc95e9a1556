//! [`Trainer`]: a model with its flat parameters and Adam state.

use super::{Adam, ParamLayout};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;

/// What one optimisation step measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepStats {
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f32,
}

/// A model trained with Adam on flat buffers (see the module docs of [`crate::optim`]).
pub struct Trainer<M> {
    model: Option<M>,
    /// Parameter layout in visit order.
    pub layout: ParamLayout,
    /// Current parameters, flat.
    pub params: Vec<f32>,
    /// Gradients of the last backward pass, flat.
    pub grads: Vec<f32>,
    /// Optimiser state.
    pub adam: Adam,
}

impl<M: Module> Trainer<M> {
    /// Take over `model` (on an autodiff device) with a fresh Adam state.
    pub fn new(model: M, adam_eps: f32) -> Self {
        let (layout, params) = ParamLayout::with_values(&model);
        let n = layout.len;
        Self {
            model: Some(model),
            layout,
            params,
            grads: vec![0.0; n],
            adam: Adam::new(n, adam_eps),
        }
    }

    /// The model (autodiff), for forward passes that build a loss.
    pub fn model(&self) -> &M {
        self.model.as_ref().expect("model present between steps")
    }

    /// A copy without gradient tracking, for acting and targets.
    pub fn inference(&self) -> M {
        self.model().valid()
    }

    /// Backward `loss` and copy the gradients into [`Self::grads`].
    pub fn backward(&mut self, loss: Tensor<1>) {
        let mut grads = GradientsParams::from_grads(loss.backward(), self.model());
        self.layout.read_grads(&mut grads, &mut self.grads);
    }

    /// Clip [`Self::grads`] to `max_norm` (0: off), take an Adam step at `lr` and write the new
    /// parameters into the model.
    pub fn step(&mut self, lr: f64, max_norm: f64) -> StepStats {
        let norm = self.grads.iter().map(|g| g * g).sum::<f32>().sqrt();
        if max_norm > 0.0 && norm > max_norm as f32 {
            let scale = max_norm as f32 / (norm + 1e-6);
            self.grads.iter_mut().for_each(|g| *g *= scale);
        }
        self.adam.step(&mut self.params, &self.grads, lr as f32);
        self.sync_model();
        StepStats { grad_norm: norm }
    }

    /// Write [`Self::params`] into the model (after loading or broadcasting parameters).
    pub fn sync_model(&mut self) {
        let model = self.model.take().expect("model present");
        self.model = Some(self.layout.write(model, &self.params));
    }
}
