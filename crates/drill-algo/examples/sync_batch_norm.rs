//! `ddp::SyncBatchNorm`, a library type (no shipped network uses batch normalisation): batch
//! statistics over every rank's batch, so a data-parallel run normalises as one process would
//! over the whole batch.
//!
//! `cargo build --release -p drill-algo --example sync_batch_norm`, then
//! `drill launch --standalone --nproc-per-node 2 -- target/release/examples/sync_batch_norm`:
//! each rank's batch has a different mean; the synchronised layer's outputs average to zero
//! over the group, a rank-local layer's to zero on each rank instead. Alone, it runs as plain
//! batch normalisation.

use burn::tensor::{Device, Tensor, TensorData};
use drill_algo::ddp::SyncBatchNorm;
use drill_comm::{ProcessGroup, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pg = ProcessGroup::from_env()?;
    let (rank, world) = (pg.rank(), pg.world_size());
    let device = Device::flex().autodiff();
    let (rows, features) = (8, 3);
    // Rank r's rows are centred on r: the ranks' batches differ.
    let x: Vec<f32> = (0..rows * features)
        .map(|i| rank as f32 + ((i * 7 % 5) as f32 - 2.0) * 0.5)
        .collect();
    let input = || Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, features]), &device);
    let layer = SyncBatchNorm::new(features, &device);
    let mean_of =
        |y: Tensor<2>| -> Vec<f32> { y.mean_dim(0).into_data().try_to_vec::<f32>().expect("f32") };
    let synced = mean_of(layer.forward(input(), Some(&pg))?);
    let local = mean_of(layer.forward(input(), None)?);
    let mut group_mean = synced.clone();
    pg.all_reduce(&mut group_mean, ReduceOp::Sum)?;
    group_mean.iter_mut().for_each(|m| *m /= world as f32);
    println!(
        "rank {rank} of {world}: output mean on this rank {synced:.3?} synchronised, {local:.3?} rank-local; over the group {group_mean:.3?}"
    );
    Ok(())
}
