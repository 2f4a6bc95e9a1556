//! [`Trainer`]: a model with its flat parameters and Adam state.

use super::layout::squares;
use super::{Adam, DdpOptions, GradSync, ParamLayout};
use crate::error::TrainError;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use std::ops::Range;

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
    layout: ParamLayout,
    /// Current parameters, flat; the model holds the same values (written only through
    /// [`Self::step`] and [`Self::restore`], which install them).
    params: Vec<f32>,
    /// Gradients of the last backward pass, flat.
    grads: Vec<f32>,
    /// Optimiser state.
    adam: Adam,
    /// Gradient averaging across ranks (DDP), when distributed.
    sync: Option<GradSync>,
    /// `grads` holds gradients accumulated by [`Self::backward_no_sync`].
    accumulated: bool,
    /// The L2 norm of `grads`, where [`Self::backward`] computed it while reading them (on
    /// the CPU, not distributed); [`Self::step`] computes it otherwise.
    norm: Option<f32>,
    /// The model's device when it is not the CPU: gradients then cross in one transfer per
    /// bucket ([`ParamLayout::read_grads_fused`]).
    gpu: Option<Device>,
    /// What [`Self::backward`] reads back in one transfer each, in order (slot indices): the
    /// DDP buckets, or every parameter at once.
    reads: Vec<Range<usize>>,
}

impl<M: Module> Trainer<M> {
    /// Take over `model` (on an autodiff device) with a fresh Adam state.
    pub fn new(model: M, adam_eps: f32) -> Self {
        let (layout, params) = ParamLayout::with_values(&model);
        let n = layout.len;
        let gpu = model.devices().into_iter().find(|d| *d != Device::flex());
        let reads = std::iter::once(0..layout.slots.len()).collect();
        Self {
            model: Some(model),
            layout,
            params,
            grads: vec![0.0; n],
            adam: Adam::new(n, adam_eps),
            sync: None,
            accumulated: false,
            norm: None,
            gpu,
            reads,
        }
    }

    /// Train data-parallel on `pg` (world size 1: nothing changes): rank 0's parameters are
    /// broadcast to every rank, and every [`Self::backward`] averages gradients across ranks.
    pub fn distribute(
        &mut self,
        pg: drill_comm::ProcessGroup,
        opts: DdpOptions,
    ) -> Result<(), TrainError> {
        if pg.world_size() == 1 {
            return Ok(());
        }
        let sync = GradSync::new(pg, &self.layout, opts);
        sync.broadcast_params(&mut self.params)?;
        self.reads = sync.bucket_slots().collect();
        self.sync_model();
        self.sync = Some(sync);
        Ok(())
    }

    /// The model (autodiff), for forward passes that build a loss.
    pub fn model(&self) -> &M {
        self.model.as_ref().expect("model present between steps")
    }

    /// A copy without gradient tracking, for acting and targets.
    pub fn inference(&self) -> M {
        self.model().valid()
    }

    /// Backward `loss` into [`Self::grads`] (added to what [`Self::backward_no_sync`]
    /// accumulated) and, when distributed, average them across ranks: each bucket's
    /// all-reduce starts as soon as its gradients are packed.
    pub fn backward(&mut self, loss: Tensor<1>) -> Result<(), TrainError> {
        let mut grads = GradientsParams::from_grads(loss.backward(), self.model());
        let add = std::mem::take(&mut self.accumulated);
        let mut sum = Some(0.0);
        for r in 0..self.reads.len() {
            let slots = self.reads[r].clone();
            let squares = self.read_grads(slots.clone(), &mut grads, add);
            sum = sum.zip(squares).map(|(a, b)| a + b);
            if let Some(sync) = &mut self.sync {
                for i in slots.rev() {
                    if let Err(e) = sync.slot_ready(i, &mut self.grads) {
                        // Collect the buckets already in flight before reporting.
                        let _ = sync.finish(&mut self.grads);
                        return Err(e);
                    }
                }
            }
        }
        // Averaged across ranks, the gradients are no longer those read.
        self.norm = sum.filter(|_| self.sync.is_none()).map(f32::sqrt);
        match &mut self.sync {
            Some(sync) => sync.finish(&mut self.grads),
            None => Ok(()),
        }
    }

    /// Backward `loss` and add its gradients locally, without communicating (torch's
    /// `no_sync`, for gradient accumulation); the next [`Self::backward`] adds its own and
    /// averages the sum across ranks.
    pub fn backward_no_sync(&mut self, loss: Tensor<1>) {
        let mut grads = GradientsParams::from_grads(loss.backward(), self.model());
        let add = std::mem::replace(&mut self.accumulated, true);
        self.read_grads(0..self.layout.slots.len(), &mut grads, add);
        self.norm = None;
    }

    /// The gradients of parameters `slots` into [`Self::grads`] (added when `add`): one
    /// transfer on a GPU, each parameter's buffer handed over on the CPU. On the CPU, returns
    /// the sum of the squares of the slots' values after it.
    fn read_grads(
        &mut self,
        slots: Range<usize>,
        grads: &mut GradientsParams,
        add: bool,
    ) -> Option<f32> {
        let out = &mut self.grads;
        match &self.gpu {
            Some(device) => {
                self.layout.read_grads_fused(slots, grads, out, add, device);
                None
            }
            None => Some(
                slots
                    .rev()
                    .map(|i| self.layout.read_grad(i, grads, out, add))
                    .sum(),
            ),
        }
    }

    /// Clip [`Self::grads`] to `max_norm` (0: off), take an Adam step at `lr` and write the new
    /// parameters into the model. When distributed, every `check_every` steps the parameters
    /// are checked to be bit-identical across ranks.
    pub fn step(&mut self, lr: f64, max_norm: f64) -> Result<StepStats, TrainError> {
        let norm = match self.norm.take() {
            Some(norm) => norm,
            None => squares(&self.grads).sqrt(),
        };
        if max_norm > 0.0 && norm > max_norm as f32 {
            let scale = max_norm as f32 / (norm + 1e-6);
            self.grads.iter_mut().for_each(|g| *g *= scale);
        }
        let fresh = self
            .adam
            .step_copy(&mut self.params, &self.grads, lr as f32);
        self.install(fresh);
        if let Some(sync) = &mut self.sync {
            sync.after_step(&self.params)?;
        }
        Ok(StepStats { grad_norm: norm })
    }

    /// Parameter layout in visit order.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// Current parameters, flat (the model's values).
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// Gradients of the last backward pass, flat.
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// The gradients to fill in place of a backward pass (e.g. [`crate::ddp::DataParallel`]
    /// combining its devices' shares); [`Self::step`] applies them.
    pub fn grads_mut(&mut self) -> &mut [f32] {
        self.norm = None;
        &mut self.grads
    }

    /// Optimiser state.
    pub fn adam(&self) -> &Adam {
        &self.adam
    }

    /// Gradient averaging across ranks, once [`Self::distribute`] has run.
    pub fn sync(&self) -> Option<&GradSync> {
        self.sync.as_ref()
    }

    /// Replace the parameters and the optimiser state (a checkpoint's), and install the
    /// parameters in the model.
    pub fn restore(&mut self, params: Vec<f32>, adam: Adam) {
        assert_eq!(params.len(), self.params.len(), "restore: parameter count");
        self.params = params;
        self.adam = adam;
        self.sync_model();
    }

    /// Write [`Self::params`] into the model (after [`Self::restore`] or the broadcast in
    /// [`Self::distribute`]; [`Self::step`] installs its own).
    fn sync_model(&mut self) {
        self.install(self.params.clone());
    }

    /// Make `values` (a copy of [`Self::params`]) the model's parameter storage.
    fn install(&mut self, values: Vec<f32>) {
        let model = self.model.take().expect("model present");
        self.model = Some(self.layout.write_owned(model, values));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nets::QNet;
    use burn::tensor::TensorData;

    fn loss(t: &Trainer<QNet>, k: usize) -> Tensor<1> {
        let ad = Device::flex().autodiff();
        let values: Vec<f32> = (0..8 * 4)
            .map(|i| ((i + 7 * k) as f32 * 0.3).sin())
            .collect();
        let x = Tensor::<2>::from_data(TensorData::new(values, [8, 4]), &ad);
        let q = t.model().forward(x);
        (q.clone() * q).mean()
    }

    fn norm_of(v: &[f32]) -> f32 {
        v.iter().map(|g| f64::from(*g).powi(2)).sum::<f64>().sqrt() as f32
    }

    /// The norm a step reports is that of the gradients it applies: read with them in
    /// `backward`, after an accumulation, and after the gradients were changed in place.
    #[test]
    fn the_step_norm_is_the_norm_of_the_gradients() {
        let device = Device::flex();
        device.seed(5);
        let mut t = Trainer::new(QNet::new(4, &[16], 2, false, &device.autodiff()), 1e-8);
        let close = |got: f32, want: f32, what: &str| {
            assert!((got - want).abs() <= 1e-5 * want, "{what}: {got} vs {want}");
        };
        t.backward(loss(&t, 0)).expect("one process");
        let want = norm_of(t.grads());
        assert!(want > 0.0);
        close(
            t.step(1e-3, 0.0).expect("one process").grad_norm,
            want,
            "read",
        );
        t.backward_no_sync(loss(&t, 1));
        t.backward(loss(&t, 2)).expect("one process");
        let want = norm_of(t.grads());
        close(
            t.step(1e-3, 0.0).expect("one process").grad_norm,
            want,
            "accumulated",
        );
        t.backward(loss(&t, 3)).expect("one process");
        t.grads_mut().iter_mut().for_each(|g| *g *= 3.0);
        let want = norm_of(t.grads());
        close(
            t.step(1e-3, 0.0).expect("one process").grad_norm,
            want,
            "changed",
        );
    }
}
