//! The gradient all-reduce overlapped with the backward pass (torch DDP's reducer hooks):
//! while `loss.backward()` runs, drill's layers hand each parameter gradient they register to
//! a [`Pass`] ([`crate::compute::GradSink`]), which writes it into the flat gradient buffer
//! and starts the parameter's bucket's all-reduce once the bucket is whole.
//!
//! Only parameters known to get their whole gradient in one such write may start a bucket
//! early: the first distributed backward learns them (written once, and equal bit for bit to
//! the gradient the pass ends with; the ranks agree on the set), the others (a parameter also
//! touched by burn's own operations, such as PPO's log-std) are read after the pass as
//! before. The buckets and their contents are the same either way, so the averaged gradients
//! are the same bits.

use std::ops::Range;

use super::GradSync;
use crate::compute::GradSink;
use crate::error::TrainError;

/// One distributed backward pass's receiver of parameter gradients.
pub(crate) struct Pass {
    pub(crate) sync: GradSync,
    /// The trainer's flat gradients, for the pass.
    pub(crate) grads: Vec<f32>,
    /// Each slot's elements of `grads`.
    ranges: Vec<Range<usize>>,
    /// Slots whose bucket may start from the write (`None`: the learning pass, which starts
    /// none).
    early: Option<Vec<bool>>,
    /// Writes per slot in this pass.
    pub(crate) writes: Vec<u32>,
    /// Slots handed to the reducer during the pass.
    pub(crate) done: Vec<bool>,
    /// The first all-reduce error met during the pass.
    pub(crate) error: Option<TrainError>,
}

impl Pass {
    pub(crate) fn new(
        sync: GradSync,
        grads: Vec<f32>,
        ranges: Vec<Range<usize>>,
        early: Option<Vec<bool>>,
    ) -> Self {
        let n = ranges.len();
        Self {
            sync,
            grads,
            ranges,
            early,
            writes: vec![0; n],
            done: vec![false; n],
            error: None,
        }
    }
}

impl GradSink for Pass {
    fn written(&mut self, slot: usize, grad: &[f32]) {
        self.writes[slot] += 1;
        if self.done[slot] {
            // Its bucket may be reduced already: the sum it should have held is lost.
            let tensor = self.sync.name(slot).to_string();
            self.error
                .get_or_insert(TrainError::LateGradient { tensor });
            return;
        }
        let range = self.ranges[slot].clone();
        let Some(early) = &self.early else {
            // The learning pass keeps every write, to compare with the pass's end.
            self.grads[range].copy_from_slice(grad);
            return;
        };
        if !early[slot] || self.error.is_some() {
            // Read after the pass, as before.
            return;
        }
        self.grads[range].copy_from_slice(grad);
        self.done[slot] = true;
        if let Err(e) = self.sync.slot_written(slot, &mut self.grads) {
            self.error = Some(e);
        }
    }
}
