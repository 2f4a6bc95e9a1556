//! `ddp::DistributedSampler`, a library type (torch's `DistributedSampler`; drill's own
//! pipelines sample replay and rollouts per rank instead): each rank of a group takes a
//! disjoint shard of a dataset's indices, reshuffled alike on every rank each epoch.
//!
//! Alone, `cargo run --release -p drill-algo --example distributed_sampler` prints the shards
//! two ranks would take. Under a launcher each rank takes its own and the group checks that
//! together they cover the dataset once per epoch:
//! `cargo build --release -p drill-algo --example distributed_sampler`, then
//! `drill launch --standalone --nproc-per-node 2 -- target/release/examples/distributed_sampler`.

use drill_algo::ddp::DistributedSampler;
use drill_comm::{ProcessGroup, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let len = 12;
    let pg = ProcessGroup::from_env()?;
    let (rank, world) = (pg.rank(), pg.world_size());
    if world == 1 {
        for epoch in 0..2 {
            for r in 0..2 {
                let mut s = DistributedSampler::new(len, 2, r).seed(7);
                s.set_epoch(epoch);
                println!("epoch {epoch}, rank {r} of 2: {:?}", s.indices());
            }
        }
        return Ok(());
    }
    for epoch in 0..3 {
        let mut s = DistributedSampler::new(len, world, rank)
            .seed(7)
            .drop_last(true);
        s.set_epoch(epoch);
        let mine = s.indices();
        // How often each index was taken, summed over the ranks: 1 everywhere it is covered.
        let mut seen = vec![0f32; len];
        for &i in &mine {
            seen[i] += 1.0;
        }
        pg.all_reduce(&mut seen, ReduceOp::Sum)?;
        let covered = seen.iter().filter(|&&c| c == 1.0).count();
        println!(
            "rank {rank} of {world}, epoch {epoch}: {mine:?}; {covered} of {len} indices taken once by the group"
        );
    }
    Ok(())
}
