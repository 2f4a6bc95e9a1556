//! `ddp::DataParallel`, a library type (no config key reaches it): one process splits each
//! batch over several devices, runs forward and backward on each at once (a thread per
//! device, a replica of the model on each) and combines the gradients into the trainer's, the
//! gradient of the whole batch's mean loss; `Trainer::step` then updates the one set of
//! parameters. Here two replicas share the CPU (burn's CPU backend has one device; the threads
//! use the cores); in a `--features gpu` build the devices can be GPUs.
//!
//! `cargo run --release -p drill-algo --example data_parallel`: fits a small Q-network to a
//! regression target and prints the loss before and after.

use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData};
use drill_algo::ddp::DataParallel;
use drill_algo::nets::{Input, QNet};
use drill_algo::optim::Trainer;

/// Mean squared error of the net's two outputs against `(sum(x), -sum(x))` over `rows`.
fn loss(net: &QNet, rows: Range<usize>, x: &[f32], device: &Device) -> Tensor<1> {
    let n = rows.len();
    let xs = &x[rows.start * 4..rows.end * 4];
    let target: Vec<f32> = xs
        .chunks_exact(4)
        .flat_map(|r| {
            let s: f32 = r.iter().sum();
            [s, -s]
        })
        .collect();
    let input = Tensor::<2>::from_data(TensorData::new(xs.to_vec(), [n, 4]), device);
    let target = Tensor::<2>::from_data(TensorData::new(target, [n, 2]), device);
    let d = net.forward(Input::Float(input)) - target;
    (d.clone() * d).mean()
}

fn main() {
    let cpu = Device::flex();
    cpu.seed(0);
    let rows = 256;
    let x: Vec<f32> = (0..rows * 4)
        .map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0)
        .collect();
    let mut trainer = Trainer::new(
        QNet::new(4, &[64, 64], 2, false, &cpu.clone().autodiff()),
        1e-8,
    );
    let mut dp = DataParallel::new(vec![cpu.clone(), cpu.clone()]);
    println!(
        "{rows} rows split over 2 devices: {:?} and {:?}",
        dp.shard(rows, 0),
        dp.shard(rows, 1)
    );
    let whole = |trainer: &Trainer<QNet>| -> f32 {
        let l = loss(trainer.model(), 0..rows, &x, &cpu.clone().autodiff());
        l.into_data().try_to_vec::<f32>().expect("f32")[0]
    };
    let before = whole(&trainer);
    for _ in 0..300 {
        dp.backward(&mut trainer, rows, |net, r, device| {
            loss(net, r, &x, device)
        });
        trainer
            .step(1e-3, 0.0)
            .expect("one process: nothing to fail");
    }
    println!(
        "whole-batch loss: {before:.4} before, {:.4} after 300 steps",
        whole(&trainer)
    );
}
