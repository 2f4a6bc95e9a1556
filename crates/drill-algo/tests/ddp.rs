//! DDP against one process, with real ranks on 127.0.0.1 (this binary re-run as each rank).
//!
//! `cargo test --release -p drill-algo --test ddp [FILTER]`.
//! - 2 ranks × batch B give the parameters of 1 rank × batch 2B (DQN and PPO losses, and
//!   gradient accumulation with `backward_no_sync`).
//! - Each rank collects with its own seeds.
//! - Diverging parameters are caught, naming the tensor and the rank.

use std::time::{Duration, Instant};

use burn::tensor::{Device, Tensor, TensorData};
use drill_algo::TrainError;
use drill_algo::data::Batch;
use drill_algo::data::Rollout;
use drill_algo::ddp::Ranks;
use drill_algo::ddp::SyncBatchNorm;
use drill_algo::dqn::Dqn;
use drill_algo::envs;
use drill_algo::nets::{ActorCritic, Input, QNet};
use drill_algo::optim::DdpOptions;
use drill_algo::optim::Trainer;
use drill_algo::ppo::minibatch_update;
use drill_comm::ProcessGroup;
use drill_comm::spawn::{RankOutput, Spawn};
use drill_config::{Config, DqnPolicy, Policy, PpoPolicy};
use drill_env::{ActionBuf, ActionSpace, ObsBuf};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const B: usize = 16;
const STEPS: usize = 4;

fn main() {
    if let Ok(child) = std::env::var("DRILL_TEST_CHILD") {
        let pg = ProcessGroup::from_env().expect("init");
        let r = std::panic::catch_unwind(|| run_child(&child, pg));
        std::process::exit(if r.is_ok() { 0 } else { 1 });
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let scenarios: [(&str, fn()); 8] = [
        (
            "dqn_two_ranks_equal_one_rank_with_the_whole_batch",
            dqn_equivalence,
        ),
        (
            "ppo_two_ranks_equal_one_rank_with_the_whole_batch",
            ppo_equivalence,
        ),
        (
            "no_sync_accumulation_equals_the_whole_batch",
            no_sync_equivalence,
        ),
        (
            "overlapped_all_reduce_gives_the_same_bits",
            overlap_same_bits,
        ),
        ("each_rank_collects_with_its_own_seeds", seeds_differ),
        ("diverged_parameters_are_named", divergence_named),
        (
            "sync_batch_norm_halves_equal_the_whole_batch",
            sync_batch_norm,
        ),
        (
            "sync_batch_norm_reports_a_peer_lost_in_backward",
            sync_batch_norm_lost_peer,
        ),
    ];
    let mut failed = 0;
    for (name, f) in scenarios {
        if filter.as_deref().is_some_and(|flt| !name.contains(flt)) {
            continue;
        }
        let t = Instant::now();
        let ok = std::panic::catch_unwind(f).is_ok();
        println!(
            "test {name} ... {} ({:.1} s)",
            if ok { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        failed += usize::from(!ok);
    }
    if failed > 0 {
        println!("{failed} DDP scenario(s) failed");
        std::process::exit(1);
    }
}

fn two_ranks(child: &str) -> Vec<RankOutput> {
    let outs = Spawn::current_exe(2)
        .env("DRILL_TEST_CHILD", child)
        .timeout(Duration::from_secs(120))
        .run()
        .unwrap();
    for o in &outs {
        assert!(
            o.success(),
            "rank {} failed: {}\n{}",
            o.rank,
            o.stdout,
            o.stderr
        );
    }
    outs
}

/// The values printed after `key=` by a child, as f32 bit patterns.
fn printed(out: &RankOutput, key: &str) -> Vec<f32> {
    let line = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {}", out.stdout));
    line.split(',')
        .map(|h| f32::from_bits(u32::from_str_radix(h, 16).unwrap()))
        .collect()
}

fn print(key: &str, v: &[f32]) {
    let hex: Vec<String> = v.iter().map(|x| format!("{:08x}", x.to_bits())).collect();
    println!("{key}={}", hex.join(","));
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len());
    let diff: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = want
        .iter()
        .map(|b| f64::from(*b).powi(2))
        .sum::<f64>()
        .sqrt();
    let rel = diff / norm;
    assert!(rel <= 1e-5, "{what}: relative error {rel:e}");
    println!("  {what}: relative error {rel:.2e}");
}

// ------------------------------------------------------------------ DQN

fn dqn_batch(k: usize) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(100 + k as u64);
    let n = 2 * B;
    Batch {
        obs: ObsBuf::F32((0..n * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
        next_obs: ObsBuf::F32((0..n * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
        actions: ActionBuf::Discrete((0..n).map(|_| rng.random_range(0..2)).collect()),
        rewards: (0..n).map(|_| rng.random_range(0.0..1.0)).collect(),
        dones: (0..n).map(|i| f32::from(u8::from(i % 5 == 0))).collect(),
        discounts: vec![0.97; n],
        weights: vec![1.0; n],
        indices: (0..n).collect(),
    }
}

/// Rows `rows` of `b`.
fn half(b: &Batch, rank: usize) -> Batch {
    let rows = rank * B..(rank + 1) * B;
    let r4 = rows.start * 4..rows.end * 4;
    Batch {
        obs: ObsBuf::F32(b.obs.as_obs().f32()[r4.clone()].to_vec()),
        next_obs: ObsBuf::F32(b.next_obs.as_obs().f32()[r4].to_vec()),
        actions: match &b.actions {
            ActionBuf::Discrete(a) => ActionBuf::Discrete(a[rows.clone()].to_vec()),
            other => panic!("discrete batch, got {other:?}"),
        },
        rewards: b.rewards[rows.clone()].to_vec(),
        dones: b.dones[rows.clone()].to_vec(),
        discounts: b.discounts[rows.clone()].to_vec(),
        weights: b.weights[rows.clone()].to_vec(),
        indices: b.indices[rows].to_vec(),
    }
}

fn dqn_learner() -> Dqn {
    let device = Device::flex();
    device.seed(1);
    let mut p = DqnPolicy::default();
    p.learn.target_update_freq = 2;
    let net = QNet::new(4, &[32, 16], 2, true, &device.clone().autodiff());
    Dqn::new(net, &p, 4, 2, &device)
}

fn dqn_equivalence() {
    let mut one = dqn_learner();
    for k in 0..STEPS {
        one.update(&dqn_batch(k), None).unwrap();
    }
    let outs = two_ranks("dqn");
    for o in &outs {
        assert_close(
            &printed(o, "params"),
            one.online.params(),
            &format!("DQN rank {}", o.rank),
        );
    }
    assert_eq!(
        printed(&outs[0], "params"),
        printed(&outs[1], "params"),
        "bit-identical ranks"
    );
}

// ------------------------------------------------------------------ PPO

fn ppo_policy() -> (Config, PpoPolicy) {
    let cfg = Config::parse(
        "[env]\nid = \"CartPole-v1\"\n[policy]\ntype = \"ppo\"\n[policy.model]\nencoder_hidden_size_list = [32, 32]\n[policy.learn]\nadv_norm = false\ngrad_clip_value = 0.5\n",
        "t.toml",
        &[],
    )
    .unwrap();
    let Policy::Ppo(p) = cfg.policy.clone() else {
        unreachable!()
    };
    (cfg, p)
}

fn ppo_trainer() -> Trainer<ActorCritic> {
    let (cfg, p) = ppo_policy();
    let device = Device::flex();
    device.seed(2);
    Trainer::new(
        drill_algo::ppo::build_agent(&cfg, &p, &envs::env_spec(&cfg).unwrap(), &device.autodiff())
            .unwrap(),
        1e-5,
    )
}

fn ppo_rollout(k: usize) -> Rollout {
    let mut rng = ChaCha8Rng::seed_from_u64(200 + k as u64);
    let n = 2 * B;
    Rollout {
        obs_dim: 4,
        num_envs: 1,
        obs: ObsBuf::F32((0..n * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
        actions: ActionBuf::Discrete(
            (0..n)
                .map(|_| u32::from(rng.random_range(0u8..2)))
                .collect(),
        ),
        logp: (0..n).map(|_| rng.random_range(-1.2..-0.3)).collect(),
        adv: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        returns: (0..n).map(|_| rng.random_range(0.0..2.0)).collect(),
        values: (0..n).map(|_| rng.random_range(0.0..2.0)).collect(),
        ..Rollout::default()
    }
}

fn ppo_steps(trainer: &mut Trainer<ActorCritic>, rows: std::ops::Range<usize>) {
    let (_, p) = ppo_policy();
    let ad = Device::flex().autodiff();
    let mb: Vec<usize> = rows.collect();
    for k in 0..STEPS {
        let r = ppo_rollout(k);
        minibatch_update(
            trainer,
            &p,
            &ActionSpace::Discrete(2),
            &ad,
            &mb,
            None,
            &r,
            3e-3,
        )
        .unwrap();
    }
}

/// Tiny buckets: several all-reduces in flight per backward.
fn tiny_buckets(overlap: bool) -> DdpOptions {
    DdpOptions {
        bucket_cap_mb: 0.004,
        first_bucket_mb: 0.001,
        check_every: 1,
        overlap,
    }
}

/// The all-reduce started during the backward pass (buckets launched as their gradients are
/// written) gives the same parameters, bit for bit, as started after it.
fn overlap_same_bits() {
    let outs = two_ranks("overlap");
    for o in &outs {
        let r = o.rank;
        // The bit patterns as printed (printed() reads them back into the same floats).
        let bits =
            |key: &str| -> Vec<u32> { printed(o, key).iter().map(|v| v.to_bits()).collect() };
        assert_eq!(
            bits("during"),
            bits("after"),
            "rank {r}: the parameters differ"
        );
        assert_eq!(
            bits("shared_during"),
            bits("shared_after"),
            "rank {r}: parameters written twice or also by burn's operations differ"
        );
        let changed = (o.stdout.lines())
            .find_map(|l| l.strip_prefix("changed: "))
            .unwrap_or_default();
        assert!(
            changed.contains("parameter ba got another gradient"),
            "rank {r}: {changed}"
        );
        let (during, after) = (printed(o, "early_during")[0], printed(o, "early_after")[0]);
        println!("  rank {r}: buckets started during backward: {during} (overlap), {after} (off)");
        assert!(during > 0.0 && after == 0.0, "rank {r}: {during} / {after}");
    }
}

/// A layer whose weight burn's own operations also touch (an L2 term), and one applied twice:
/// neither parameter gets its whole gradient in one of drill's writes, so neither may start
/// its bucket early; the results stay those of the all-reduce after the pass.
#[derive(burn::module::Module, Debug)]
struct Shared {
    wa: burn::module::Param<Tensor<2>>,
    ba: burn::module::Param<Tensor<1>>,
    wb: burn::module::Param<Tensor<2>>,
    bb: burn::module::Param<Tensor<1>>,
}

fn shared_model() -> Shared {
    let ad = Device::flex().autodiff();
    let mut rng = ChaCha8Rng::seed_from_u64(400);
    let mut t = |dims: Vec<usize>| {
        let n = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5..0.5)).collect();
        TensorData::new(v, dims)
    };
    let p2 = |d: TensorData| burn::module::Param::from_tensor(Tensor::<2>::from_data(d, &ad));
    let p1 = |d: TensorData| burn::module::Param::from_tensor(Tensor::<1>::from_data(d, &ad));
    Shared {
        wa: p2(t(vec![4, 6])),
        ba: p1(t(vec![6])),
        wb: p2(t(vec![6, 6])),
        bb: p1(t(vec![6])),
    }
}

fn shared_steps(t: &mut Trainer<Shared>, rows: std::ops::Range<usize>) {
    shared_steps_changing(t, rows, usize::MAX).unwrap();
}

/// [`shared_steps`], from step `from` on with the first layer applied twice (a backward pass
/// unlike the first step's); the first error.
fn shared_steps_changing(
    t: &mut Trainer<Shared>,
    rows: std::ops::Range<usize>,
    from: usize,
) -> Result<(), TrainError> {
    use drill_algo::compute::linear;
    let ad = Device::flex().autodiff();
    for k in 0..STEPS {
        let x = bn_input(k)[..2 * B * 3].to_vec();
        let x: Vec<f32> = x.iter().cycle().take(2 * B * 4).copied().collect();
        let x = x[rows.start * 4..rows.end * 4].to_vec();
        let x = Tensor::<2>::from_data(TensorData::new(x, [rows.len(), 4]), &ad);
        let m = t.model();
        let mut h = linear(x.clone(), m.wa.val(), m.ba.val(), true);
        if k >= from {
            h = h + linear(x, m.wa.val(), m.ba.val(), true);
        }
        let h = linear(h, m.wb.val(), m.bb.val(), true);
        let y = linear(h, m.wb.val(), m.bb.val(), false);
        let l2 = m.wa.val().powf_scalar(2.0).sum().mul_scalar(0.01);
        let loss = y.powf_scalar(2.0).mean() + l2;
        t.backward(loss)?;
        t.step(1e-2, 0.0)?;
    }
    Ok(())
}

fn ppo_equivalence() {
    let mut one = ppo_trainer();
    ppo_steps(&mut one, 0..2 * B);
    let outs = two_ranks("ppo");
    for o in &outs {
        assert_close(
            &printed(o, "params"),
            one.params(),
            &format!("PPO rank {}", o.rank),
        );
    }
    assert_eq!(
        printed(&outs[0], "params"),
        printed(&outs[1], "params"),
        "bit-identical ranks"
    );
}

// ------------------------------------------------------------------ no_sync

/// Mean squared Q error of `rows` of batch `k` (a simple differentiable loss).
fn q_loss(trainer: &Trainer<QNet>, k: usize, rows: std::ops::Range<usize>) -> Tensor<1> {
    let b = dqn_batch(k);
    let n = rows.len();
    let ad = Device::flex().autodiff();
    let x = Tensor::<2>::from_data(
        TensorData::new(
            b.obs.as_obs().f32()[rows.start * 4..rows.end * 4].to_vec(),
            [n, 4],
        ),
        &ad,
    );
    let y = Tensor::<2>::from_data(
        TensorData::new(
            b.rewards[rows.clone()]
                .iter()
                .flat_map(|&r| [r, -r])
                .collect::<Vec<_>>(),
            [n, 2],
        ),
        &ad,
    );
    (trainer.model().forward(Input::Float(x)) - y)
        .square()
        .mean()
}

fn q_trainer() -> Trainer<QNet> {
    let device = Device::flex();
    device.seed(3);
    Trainer::new(QNet::new(4, &[16], 2, false, &device.autodiff()), 1e-8)
}

fn accumulate_steps(t: &mut Trainer<QNet>, rows: std::ops::Range<usize>) -> Result<(), TrainError> {
    for step in 0..2 {
        let l = q_loss(t, 2 * step, rows.clone());
        t.backward_no_sync(l);
        let l = q_loss(t, 2 * step + 1, rows.clone());
        t.backward(l)?;
        t.step(1e-2, 0.0)?;
    }
    Ok(())
}

fn no_sync_equivalence() {
    let mut one = q_trainer();
    accumulate_steps(&mut one, 0..2 * B).unwrap();
    let outs = two_ranks("no_sync");
    for o in &outs {
        assert_close(
            &printed(o, "params"),
            one.params(),
            &format!("no_sync rank {}", o.rank),
        );
    }
}

// ------------------------------------------------------------------ seeds, divergence

fn seeds_differ() {
    let outs = two_ranks("seeds");
    let (a, b) = (printed(&outs[0], "obs"), printed(&outs[1], "obs"));
    assert_ne!(a, b, "ranks must not collect the same data");
    // Rank 0 collects exactly what a single process with the same seed collects.
    let cfg = Config::parse("[env]\nid = \"CartPole-v1\"\n", "t.toml", &[]).unwrap();
    let venv = envs::collector_envs(&cfg, cfg.seed, 0).unwrap();
    assert_eq!(a, venv.obs().f32(), "rank 0 = single process");
}

fn divergence_named() {
    let outs = two_ranks("diverge");
    for o in &outs {
        assert!(
            o.stdout.contains("differs between rank 0 and rank 1"),
            "{}",
            o.stdout
        );
    }
}

// ------------------------------------------------------------------ SyncBatchNorm

fn bn_input(k: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(300 + k as u64);
    (0..2 * B * 3)
        .map(|_| rng.random_range(-2.0..5.0))
        .collect()
}

/// Rows `rows` of batch `k` as a `[rows, 3]` tensor on `device`.
fn bn_rows(k: usize, rows: &std::ops::Range<usize>, device: &Device) -> Tensor<2> {
    let x = bn_input(k)[rows.start * 3..rows.end * 3].to_vec();
    Tensor::<2>::from_data(TensorData::new(x, [rows.len(), 3]), device)
}

/// Two training forwards of rows `rows` of two batches; the outputs and running statistics.
fn bn_run(
    pg: Option<&ProcessGroup>,
    rows: std::ops::Range<usize>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let ad = Device::flex().autodiff();
    let bn = SyncBatchNorm::new(3, &ad);
    let mut out = Vec::new();
    for k in 0..2 {
        let y = bn.forward(bn_rows(k, &rows, &ad), pg).unwrap();
        out.extend(y.into_data().try_to_vec::<f32>().unwrap());
    }
    let (m, v) = bn.running_stats();
    (out, m, v)
}

/// The gradients of `sum(y * w)` (`w` fixed per row of the whole batch) with respect to the
/// input rows `rows`, gamma and beta, after one training forward.
fn bn_grads(
    pg: Option<&ProcessGroup>,
    rows: std::ops::Range<usize>,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let ad = Device::flex().autodiff();
    let bn = SyncBatchNorm::new(3, &ad);
    let x = bn_rows(0, &rows, &ad).require_grad();
    let w = bn_rows(7, &rows, &ad);
    let grads = (bn.forward(x.clone(), pg).unwrap() * w).sum().backward();
    let v = |t: Option<Tensor<2>>| t.unwrap().into_data().try_to_vec::<f32>().unwrap();
    let v1 = |t: Option<Tensor<1>>| t.unwrap().into_data().try_to_vec::<f32>().unwrap();
    (
        v(x.grad(&grads)),
        v1(bn.inner.gamma.grad(&grads)),
        v1(bn.inner.beta.grad(&grads)),
    )
}

fn sync_batch_norm() {
    let (whole, mean, var) = bn_run(None, 0..2 * B);
    let outs = two_ranks("sync_bn");
    for o in &outs {
        let r = o.rank;
        let want: Vec<f32> = (0..2)
            .flat_map(|k| {
                whole[k * 2 * B * 3 + r * B * 3..k * 2 * B * 3 + (r + 1) * B * 3].to_vec()
            })
            .collect();
        assert_close(
            &printed(o, "out"),
            &want,
            &format!("SyncBatchNorm outputs, rank {r}"),
        );
        assert_close(&printed(o, "mean"), &mean, "running mean");
        assert_close(&printed(o, "var"), &var, "running var");
    }
    // Without synchronisation the halves would be normalised differently.
    let (alone, _, _) = bn_run(None, 0..B);
    assert!(alone.iter().zip(&whole).any(|(a, b)| (a - b).abs() > 1e-3));
    // Backward: each rank's input gradient is its rows of the whole batch's (the sums of dy
    // and dy * x_hat all-reduced, as torch's); gamma's and beta's add up to the whole's.
    let (dx, dgamma, dbeta) = bn_grads(None, 0..2 * B);
    let (mut gamma_sum, mut beta_sum) = (vec![0f32; 3], vec![0f32; 3]);
    for o in &outs {
        let r = o.rank;
        assert_close(
            &printed(o, "dx"),
            &dx[r * B * 3..(r + 1) * B * 3],
            &format!("SyncBatchNorm input gradient, rank {r}"),
        );
        for (sum, g) in [
            (&mut gamma_sum, printed(o, "dgamma")),
            (&mut beta_sum, printed(o, "dbeta")),
        ] {
            sum.iter_mut().zip(g).for_each(|(s, g)| *s += g);
        }
    }
    assert_close(
        &gamma_sum,
        &dgamma,
        "gamma's gradient summed over the ranks",
    );
    assert_close(&beta_sum, &dbeta, "beta's gradient summed over the ranks");
    // A rank-local backward gives other input gradients.
    let (local, _, _) = bn_grads(None, 0..B);
    assert!(local.iter().zip(&dx).any(|(a, b)| (a - b).abs() > 1e-3));
}

/// A backward cannot return an error: when rank 1 is gone before rank 0's backward
/// all-reduce, rank 0's next forward (one needing no collective) returns it, naming the peer.
fn sync_batch_norm_lost_peer() {
    let outs = two_ranks("sync_bn_lost");
    let rank0 = &outs[0].stdout;
    let line = rank0
        .lines()
        .find_map(|l| l.strip_prefix("next forward: "))
        .unwrap_or_else(|| panic!("no report in {rank0}"));
    assert!(line.starts_with("Err") && line.contains("rank 1"), "{line}");
}

// ------------------------------------------------------------------ children

fn run_child(name: &str, pg: ProcessGroup) {
    let rank = pg.rank();
    match name {
        "dqn" => {
            let mut l = dqn_learner();
            l.distribute(pg, DdpOptions::default()).unwrap();
            for k in 0..STEPS {
                l.update(&half(&dqn_batch(k), rank), None).unwrap();
            }
            print("params", l.online.params());
        }
        "ppo" => {
            let mut t = ppo_trainer();
            // Tiny buckets: several all-reduces in flight per backward.
            t.distribute(pg, tiny_buckets(true)).unwrap();
            assert!(t.sync().unwrap().bucket_sizes().len() > 2);
            ppo_steps(&mut t, rank * B..(rank + 1) * B);
            print("params", t.params());
        }
        "overlap" => {
            // The same steps with the all-reduce during and after the backward pass.
            for (key, overlap) in [("during", true), ("after", false)] {
                let mut t = ppo_trainer();
                t.distribute(pg.clone(), tiny_buckets(overlap)).unwrap();
                ppo_steps(&mut t, rank * B..(rank + 1) * B);
                print(key, t.params());
                let early = t.sync().unwrap().early_buckets() as f32;
                print(&format!("early_{key}"), &[early]);
                let mut t = Trainer::new(shared_model(), 1e-8);
                t.distribute(pg.clone(), tiny_buckets(overlap)).unwrap();
                shared_steps(&mut t, rank * B..(rank + 1) * B);
                print(&format!("shared_{key}"), t.params());
            }
            // A backward pass that changes after the first step is refused, not averaged
            // wrong.
            let mut t = Trainer::new(shared_model(), 1e-8);
            t.distribute(pg.clone(), tiny_buckets(true)).unwrap();
            let changed = shared_steps_changing(&mut t, rank * B..(rank + 1) * B, 1);
            println!(
                "changed: {}",
                changed.err().map_or("ok".into(), |e| e.to_string())
            );
        }
        "no_sync" => {
            let mut t = q_trainer();
            t.distribute(pg, DdpOptions::default()).unwrap();
            accumulate_steps(&mut t, rank * B..(rank + 1) * B).unwrap();
            print("params", t.params());
        }
        "seeds" => {
            let cfg = Config::parse(
                "[env]\nid = \"CartPole-v1\"\n[policy]\ntype = \"dqn\"\nmulti_gpu = true\n",
                "t.toml",
                &[],
            )
            .unwrap();
            let ranks = Ranks::new(Some(pg));
            assert_eq!((ranks.rank(), ranks.world()), (rank, 2));
            let venv = envs::collector_envs(&cfg, cfg.seed, ranks.rank()).unwrap();
            print("obs", venv.obs().f32());
        }
        "diverge" => {
            let mut t = q_trainer();
            t.distribute(pg.clone(), DdpOptions::default()).unwrap();
            t.sync().unwrap().check_params(t.params()).unwrap();
            if rank == 1 {
                let mut params = t.params().to_vec();
                params[t.layout().slots[1].offset] += 1e-3;
                let adam = t.adam().clone();
                t.restore(params, adam);
            }
            let e = t.sync().unwrap().check_params(t.params()).unwrap_err();
            assert!(matches!(&e, TrainError::Diverged { rank: 1, .. }), "{e}");
            assert!(e.to_string().contains(&t.layout().slots[1].name), "{e}");
            println!("{e}");
        }
        "sync_bn" => {
            let (out, mean, var) = bn_run(Some(&pg), rank * B..(rank + 1) * B);
            print("out", &out);
            print("mean", &mean);
            print("var", &var);
            let (dx, dgamma, dbeta) = bn_grads(Some(&pg), rank * B..(rank + 1) * B);
            print("dx", &dx);
            print("dgamma", &dgamma);
            print("dbeta", &dbeta);
        }
        "sync_bn_lost" => {
            let ad = Device::flex().autodiff();
            let bn = SyncBatchNorm::new(3, &ad);
            let x = bn_rows(0, &(rank * B..(rank + 1) * B), &ad).require_grad();
            let y = bn.forward(x.clone(), Some(&pg)).unwrap();
            if rank == 1 {
                return;
            }
            let _ = y.sum().backward();
            // Alone, so that only the backward's error can come back.
            match bn.forward(x, None) {
                Ok(_) => println!("next forward: Ok"),
                Err(e) => println!("next forward: Err: {e}"),
            }
        }
        other => panic!("unknown child {other}"),
    }
}
