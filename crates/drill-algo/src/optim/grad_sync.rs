//! [`GradSync`]: torch's DistributedDataParallel for a [`Trainer`](crate::optim::Trainer)'s
//! flat buffers — where the gradient all-reduce happens.

use std::ops::Range;

use drill_comm::{ProcessGroup, ReduceOp, Work};

use super::ParamLayout;
use crate::error::TrainError;

/// DDP knobs (torch's names where it has them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DdpOptions {
    /// Largest bucket in MiB (torch's `bucket_cap_mb`, default 25).
    pub bucket_cap_mb: f64,
    /// The first bucket (the last layers, whose gradients are ready first) is capped smaller
    /// so communication starts early (torch: 1 MiB).
    pub first_bucket_mb: f64,
    /// Every this many steps, check that parameters are bit-identical on every rank (0: off).
    pub check_every: u64,
    /// Start a bucket's all-reduce during the backward pass, as soon as its gradients are
    /// written (on the CPU device; the same results as after the pass).
    pub overlap: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        Self {
            bucket_cap_mb: 25.0,
            first_bucket_mb: 1.0,
            check_every: 0,
            overlap: true,
        }
    }
}

struct Bucket {
    /// Elements of the flat gradient buffer (contiguous: buckets hold adjacent parameters).
    range: Range<usize>,
    /// Its parameters, by slot index.
    slots: Range<usize>,
    /// Parameters in the bucket.
    params: usize,
    /// Parameters whose gradient is not packed yet in this backward pass.
    pending: usize,
    /// Staging buffer, moved into the all-reduce and back (no allocation per step).
    buf: Vec<f32>,
    work: Option<Work<Vec<f32>>>,
}

/// Averages gradients across the ranks of a process group in buckets, overlapping each
/// bucket's all-reduce with packing the next.
///
/// Parameters are bucketed in reverse visit order (backward produces the last layer's
/// gradients first), by position in the [`ParamLayout`], never by burn's per-process random
/// parameter ids, so every rank builds the same buckets.
pub struct GradSync {
    pg: ProcessGroup,
    buckets: Vec<Bucket>,
    /// Bucket of each parameter (by slot index).
    slot_bucket: Vec<usize>,
    names: Vec<(String, Range<usize>)>,
    check_every: u64,
    /// [`DdpOptions::overlap`].
    overlap: bool,
    steps: u64,
    /// Buckets whose all-reduce started in this backward pass.
    started: usize,
    /// Buckets started during backward passes, over the run ([`Self::early_buckets`]).
    early: u64,
}

impl GradSync {
    /// Buckets for `layout` on `pg`.
    pub fn new(pg: ProcessGroup, layout: &ParamLayout, opts: DdpOptions) -> Self {
        let mib = |m: f64| ((m * 1024.0 * 1024.0 / 4.0) as usize).max(1);
        let (first_cap, cap) = (mib(opts.first_bucket_mb), mib(opts.bucket_cap_mb));
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut slot_bucket = vec![0; layout.slots.len()];
        for (i, slot) in layout.slots.iter().enumerate().rev() {
            let limit = if buckets.len() <= 1 { first_cap } else { cap };
            let open = buckets
                .last()
                .is_some_and(|b| b.range.len() + slot.len <= limit || b.range.is_empty());
            if !open {
                buckets.push(Bucket {
                    range: slot.offset + slot.len..slot.offset + slot.len,
                    slots: i + 1..i + 1,
                    params: 0,
                    pending: 0,
                    buf: Vec::new(),
                    work: None,
                });
            }
            let b = buckets.last_mut().expect("a bucket is open");
            b.range.start = slot.offset;
            b.slots.start = i;
            b.params += 1;
            slot_bucket[i] = buckets.len() - 1;
        }
        for b in &mut buckets {
            b.pending = b.params;
            b.buf = vec![0.0; b.range.len()];
        }
        let names = layout
            .slots
            .iter()
            .map(|s| (s.name.clone(), s.offset..s.offset + s.len))
            .collect();
        Self {
            pg,
            buckets,
            slot_bucket,
            names,
            check_every: opts.check_every,
            overlap: opts.overlap,
            steps: 0,
            started: 0,
            early: 0,
        }
    }

    /// Whether buckets start during the backward pass ([`DdpOptions::overlap`]).
    pub(crate) fn overlaps(&self) -> bool {
        self.overlap
    }

    /// Parameter `slot`'s name.
    pub(crate) fn name(&self, slot: usize) -> &str {
        &self.names[slot].0
    }

    /// Buckets whose all-reduce started during a backward pass so far (the overlap at work).
    pub fn early_buckets(&self) -> u64 {
        self.early
    }

    /// The process group.
    pub fn group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// Bucket sizes in elements, in the order they are reduced.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.range.len()).collect()
    }

    /// The parameters (slot indices) of each bucket, in the order they are reduced.
    pub(crate) fn bucket_slots(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.buckets.iter().map(|b| b.slots.clone())
    }

    /// Make every rank's `params` equal to rank 0's.
    pub(crate) fn broadcast_params(&self, params: &mut [f32]) -> Result<(), TrainError> {
        Ok(self.pg.broadcast(params, 0)?)
    }

    /// Parameter `slot` has its gradient in `grads`: when that completes its bucket, start the
    /// bucket's all-reduce in the background. The last bucket has nothing left to overlap
    /// with, so it is reduced in place on the calling thread (no hand-off to the comm thread:
    /// measured ~100 us less per update on the CartPole net, whose gradients fit one bucket).
    pub(crate) fn slot_ready(&mut self, slot: usize, grads: &mut [f32]) -> Result<(), TrainError> {
        self.slot_ready_started(slot, grads).map(drop)
    }

    /// [`Self::slot_ready`] from inside a backward pass: a bucket it starts is counted in
    /// [`Self::early_buckets`].
    pub(crate) fn slot_written(
        &mut self,
        slot: usize,
        grads: &mut [f32],
    ) -> Result<(), TrainError> {
        if self.slot_ready_started(slot, grads)? {
            self.early += 1;
        }
        Ok(())
    }

    /// [`Self::slot_ready`], saying whether it started the bucket.
    fn slot_ready_started(&mut self, slot: usize, grads: &mut [f32]) -> Result<bool, TrainError> {
        let k = self.slot_bucket[slot];
        let last = self.started + 1 == self.buckets.len();
        let b = &mut self.buckets[k];
        b.pending -= 1;
        if b.pending > 0 {
            return Ok(false);
        }
        self.started += 1;
        if last {
            let range = b.range.clone();
            self.pg.all_reduce(&mut grads[range], ReduceOp::Avg)?;
            return Ok(true);
        }
        let mut buf = std::mem::take(&mut b.buf);
        buf.clear();
        buf.extend_from_slice(&grads[b.range.clone()]);
        b.work = Some(self.pg.all_reduce_async(buf, ReduceOp::Avg));
        Ok(true)
    }

    /// Wait for every bucket and write the averaged gradients into `grads`.
    pub fn finish(&mut self, grads: &mut [f32]) -> Result<(), TrainError> {
        self.started = 0;
        let mut first_err = None;
        for b in &mut self.buckets {
            b.pending = b.params;
            let Some(work) = b.work.take() else {
                continue;
            };
            match work.wait() {
                Ok(buf) => {
                    grads[b.range.clone()].copy_from_slice(&buf);
                    b.buf = buf;
                }
                Err(e) => {
                    b.buf = vec![0.0; b.range.len()];
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// After an optimizer step: every `check_every` steps, compare a checksum of each
    /// parameter tensor across ranks and fail naming the first that differs.
    pub(crate) fn after_step(&mut self, params: &[f32]) -> Result<(), TrainError> {
        self.steps += 1;
        if self.check_every > 0 && self.steps.is_multiple_of(self.check_every) {
            self.check_params(params)?;
        }
        Ok(())
    }

    /// Fail unless `params` is bit-identical on every rank, naming the first tensor (in visit
    /// order) and the rank that differ from rank 0.
    pub fn check_params(&self, params: &[f32]) -> Result<(), TrainError> {
        let sums: Vec<i64> = self
            .names
            .iter()
            .map(|(_, r)| {
                params[r.clone()]
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
                        (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
                    }) as i64
            })
            .collect();
        let n = sums.len();
        let mut all = vec![0i64; n * self.pg.world_size()];
        self.pg.all_gather(&sums, &mut all)?;
        for (t, (name, _)) in self.names.iter().enumerate() {
            if let Some(rank) = (1..self.pg.world_size()).find(|&r| all[r * n + t] != all[t]) {
                return Err(TrainError::Diverged {
                    tensor: name.clone(),
                    rank,
                    step: self.steps,
                });
            }
        }
        Ok(())
    }
}
