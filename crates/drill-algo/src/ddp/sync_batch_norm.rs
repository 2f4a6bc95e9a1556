//! [`SyncBatchNorm`]: batch normalisation whose batch statistics cover every rank's batch.

use std::sync::{Arc, Mutex};

use crate::compute::BatchStats;
use burn::module::Module;
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::{Device, Tensor, TensorData};
use drill_comm::{CommError, ProcessGroup, ReduceOp};

/// torch's `SyncBatchNorm` for `[batch, features]` inputs: in training the mean and variance
/// are those of the union of all ranks' batches (one all-reduce of per-feature sums, sums of
/// squares and counts), so 2 ranks with half batches normalise exactly as 1 rank with the
/// whole batch, and running statistics stay identical on every rank. In inference the running
/// statistics are used, as in [`BatchNorm`], whose parameters and state this wraps (so
/// checkpoints and DDP see the same tensors).
///
/// Gradients, as torch's: the backward all-reduces the per-feature sums of `dy` and
/// `dy * x_hat`, so each rank's input gradient is its rows' share of the whole batch's;
/// `gamma`'s and `beta`'s are this rank's rows' (exact once DDP averages them). The backward
/// is drill's own on the CPU device; elsewhere the input gradient lacks the other ranks' terms
/// (their sums enter as constants).
#[derive(Module, Debug)]
pub struct SyncBatchNorm {
    /// The wrapped layer: gamma, beta, running mean and variance.
    pub inner: BatchNorm,
    /// A backward all-reduce's error, returned by the next [`SyncBatchNorm::forward`].
    #[module(skip)]
    failed: Arc<Mutex<Option<CommError>>>,
}

impl SyncBatchNorm {
    /// A layer for `features` features (PyTorch's defaults: eps 1e-5, momentum 0.1).
    pub fn new(features: usize, device: &Device) -> Self {
        Self {
            inner: BatchNormConfig::new(features).init(device),
            failed: Arc::default(),
        }
    }

    /// Normalise `x` (`[batch, features]`) with statistics over every rank of `pg` (this
    /// rank's batch only when `pg` is `None`). Training mode on an autodiff device, as burn's.
    /// An error of the previous backward's all-reduce is returned here.
    pub fn forward(&self, x: Tensor<2>, pg: Option<&ProcessGroup>) -> Result<Tensor<2>, CommError> {
        if let Some(e) = self.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let device = x.device();
        if !device.is_autodiff() {
            return Ok(self.inner.forward(x));
        }
        let [n, c] = x.shape().dims();
        let values: Vec<f32> = x
            .clone()
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("f32 data");
        // Per-feature sums, sums of squares, and the row count, over every rank.
        let mut stats = vec![0f64; 2 * c + 1];
        for (i, &v) in values.iter().enumerate() {
            stats[i % c] += f64::from(v);
            stats[c + i % c] += f64::from(v) * f64::from(v);
        }
        stats[2 * c] = n as f64;
        let local = stats.clone();
        if let Some(pg) = pg {
            pg.all_reduce(&mut stats, ReduceOp::Sum)?;
        }
        let total = stats[2 * c];
        let mean: Vec<f64> = stats[..c].iter().map(|s| s / total).collect();
        // The biased variance, as burn's BatchNorm keeps it (torch keeps the unbiased one).
        let var: Vec<f64> = (0..c)
            .map(|j| stats[c + j] / total - mean[j] * mean[j])
            .collect();
        let bn = &self.inner;
        let y = if crate::compute::native(&x) {
            let stats = BatchStats {
                mean: mean.iter().map(|&m| m as f32).collect(),
                invstd: var
                    .iter()
                    .map(|&v| (1.0 / (v + bn.epsilon).sqrt()) as f32)
                    .collect(),
                total,
                group: pg.cloned(),
                failed: self.failed.clone(),
            };
            crate::compute::batch_norm(x, bn.gamma.val(), bn.beta.val(), stats)
        } else {
            self.with_constant_others(x, (&stats, &local), c)
        };
        // Running statistics, detached.
        let m = bn.momentum;
        let plain = device.inner();
        let now = |v: &[f64]| {
            let v: Vec<f32> = v.iter().map(|&v| v as f32).collect();
            Tensor::<1>::from_data(TensorData::new(v, [c]), &plain)
        };
        let rm = bn.running_mean.value_sync().to_device(&plain);
        let rv = bn.running_var.value_sync().to_device(&plain);
        bn.running_mean
            .update(rm.mul_scalar(1.0 - m).add(now(&mean).mul_scalar(m)));
        bn.running_var
            .update(rv.mul_scalar(1.0 - m).add(now(&var).mul_scalar(m)));
        Ok(y)
    }

    /// The forward off the CPU device, in burn's operations: this rank's sums differentiable,
    /// the other ranks' (`global` minus `local`) constants.
    fn with_constant_others(
        &self,
        x: Tensor<2>,
        (global, local): (&[f64], &[f64]),
        c: usize,
    ) -> Tensor<2> {
        let device = x.device();
        let other = |range: std::ops::Range<usize>| {
            let v: Vec<f32> = range.map(|j| (global[j] - local[j]) as f32).collect();
            Tensor::<2>::from_data(TensorData::new(v, [1, c]), &device)
        };
        let total = global[2 * c];
        let sum = x.clone().sum_dim(0);
        let sumsq = (x.clone() * x.clone()).sum_dim(0);
        let mean = (sum + other(0..c)).div_scalar(total);
        let ex2 = (sumsq + other(c..2 * c)).div_scalar(total);
        let var = ex2 - mean.clone() * mean.clone();
        let bn = &self.inner;
        (x - mean) / var.add_scalar(bn.epsilon).sqrt() * bn.gamma.val().reshape([1, c])
            + bn.beta.val().reshape([1, c])
    }

    /// The running mean and variance.
    pub fn running_stats(&self) -> (Vec<f32>, Vec<f32>) {
        let v = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().expect("f32 data");
        (
            v(self.inner.running_mean.value_sync()),
            v(self.inner.running_var.value_sync()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alone_it_matches_burns_batch_norm() {
        let ad = Device::flex().autodiff();
        let data: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 - 3.0).collect();
        let x = || Tensor::<2>::from_data(TensorData::new(data.clone(), [8, 3]), &ad);
        let ours = SyncBatchNorm::new(3, &ad);
        let burns = BatchNormConfig::new(3).init(&ad);
        let a = ours.forward(x(), None).unwrap().into_data();
        let b = burns.forward(x()).into_data();
        a.assert_approx_eq::<f32>(&b, burn::tensor::Tolerance::absolute(1e-5));
        let rm = burns.running_mean.value_sync().into_data();
        let rv = burns.running_var.value_sync().into_data();
        let (m, v) = ours.running_stats();
        TensorData::new(m, [3])
            .assert_approx_eq::<f32>(&rm, burn::tensor::Tolerance::absolute(1e-5));
        TensorData::new(v, [3])
            .assert_approx_eq::<f32>(&rv, burn::tensor::Tolerance::absolute(1e-5));
    }

    /// Alone, its backward (drill's own on the CPU device) gives burn's BatchNorm's gradients
    /// for the input, gamma and beta.
    #[test]
    fn alone_its_gradients_are_burns() {
        let ad = Device::flex().autodiff();
        let data: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..24).map(|i| ((i * 5) % 7) as f32 * 0.3 - 1.0).collect();
        let x =
            || Tensor::<2>::from_data(TensorData::new(data.clone(), [8, 3]), &ad).require_grad();
        let w = Tensor::<2>::from_data(TensorData::new(w, [8, 3]), &ad);
        let ours = SyncBatchNorm::new(3, &ad);
        let burns = BatchNormConfig::new(3).init(&ad);
        let (xa, xb) = (x(), x());
        let ga = (ours.forward(xa.clone(), None).unwrap() * w.clone())
            .sum()
            .backward();
        let gb = (burns.forward(xb.clone()) * w).sum().backward();
        let tol = burn::tensor::Tolerance::absolute(1e-5);
        let dx = |t: &Tensor<2>, g| t.grad(g).unwrap().into_data();
        dx(&xa, &ga).assert_approx_eq::<f32>(&dx(&xb, &gb), tol);
        let g1 = |p: &burn::module::Param<Tensor<1>>, g| p.grad(g).unwrap().into_data();
        g1(&ours.inner.gamma, &ga).assert_approx_eq::<f32>(&g1(&burns.gamma, &gb), tol);
        g1(&ours.inner.beta, &ga).assert_approx_eq::<f32>(&g1(&burns.beta, &gb), tol);
    }
}
