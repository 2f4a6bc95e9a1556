//! [`Trainer`]: a model with its flat parameters and Adam state.

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
        for r in 0..self.reads.len() {
            let slots = self.reads[r].clone();
            self.read_grads(slots.clone(), &mut grads, add);
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
    }

    /// The gradients of parameters `slots` into [`Self::grads`] (added when `add`): one
    /// transfer on a GPU, each parameter's buffer handed over on the CPU.
    fn read_grads(&mut self, slots: Range<usize>, grads: &mut GradientsParams, add: bool) {
        let out = &mut self.grads;
        match &self.gpu {
            Some(device) => self.layout.read_grads_fused(slots, grads, out, add, device),
            None => slots
                .rev()
                .for_each(|i| self.layout.read_grad(i, grads, out, add)),
        }
    }

    /// Clip [`Self::grads`] to `max_norm` (0: off), take an Adam step at `lr` and write the new
    /// parameters into the model. When distributed, every `check_every` steps the parameters
    /// are checked to be bit-identical across ranks.
    pub fn step(&mut self, lr: f64, max_norm: f64) -> Result<StepStats, TrainError> {
        let norm = l2_norm(&self.grads);
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

/// The L2 norm of `v`, summed in 16 lanes so that it vectorises (a single running sum is a
/// chain of dependent adds the compiler may not reorder).
fn l2_norm(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = v.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().map(|g| g * g).sum();
    for c in chunks {
        for (s, g) in lanes.iter_mut().zip(c) {
            *s += g * g;
        }
    }
    (lanes.iter().sum::<f32>() + rest).sqrt()
}
