//! [`SyncBatchNorm`]: batch normalisation whose batch statistics cover every rank's batch.

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
/// Gradients: the other ranks' sums enter as constants, so input gradients lack the
/// cross-rank terms of the statistics (torch all-reduces them in backward; burn 0.22 offers
/// no hook to run a collective inside backward). Gradients of `gamma` and `beta` are exact
/// once DDP averages them.
#[derive(Module, Debug)]
pub struct SyncBatchNorm {
    /// The wrapped layer: gamma, beta, running mean and variance.
    pub inner: BatchNorm,
}

impl SyncBatchNorm {
    /// A layer for `features` features (PyTorch's defaults: eps 1e-5, momentum 0.1).
    pub fn new(features: usize, device: &Device) -> Self {
        Self {
            inner: BatchNormConfig::new(features).init(device),
        }
    }

    /// Normalise `x` (`[batch, features]`) with statistics over every rank of `pg` (this
    /// rank's batch only when `pg` is `None`). Training mode on an autodiff device, as burn's.
    pub fn forward(&self, x: Tensor<2>, pg: Option<&ProcessGroup>) -> Result<Tensor<2>, CommError> {
        let device = x.device();
        if !device.is_autodiff() {
            return Ok(self.inner.forward(x));
        }
        let [n, c] = x.shape().dims();
        let sum = x.clone().sum_dim(0);
        let sumsq = (x.clone() * x.clone()).sum_dim(0);
        let mut stats: Vec<f64> = Vec::with_capacity(2 * c + 1);
        let host = |t: &Tensor<2>| -> Vec<f64> {
            t.clone()
                .into_data()
                .convert::<f64>()
                .try_to_vec::<f64>()
                .expect("f64 data")
        };
        let (local_sum, local_sumsq) = (host(&sum), host(&sumsq));
        stats.extend(&local_sum);
        stats.extend(&local_sumsq);
        stats.push(n as f64);
        if let Some(pg) = pg {
            pg.all_reduce(&mut stats, ReduceOp::Sum)?;
        }
        let total = stats[2 * c];
        // The other ranks' contributions, as constants next to this rank's differentiable sums.
        let other = |global: &[f64], local: &[f64]| {
            let v: Vec<f32> = global
                .iter()
                .zip(local)
                .map(|(g, l)| (g - l) as f32)
                .collect();
            Tensor::<2>::from_data(TensorData::new(v, [1, c]), &device)
        };
        let mean = (sum + other(&stats[..c], &local_sum)).div_scalar(total);
        let ex2 = (sumsq + other(&stats[c..2 * c], &local_sumsq)).div_scalar(total);
        let var = ex2 - mean.clone() * mean.clone();
        let bn = &self.inner;
        let y = (x - mean.clone()) / (var.clone().add_scalar(bn.epsilon)).sqrt()
            * bn.gamma.val().reshape([1, c])
            + bn.beta.val().reshape([1, c]);
        // Running statistics, detached; the batch variance is the biased one, as burn's
        // BatchNorm keeps it (torch keeps the unbiased one), so one rank matches burn exactly.
        let m = bn.momentum;
        let plain = device.inner();
        let mean_now = Tensor::<2>::from_data(mean.detach().into_data(), &plain).reshape([c]);
        let var_now = Tensor::<2>::from_data(var.detach().into_data(), &plain).reshape([c]);
        let rm = bn.running_mean.value_sync().to_device(&plain);
        let rv = bn.running_var.value_sync().to_device(&plain);
        bn.running_mean
            .update(rm.mul_scalar(1.0 - m).add(mean_now.mul_scalar(m)));
        bn.running_var
            .update(rv.mul_scalar(1.0 - m).add(var_now.mul_scalar(m)));
        Ok(y)
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
}
