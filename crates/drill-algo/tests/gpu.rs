//! The GPU backend (`--features gpu`: burn's wgpu on Vulkan) against the CPU one: tensor
//! operations with their gradients, one DQN update and one PPO update, and DataParallel's
//! batch split over the GPU (twice, and beside the CPU), equal within float tolerance. CI runs it on Mesa's lavapipe, a software Vulkan device; with no adapter it
//! fails (naming what to install) rather than skipping.
#![cfg(feature = "gpu")]

use burn::tensor::{Device, Distribution, Tensor, TensorData};
use drill_algo::compute::{conv2d, linear, select_device};
use drill_algo::data::{Batch, Rollout};
use drill_algo::ddp::DataParallel;
use drill_algo::dqn::Dqn;
use drill_algo::nets::{Input, QNet};
use drill_algo::optim::Trainer;
use drill_algo::policy::{LearnOutput, Policy};
use drill_algo::ppo::Ppo;
use drill_config::{Config, Policy as PolicyConfig};
use drill_env::{ActionBuf, ObsBuf};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::ops::Range;

fn config(name: &str, overrides: &[&str]) -> Config {
    let path = format!("{}/../../configs/{name}", env!("CARGO_MANIFEST_DIR"));
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    Config::load(&path, &overrides).expect("a shipped config")
}

fn gpu() -> Device {
    let cfg = config("cartpole_dqn.toml", &["policy.cuda=true"]);
    select_device(&cfg).unwrap_or_else(|e| panic!("the GPU tests need a Vulkan adapter: {e}"))
}

fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: gpu {x} vs cpu {y}"
        );
    }
}

/// A tracked leaf tensor of `shape` holding `d`, on `device`.
fn leaf<const D: usize>(d: &TensorData, shape: [usize; D], device: &Device) -> Tensor<D> {
    Tensor::<1>::from_data(d.clone(), device)
        .reshape(shape)
        .detach()
        .require_grad()
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .try_to_vec::<f32>()
        .expect("f32 values")
}

#[test]
fn tensor_ops_and_their_gradients_agree_with_the_cpu() {
    let (cpu, gpu) = (Device::flex().autodiff(), gpu().autodiff());
    cpu.seed(1);
    let data = |dims: &[usize]| -> TensorData {
        Tensor::<1>::random(
            [dims.iter().product::<usize>()],
            Distribution::Uniform(-1.0, 1.0),
            &cpu,
        )
        .into_data()
    };
    let (x, w, b) = (data(&[2, 4, 20, 20]), data(&[8, 4, 8, 8]), data(&[8]));
    let (w2, b2, r) = (data(&[8 * 4 * 4, 5]), data(&[5]), data(&[2, 5]));
    let run = |device: &Device| {
        let x = leaf(&x, [2, 4, 20, 20], device);
        let w = leaf(&w, [8, 4, 8, 8], device);
        let b = leaf(&b, [8], device);
        let w2 = leaf(&w2, [128, 5], device);
        let b2 = leaf(&b2, [5], device);
        let r = Tensor::<1>::from_data(r.clone(), device).reshape([2, 5]);
        let h = conv2d(x.clone(), w.clone(), b.clone(), [4, 4], true);
        let y = linear(h.flatten(1, 3), w2.clone(), b2.clone(), false);
        let loss = (y.clone() * r).sum() + y.clone().matmul(y.clone().transpose()).sum();
        let g = loss.backward();
        let grads: Vec<Vec<f32>> = vec![
            values(x.grad(&g).unwrap()),
            values(w.grad(&g).unwrap()),
            values(b.grad(&g).unwrap()),
            values(w2.grad(&g).unwrap()),
            values(b2.grad(&g).unwrap()),
        ];
        (values(y), grads)
    };
    let (y_cpu, g_cpu) = run(&cpu);
    let (y_gpu, g_gpu) = run(&gpu);
    close(&y_gpu, &y_cpu, 1e-4, "y");
    for (i, (a, b)) in g_gpu.iter().zip(&g_cpu).enumerate() {
        close(a, b, 1e-3, &format!("gradient {i}"));
    }
}

#[test]
fn one_dqn_update_agrees_with_the_cpu() {
    let cfg = config("cartpole_dqn.toml", &[]);
    let PolicyConfig::Dqn(p) = &cfg.policy else {
        panic!("a DQN config")
    };
    let mut on_cpu = Dqn::from_config(&cfg, p, &Device::flex()).unwrap();
    let mut on_gpu = Dqn::from_config(&cfg, p, &gpu()).unwrap();
    on_gpu.load_state_dict(&on_cpu.state_dict()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let bs = 64;
    let batch = Batch {
        obs: ObsBuf::F32((0..bs * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
        next_obs: ObsBuf::F32((0..bs * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
        actions: ActionBuf::Discrete((0..bs).map(|_| rng.random_range(0..2)).collect()),
        rewards: vec![1.0; bs],
        dones: (0..bs).map(|k| (k % 7 == 0) as u8 as f32).collect(),
        discounts: vec![0.97; bs],
        weights: vec![1.0; bs],
        indices: (0..bs).collect(),
    };
    for step in 0..3 {
        let a = on_cpu.update(&batch, None).unwrap();
        let b = on_gpu.update(&batch, None).unwrap();
        close(&[b.loss], &[a.loss], 1e-3, &format!("loss at step {step}"));
        close(&[b.grad_norm], &[a.grad_norm], 1e-3, "gradient norm");
    }
    close(&on_gpu.weights(), &on_cpu.weights(), 1e-3, "parameters");
}

/// One `learn` call of the same PPO on the CPU and on the GPU: equal losses and weights.
fn learn_on_both(on_cpu: &mut Ppo, on_gpu: &mut Ppo, rollout: &Rollout) {
    let (mut out_cpu, mut out_gpu) = (LearnOutput::default(), LearnOutput::default());
    on_cpu
        .learn(rollout, 0, &mut ChaCha8Rng::seed_from_u64(1), &mut out_cpu)
        .unwrap();
    on_gpu
        .learn(rollout, 0, &mut ChaCha8Rng::seed_from_u64(1), &mut out_gpu)
        .unwrap();
    close(&[out_gpu.loss], &[out_cpu.loss], 1e-3, "loss");
    close(&on_gpu.weights(), &on_cpu.weights(), 1e-3, "parameters");
}

#[test]
fn one_ppo_update_agrees_with_the_cpu() {
    let cfg = config(
        "cartpole_v1_ppo.toml",
        &[
            "policy.learn.epoch_per_collect=1",
            "policy.learn.batch_size=64",
        ],
    );
    let PolicyConfig::Ppo(p) = &cfg.policy else {
        panic!("a PPO config")
    };
    let alone = drill_algo::ddp::Ranks::alone();
    let mut on_cpu = Ppo::from_config(&cfg, p, &Device::flex(), alone.clone()).unwrap();
    let mut on_gpu = Ppo::from_config(&cfg, p, &gpu(), alone).unwrap();
    on_gpu.load_state_dict(&on_cpu.state_dict()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let n = 64;
    let mut uniform = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(lo..hi)).collect()
    };
    let rollout = Rollout {
        obs_dim: 4,
        num_envs: 1,
        obs: ObsBuf::F32(uniform(n * 4, -1.0, 1.0)),
        actions: ActionBuf::Discrete((0..n as u32).map(|k| k % 2).collect()),
        logp: uniform(n, -1.0, -0.5),
        rewards: vec![1.0; n],
        terminated: vec![false; n],
        ended: vec![false; n],
        values: uniform(n, 0.0, 1.0),
        next_values: uniform(n, 0.0, 1.0),
        adv: uniform(n, -1.0, 1.0),
        returns: uniform(n, 0.0, 2.0),
        ..Rollout::default()
    };
    learn_on_both(&mut on_cpu, &mut on_gpu, &rollout);
}

/// DataParallel (torch's `nn.DataParallel`) with a replica on the GPU: the batch split over
/// [GPU, GPU] (two replicas on one adapter, as on a one-GPU machine) and over [CPU, GPU] (two
/// devices in one process) gives the whole batch's gradient as computed on the CPU alone.
#[test]
fn data_parallel_over_the_gpu_gives_the_whole_batch_gradient() {
    let cpu = Device::flex();
    cpu.seed(3);
    let rows = 37;
    let data: Vec<f32> = (0..rows * 4)
        .map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let loss = |net: &QNet, rows: Range<usize>, device: &Device| {
        let x = Tensor::<2>::from_data(
            TensorData::new(data[rows.start * 4..rows.end * 4].to_vec(), [rows.len(), 4]),
            device,
        );
        let y = net.forward(Input::Float(x));
        (y.clone() * y).mean()
    };
    let mut one = Trainer::new(
        QNet::new(4, &[32, 32], 2, true, &cpu.clone().autodiff()),
        1e-8,
    );
    one.backward(loss(one.model(), 0..rows, &cpu.clone().autodiff()))
        .unwrap();
    for devices in [vec![gpu(), gpu()], vec![cpu.clone(), gpu()]] {
        let mut split = Trainer::new(one.model().clone(), 1e-8);
        let mut dp = DataParallel::new(devices);
        dp.backward(&mut split, rows, |m, r, d| loss(m, r, d));
        close(split.grads(), one.grads(), 1e-4, "gradients");
    }
}

/// An LSTM policy's update (sequences from stored initial states, episode ends inside)
/// agrees with the CPU's: the GPU steps burn's cell through time, the CPU runs drill's
/// recurrence operation.
#[test]
fn one_lstm_ppo_update_agrees_with_the_cpu() {
    let cfg = config(
        "cartpole_novel_ppo_lstm.toml",
        &["policy.learn.epoch_per_collect=1"],
    );
    let PolicyConfig::Ppo(p) = &cfg.policy else {
        panic!("a PPO config")
    };
    let alone = drill_algo::ddp::Ranks::alone();
    let mut on_cpu = Ppo::from_config(&cfg, p, &Device::flex(), alone.clone()).unwrap();
    let mut on_gpu = Ppo::from_config(&cfg, p, &gpu(), alone).unwrap();
    on_gpu.load_state_dict(&on_cpu.state_dict()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let (envs, n) = (8, 512);
    let mut uniform = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(lo..hi)).collect()
    };
    let mut hidden0 = drill_algo::policy::Hidden::zeros(envs, 128);
    hidden0
        .rows_mut(envs, 128)
        .copy_from_slice(&uniform(envs * 128, -0.5, 0.5));
    let rollout = Rollout {
        obs_dim: 2,
        num_envs: envs,
        obs: ObsBuf::F32(uniform(n * 2, -1.0, 1.0)),
        actions: ActionBuf::Discrete((0..n as u32).map(|k| k % 2).collect()),
        logp: uniform(n, -1.0, -0.5),
        rewards: vec![1.0; n],
        terminated: (0..n).map(|k| k % 29 == 28).collect(),
        ended: (0..n).map(|k| k % 29 == 28).collect(),
        values: uniform(n, 0.0, 1.0),
        adv: uniform(n, -1.0, 1.0),
        returns: uniform(n, 0.0, 2.0),
        hidden0,
        ..Rollout::default()
    };
    learn_on_both(&mut on_cpu, &mut on_gpu, &rollout);
}
