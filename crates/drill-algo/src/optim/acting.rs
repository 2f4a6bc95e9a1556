//! [`ActingCopy`]: the copy of a trained model that a policy's collect and eval sides act
//! with.

use super::{ParamLayout, Trainer};
use burn::module::Module;

/// A model without gradient tracking, refreshed from its [`Trainer`] lazily (only when acted
/// with after an update, so a round of updates costs one copy), or overwritten with weights
/// that came from another process.
pub(crate) struct ActingCopy<M> {
    model: M,
    stale: bool,
}

impl<M: Module + Clone> ActingCopy<M> {
    /// A copy of `trainer`'s model as it is now.
    pub(crate) fn new(trainer: &Trainer<M>) -> Self {
        Self {
            model: trainer.inference(),
            stale: false,
        }
    }

    /// The trainer changed (an update, a load, a broadcast): refresh before acting next.
    pub(crate) fn invalidate(&mut self) {
        self.stale = true;
    }

    /// The model to act with, refreshed from `trainer` if it changed since.
    pub(crate) fn get(&mut self, trainer: &Trainer<M>) -> &M {
        if self.stale {
            self.model = trainer.inference();
            self.stale = false;
        }
        &self.model
    }

    /// Act with `weights` (flat, in `layout`) from now on.
    pub(crate) fn load(&mut self, layout: &ParamLayout, weights: &[f32]) {
        self.model = layout.write(self.model.clone(), weights);
        self.stale = false;
    }
}
