//! [`DataParallel`]: one process, several devices (torch's `nn.DataParallel`).

use std::ops::Range;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};

use crate::optim::Trainer;

/// Splits each batch across devices, runs forward and backward on every device at once (a
/// thread per device, a replica of the model on each), and combines the gradients into the
/// trainer's flat buffer, weighted by shard size — the gradient of the whole batch's mean
/// loss. Then [`Trainer::step`] updates the one set of parameters as usual.
///
/// With CUDA builds the devices are GPUs; burn 0.22's CPU backend has a single device, so on
/// CPU the replicas share it and the threads use the cores.
pub struct DataParallel {
    devices: Vec<Device>,
    shard_grads: Vec<Vec<f32>>,
}

impl DataParallel {
    /// Data parallelism over `devices` (autodiff devices are made from them).
    pub fn new(devices: Vec<Device>) -> Self {
        assert!(
            !devices.is_empty(),
            "DataParallel needs at least one device"
        );
        Self {
            shard_grads: vec![Vec::new(); devices.len()],
            devices,
        }
    }

    /// Rows of a `rows`-row batch that device `k` gets (contiguous, sizes differ by at most 1).
    pub fn shard(&self, rows: usize, k: usize) -> Range<usize> {
        let n = self.devices.len();
        let (base, extra) = (rows / n, rows % n);
        let start = k * base + k.min(extra);
        start..start + base + usize::from(k < extra)
    }

    /// Backward the mean loss of a `rows`-row batch: `loss(replica, rows, device)` builds the
    /// mean loss of the given rows on one device. Gradients land in `trainer.grads`.
    pub fn backward<M, F>(&mut self, trainer: &mut Trainer<M>, rows: usize, loss: F)
    where
        M: Module + Send + Sync,
        F: Fn(&M, Range<usize>, &Device) -> Tensor<1> + Sync,
    {
        let layout = trainer.layout();
        let model = trainer.model();
        let shards: Vec<Range<usize>> = (0..self.devices.len())
            .map(|k| self.shard(rows, k))
            .collect();
        std::thread::scope(|s| {
            for ((device, shard), out) in
                self.devices.iter().zip(&shards).zip(&mut self.shard_grads)
            {
                let loss = &loss;
                s.spawn(move || {
                    out.resize(layout.len, 0.0);
                    if shard.is_empty() {
                        out.fill(0.0);
                        return;
                    }
                    let ad = if device.is_autodiff() {
                        device.clone()
                    } else {
                        device.clone().autodiff()
                    };
                    // On the model's own device the replica shares its parameters (each thread
                    // builds its own graph); elsewhere they are copied over, still tracked.
                    let replica = if model.devices().first() == Some(&ad) {
                        model.clone()
                    } else {
                        model.clone().fork(&ad).train()
                    };
                    let l = loss(&replica, shard.clone(), &ad);
                    let mut grads = GradientsParams::from_grads(l.backward(), &replica);
                    layout.read_grads(&mut grads, out);
                });
            }
        });
        let grads = trainer.grads_mut();
        grads.fill(0.0);
        for (shard, g) in shards.iter().zip(&self.shard_grads) {
            let w = shard.len() as f32 / rows as f32;
            grads.iter_mut().zip(g).for_each(|(a, b)| *a += w * b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nets::{Input, QNet};
    use burn::tensor::TensorData;

    fn loss(net: &QNet, rows: Range<usize>, data: &[f32], device: &Device) -> Tensor<1> {
        let n = rows.len();
        let x = Tensor::<2>::from_data(
            TensorData::new(data[rows.start * 4..rows.end * 4].to_vec(), [n, 4]),
            device,
        );
        let y = net.forward(Input::Float(x));
        (y.clone() * y).mean()
    }

    #[test]
    fn two_devices_give_the_whole_batch_gradient() {
        let device = Device::flex();
        device.seed(4);
        let data: Vec<f32> = (0..4 * 37)
            .map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let mut one = Trainer::new(
            QNet::new(4, &[16], 2, false, &device.clone().autodiff()),
            1e-8,
        );
        let mut dp_trainer = Trainer::new(one.model().clone(), 1e-8);
        let l = loss(one.model(), 0..37, &data, &device.clone().autodiff());
        one.backward(l).unwrap();
        let mut dp = DataParallel::new(vec![Device::flex(), Device::flex()]);
        assert_eq!((dp.shard(37, 0), dp.shard(37, 1)), (0..19, 19..37));
        dp.backward(&mut dp_trainer, 37, |m, rows, d| loss(m, rows, &data, d));
        let diff: f32 = one
            .grads()
            .iter()
            .zip(dp_trainer.grads())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let scale = one.grads().iter().fold(0.0f32, |m, g| m.max(g.abs()));
        assert!(
            scale > 0.0 && diff <= 1e-5 * scale,
            "max diff {diff} (scale {scale})"
        );
    }
}
