//! [`Trainer`]: a model with its flat parameters and Adam state.

use super::overlap::Pass;
use super::{Adam, DdpOptions, GradSync, ParamLayout};
use crate::error::TrainError;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};
use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;

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
    /// The last backward pass's gradients where autodiff left them, not yet in `grads` (on
    /// the CPU, not distributed): [`Self::step`] reads them there, and [`Self::grads`] copies
    /// them over first.
    pending: Option<Pending>,
    /// The model's device when it is not the CPU: gradients then cross in one transfer per
    /// bucket ([`ParamLayout::read_grads_fused`]).
    gpu: Option<Device>,
    /// What [`Self::backward`] reads back in one transfer each, in order (slot indices): the
    /// DDP buckets, or every parameter at once.
    reads: Vec<Range<usize>>,
    /// Distributed on the CPU with [`DdpOptions::overlap`]: the slots whose bucket may start
    /// during the backward pass, once the first pass learned them (`super::overlap`).
    early: Option<Vec<bool>>,
}

/// Gradients as a backward pass left them ([`Trainer::backward`] on the CPU): one per slot,
/// none where a parameter got none. Adam reads them where they are: a flat copy would write
/// the whole gradient once more (6.7 MB for the Nature CNN) only to read it again.
struct Pending {
    parts: Vec<Option<TensorData>>,
    /// The clipping factor the step applied to them.
    scale: f32,
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
            pending: None,
            gpu,
            reads,
            early: None,
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
    /// all-reduce starts as soon as its gradients are packed. On the CPU, not distributed and
    /// with nothing accumulated, the gradients stay where the backward pass left them
    /// until [`Self::step`] or [`Self::grads`] reads them.
    pub fn backward(&mut self, loss: Tensor<1>) -> Result<(), TrainError> {
        let add = std::mem::take(&mut self.accumulated);
        self.pending = None;
        if !add && self.gpu.is_none() && self.sync.as_ref().is_some_and(GradSync::overlaps) {
            return self.backward_overlapped(loss);
        }
        let mut grads = GradientsParams::from_grads(loss.backward(), self.model());
        if !add && self.sync.is_none() && self.gpu.is_none() {
            self.pending = Some(Pending {
                parts: self.layout.take_grads(&mut grads),
                scale: 1.0,
            });
            return Ok(());
        }
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

    /// [`Self::backward`] distributed on the CPU, each bucket's all-reduce started during the
    /// backward pass once its gradients are written (`super::overlap`); the first pass learns
    /// which parameters may start a bucket early and starts none.
    fn backward_overlapped(&mut self, loss: Tensor<1>) -> Result<(), TrainError> {
        let sync = self.sync.take().expect("distributed");
        let ranges = (self.layout.slots.iter())
            .map(|s| s.offset..s.offset + s.len)
            .collect();
        let grads = std::mem::take(&mut self.grads);
        let pass = Rc::new(RefCell::new(Pass::new(
            sync,
            grads,
            ranges,
            self.early.clone(),
        )));
        crate::compute::sink_begin(pass.clone());
        crate::compute::tag_params(self.model());
        let backward = loss.backward();
        crate::compute::sink_end();
        let pass = Rc::try_unwrap(pass)
            .ok()
            .expect("the sink is released")
            .into_inner();
        let mut grads = GradientsParams::from_grads(backward, self.model());
        let mut sync = pass.sync;
        self.grads = pass.grads;
        let mut result = match pass.error {
            Some(e) => Err(e),
            None => self.after_overlapped(&mut sync, &mut grads, &pass.writes, &pass.done),
        };
        // Collect the buckets already in flight, also before reporting an error.
        let finished = sync.finish(&mut self.grads);
        result = result.and(finished);
        self.sync = Some(sync);
        result
    }

    /// The rest of [`Self::backward_overlapped`]: on the first pass, learn which slots may
    /// start their bucket early; then start every bucket the pass left (its slots read from
    /// `grads`, in the order [`Self::backward`] reads them).
    fn after_overlapped(
        &mut self,
        sync: &mut GradSync,
        grads: &mut GradientsParams,
        writes: &[u32],
        done: &[bool],
    ) -> Result<(), TrainError> {
        let learning = self.early.is_none();
        if learning {
            // A slot may start its bucket early when drill's layers wrote its whole gradient
            // once (what they wrote is what the pass ends with), on every rank alike.
            let written = self.grads.clone();
            self.read_grads(0..self.layout.slots.len(), grads, false);
            let mut flags: Vec<f32> = (self.layout.slots.iter().enumerate())
                .map(|(i, s)| {
                    let r = s.offset..s.offset + s.len;
                    let same = (written[r.clone()].iter().zip(&self.grads[r]))
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    f32::from(u8::from(writes[i] == 1 && same))
                })
                .collect();
            sync.group()
                .all_reduce(&mut flags, drill_comm::ReduceOp::Min)?;
            self.early = Some(flags.iter().map(|&f| f == 1.0).collect());
        }
        for r in 0..self.reads.len() {
            for i in self.reads[r].clone().rev().filter(|&i| !done[i]) {
                if !learning {
                    self.layout.read_grad(i, grads, &mut self.grads, false);
                }
                sync.slot_ready(i, &mut self.grads)?;
            }
        }
        Ok(())
    }

    /// Backward `loss` and add its gradients locally, without communicating (torch's
    /// `no_sync`, for gradient accumulation); the next [`Self::backward`] adds its own and
    /// averages the sum across ranks.
    pub fn backward_no_sync(&mut self, loss: Tensor<1>) {
        let mut grads = GradientsParams::from_grads(loss.backward(), self.model());
        let add = std::mem::replace(&mut self.accumulated, true);
        self.pending = None;
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
        if let Some(pending) = &mut self.pending {
            let parts: Vec<(Range<usize>, Option<&[f32]>)> = (self.layout.slots.iter())
                .zip(&pending.parts)
                .map(|(slot, part)| {
                    let g = part
                        .as_ref()
                        .map(|d| d.as_slice::<f32>().expect("f32 gradient"));
                    (slot.offset..slot.offset + slot.len, g)
                })
                .collect();
            // Clipping needs the norm before the step; otherwise the step's pass sums it.
            let clip_norm = (max_norm > 0.0).then(|| {
                (parts.iter())
                    .map(|(_, g)| g.map_or(0.0, squares))
                    .sum::<f32>()
                    .sqrt()
            });
            let scale = clip_norm.map_or(1.0, |norm| clip_scale(norm, max_norm));
            let (fresh, sum) =
                self.adam
                    .step_copy_parts(&mut self.params, &parts, scale, lr as f32);
            pending.scale = scale;
            self.install(fresh);
            let grad_norm = clip_norm.unwrap_or(sum.sqrt());
            return Ok(StepStats { grad_norm });
        }
        let norm = squares(&self.grads).sqrt();
        let scale = clip_scale(norm, max_norm);
        if scale != 1.0 {
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

    /// Gradients of the last backward pass, flat (clipped, after a step that clipped them).
    pub fn grads(&mut self) -> &[f32] {
        self.settle();
        &self.grads
    }

    /// The gradients to fill in place of a backward pass (e.g. [`crate::ddp::DataParallel`]
    /// combining its devices' shares); [`Self::step`] applies them.
    pub(crate) fn grads_mut(&mut self) -> &mut [f32] {
        self.settle();
        &mut self.grads
    }

    /// Copy [`Self::pending`] gradients, if any, into `grads`.
    fn settle(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        for (slot, part) in self.layout.slots.iter().zip(&pending.parts) {
            let dst = &mut self.grads[slot.offset..slot.offset + slot.len];
            match part {
                Some(d) => {
                    let g = d.as_slice::<f32>().expect("f32 gradient");
                    dst.iter_mut()
                        .zip(g)
                        .for_each(|(a, b)| *a = b * pending.scale);
                }
                None => dst.fill(0.0),
            }
        }
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

/// What gradients of norm `norm` are multiplied by to clip them to `max_norm` (0: off): 1
/// unless they are longer.
fn clip_scale(norm: f32, max_norm: f64) -> f32 {
    if max_norm > 0.0 && norm > max_norm as f32 {
        max_norm as f32 / (norm + 1e-6)
    } else {
        1.0
    }
}

/// The sum of the squares of `v`, in 16 lanes so that it vectorises (a single running sum is
/// a chain of dependent adds the compiler may not reorder).
fn squares(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let chunks = v.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().map(|g| g * g).sum();
    for c in chunks {
        for (s, g) in lanes.iter_mut().zip(c) {
            *s += g * g;
        }
    }
    lanes.iter().sum::<f32>() + rest
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
        let q = t.model().forward(crate::nets::Input::Float(x));
        (q.clone() * q).mean()
    }

    fn norm_of(v: &[f32]) -> f32 {
        v.iter().map(|g| f64::from(*g).powi(2)).sum::<f64>().sqrt() as f32
    }

    fn trainer() -> Trainer<QNet> {
        let device = Device::flex();
        device.seed(5);
        Trainer::new(QNet::new(4, &[16], 2, false, &device.autodiff()), 1e-8)
    }

    fn close(got: f32, want: f32, what: &str) {
        assert!((got - want).abs() <= 1e-5 * want, "{what}: {got} vs {want}");
    }

    /// A step from the gradients where the backward pass left them gives the parameters a
    /// step from their flat copy gives (bit for bit without clipping), reports their norm,
    /// and leaves them readable afterwards, clipped when it clipped them.
    #[test]
    fn a_step_from_the_backward_pass_gradients_is_a_step_from_their_copy() {
        for max_norm in [0.0, 0.05] {
            let (mut direct, mut copied) = (trainer(), trainer());
            let mut clipped_once = false;
            for k in 0..3 {
                direct.backward(loss(&direct, k)).expect("one process");
                copied.backward(loss(&copied, k)).expect("one process");
                let want = norm_of(copied.grads());
                let a = direct.step(1e-3, max_norm).expect("one process").grad_norm;
                let b = copied.step(1e-3, max_norm).expect("one process").grad_norm;
                close(a, want, "the direct step's norm");
                close(b, want, "the copied step's norm");
                if max_norm == 0.0 {
                    assert!(direct.params() == copied.params(), "step {k}");
                } else {
                    for (x, y) in direct.params().iter().zip(copied.params()) {
                        assert!((x - y).abs() <= 1e-6, "step {k}: {x} vs {y}");
                    }
                }
                let after = norm_of(direct.grads());
                let clipped = if max_norm > 0.0 && want > max_norm as f32 {
                    clipped_once = true;
                    max_norm as f32
                } else {
                    want
                };
                close(after, clipped, "the gradients after the step");
            }
            assert_eq!(clipped_once, max_norm > 0.0, "the clipping case clips");
        }
    }

    /// The norm a step reports is that of the gradients it applies after an accumulation
    /// and after the gradients were changed in place.
    #[test]
    fn the_step_norm_is_the_norm_of_the_gradients() {
        let mut t = trainer();
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
