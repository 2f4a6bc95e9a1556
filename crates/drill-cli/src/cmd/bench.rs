//! `drill bench`: environment and learner speed, printed as a table or JSON lines.
//!
//! Instruction counts per op: run one case under callgrind twice with different `--iters`
//! and divide the difference, e.g.
//! `valgrind --tool=callgrind target/release/drill bench learner --case dqn-update --iters 200`.

use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use drill_algo::data::Batch;
use drill_algo::dqn::{Dqn, greedy};
use drill_algo::nets::{ConvEncoder, NatureCnn, QNet};
use drill_algo::optim::Trainer;
use drill_config::DqnPolicy;
use drill_env::classic::CartPole;
use drill_env::{Action, Actions, Env, make_vec};
use drill_env::{ActionBuf, Obs, ObsBuf};
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// What to measure.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Environment steps per second: CartPole single and vectorised, or `--env ID` vectorised
    /// (`--num-envs`, `--env-threads`).
    Env,
    /// DQN updates (CartPole nets; DI-engine's Pong net), Nature-CNN updates (with the machine's FMA peak) and forward passes of batch 4 and 8, CartPole's MLP's batch-8 inference, an LSTM PPO minibatch update (`lstm-ppo-update`: CleanRL ppo_atari_lstm's recurrent core); `scripts/bench_learner_vs_torch.sh` runs them side by side with PyTorch. `--case nature-cnn-products` (by name only; with `--threads 1`) times each matrix product inside the Nature-CNN update, and again alone with its operands hot in cache, then the Adam step alone and the floor the two set under the update.
    Learner,
    /// Replay memory: bytes per stored transition, filled from `--env` (default
    /// PongNoFrameskip-v4) with random actions; `--iters` transitions (default 20000); and
    /// the `--save-replay` file: bytes, save and restore seconds.
    Replay,
    /// Collectives, verified then timed; run under `drill launch` (or mpirun).
    Comm,
    /// Task runtime: overhead per step of 5 no-op middlewares, with and without the StepTimer.
    Task,
    /// An update alone and with DDP gradient averaging across the job's ranks (the
    /// all-reduce started during backward, and after it): the sync overhead. A DQN update on
    /// DI-engine's CartPole net, its Pong net with `--case pong`, or `pong_ppo`'s PPO
    /// minibatch with `--case pong-ppo`. Run under `drill launch --nproc-per-node 2`.
    Ddp,
}

/// Arguments of `drill bench`.
#[derive(clap::Args)]
pub struct Args {
    /// `env` or `learner`.
    pub target: Target,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only the case with this name (see the table's first column).
    #[arg(long)]
    pub case: Option<String>,
    /// learner, ddp: on the GPU that `policy.cuda = true` would pick, instead of the CPU.
    #[arg(long)]
    pub gpu: bool,
    /// Timed repetitions per case (default: chosen per case).
    #[arg(long)]
    pub iters: Option<usize>,
    /// learner: batch of the Nature-CNN update cases (`pong_ppo`'s minibatch is 256).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub batch: u16,
    /// env: benchmark this id instead of CartPole (e.g. PongNoFrameskip-v4), vectorised.
    #[arg(long)]
    pub env: Option<String>,
    /// env with --env: copies stepped together.
    #[arg(long, default_value_t = 8)]
    pub num_envs: usize,
    /// env with --env: worker threads stepping them (not the global `--threads`, which sizes
    /// the tensor thread pool the learner cases run on).
    #[arg(long, default_value_t = 2)]
    pub env_threads: usize,
    /// comm: backend (tcp, mpi, nccl; default DRILL_BACKEND or tcp).
    #[arg(long)]
    pub backend: Option<String>,
    /// comm: operations, comma-separated, or `all` (all_reduce, broadcast, reduce, all_gather,
    /// gather, scatter, reduce_scatter, send_recv = ranks 0 and 1, barrier, tcp_stream = one
    /// plain TCP stream between ranks 0 and 1, on the network that reaches the store).
    #[arg(long)]
    pub ops: Option<String>,
    /// comm: message sizes in bytes, comma-separated (K/M/G suffixes), default 1K,64K,1M,16M,64M;
    /// each at least one f32 per rank, rounded down to a whole number of them.
    #[arg(long)]
    pub sizes: Option<String>,
}

struct Report {
    json: bool,
}

impl Report {
    fn row(&self, case: &str, unit: &str, median: f64, iters: usize, note: &str) {
        if self.json {
            println!(
                r#"{{"case":"{case}","median_{unit}":{median:.3},"iters":{iters},"note":"{note}"}}"#
            );
        } else {
            println!("{case:<28} {median:>14.3} {unit:<10} ({iters} iters) {note}");
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Time `f` `iters` times after `warmup` calls; median microseconds.
fn time_us(warmup: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    median(
        (0..iters)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect(),
    )
}

/// One learner of `bench ddp`: a DQN update on a batch, or a PPO minibatch update.
enum Learner {
    Dqn(Box<(Dqn, Batch)>),
    Ppo(Box<PpoStep>),
}

/// `pong_ppo`'s actor-critic (Nature CNN, 6 actions) and one minibatch of its rollouts.
struct PpoStep {
    trainer: Trainer<drill_algo::nets::ActorCritic>,
    policy: drill_config::PpoPolicy,
    rollout: drill_algo::data::Rollout,
    rows: Vec<usize>,
}

impl PpoStep {
    /// One minibatch update of the sequences `cols` (the rows `self.rows`).
    fn update(&mut self, cols: &[usize]) -> Result<(), drill_algo::TrainError> {
        let ad = Device::flex().autodiff();
        let seqs = drill_algo::ppo::Sequences {
            steps: self.rows.len() / cols.len(),
            cols,
        };
        drill_algo::ppo::minibatch_update(
            &mut self.trainer,
            &self.policy,
            &drill_env::ActionSpace::Discrete(6),
            &ad,
            &self.rows,
            Some(seqs),
            &self.rollout,
            self.policy.learn.learning_rate,
        )
        .map(drop)
    }
}

impl Learner {
    fn update(&mut self) -> Result<(), drill_algo::TrainError> {
        match self {
            Learner::Dqn(d) => d.0.update(&d.1, None).map(drop),
            Learner::Ppo(s) => {
                let ad = Device::flex().autodiff();
                let lr = s.policy.learn.learning_rate;
                drill_algo::ppo::minibatch_update(
                    &mut s.trainer,
                    &s.policy,
                    &drill_env::ActionSpace::Discrete(6),
                    &ad,
                    &s.rows,
                    None,
                    &s.rollout,
                    lr,
                )
                .map(drop)
            }
        }
    }

    fn distribute(
        &mut self,
        pg: drill_comm::ProcessGroup,
        opts: drill_algo::optim::DdpOptions,
    ) -> Result<(), drill_algo::TrainError> {
        match self {
            Learner::Dqn(d) => d.0.distribute(pg, opts),
            Learner::Ppo(s) => s.trainer.distribute(pg, opts),
        }
    }

    fn params(&self) -> usize {
        match self {
            Learner::Dqn(d) => d.0.online.params().len(),
            Learner::Ppo(s) => s.trainer.params().len(),
        }
    }

    /// Buckets started during backward so far, and buckets per update (when distributed).
    fn buckets(&self) -> Option<(u64, usize)> {
        let sync = match self {
            Learner::Dqn(d) => d.0.online.sync(),
            Learner::Ppo(s) => s.trainer.sync(),
        }?;
        Some((sync.early_buckets(), sync.bucket_sizes().len()))
    }
}

/// `pong_ppo`'s learner (its config's model and learning keys) and a random minibatch of 256
/// stacked u8 frames, as its rollouts hand them over.
fn pong_ppo_learner(device: &Device, rng: &mut rand_chacha::ChaCha8Rng) -> anyhow::Result<Learner> {
    let cfg = drill_config::Config::parse(
        include_str!("../../../../configs/pong_ppo.toml"),
        "configs/pong_ppo.toml",
        &[],
    )?;
    let drill_config::Policy::Ppo(policy) = cfg.policy.clone() else {
        anyhow::bail!("configs/pong_ppo.toml is not a PPO config");
    };
    let spec = drill_env::EnvSpec {
        id: cfg.env.id.clone(),
        obs: drill_env::ObsSpace {
            shape: vec![4, 84, 84],
            dtype: drill_env::Dtype::U8,
        },
        action_space: drill_env::ActionSpace::Discrete(6),
        max_episode_steps: None,
        reward_threshold: None,
    };
    let agent = drill_algo::ppo::build_agent(&cfg, &policy, &spec, &device.clone().autodiff())?;
    let n = policy.learn.batch_size;
    let rollout = drill_algo::data::Rollout {
        obs_dim: 4 * 84 * 84,
        num_envs: 1,
        obs: ObsBuf::U8((0..n * 4 * 84 * 84).map(|_| rng.random::<u8>()).collect()),
        actions: ActionBuf::Discrete((0..n).map(|_| rng.random_range(0u32..6)).collect()),
        logp: (0..n).map(|_| rng.random_range(-2.0..-1.5)).collect(),
        adv: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        returns: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        values: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        ..drill_algo::data::Rollout::default()
    };
    Ok(Learner::Ppo(Box::new(PpoStep {
        trainer: Trainer::new(agent, 1e-5),
        policy,
        rollout,
        rows: (0..n).collect(),
    })))
}

/// Sequences per minibatch and their steps in `lstm-ppo-update`: CleanRL ppo_atari_lstm's
/// minibatch (8 envs x 128 steps in 4 minibatches: 2 envs' sequences).
const LSTM_SEQS: usize = 2;
const LSTM_STEPS: usize = 128;

/// `lstm-ppo-update`: an actor-critic whose LSTM core (hidden 128) reads 512 features (the
/// Nature CNN's output in CleanRL's ppo_atari_lstm; here the observations, so the case times
/// the recurrent core and its heads), 6 actions, `pong_ppo`'s loss keys; a rollout of 8
/// sequences of `LSTM_STEPS` with an episode end every 37 rows; the minibatch's columns.
fn lstm_ppo_step(device: &Device, rng: &mut rand_chacha::ChaCha8Rng) -> (PpoStep, Vec<usize>) {
    let cfg = drill_config::Config::parse(
        include_str!("../../../../configs/pong_ppo.toml"),
        "configs/pong_ppo.toml",
        &[],
    )
    .expect("the embedded pong_ppo.toml parses");
    let drill_config::Policy::Ppo(mut policy) = cfg.policy.clone() else {
        unreachable!("configs/pong_ppo.toml is a PPO config")
    };
    // CleanRL's heads: one linear layer each, reading the LSTM's output.
    policy.model.obs_shape = None;
    policy.model.encoder_hidden_size_list = Vec::new();
    policy.model.lstm_hidden_size = Some(128);
    let spec = drill_env::EnvSpec {
        id: cfg.env.id.clone(),
        obs: drill_env::ObsSpace::vector(512),
        action_space: drill_env::ActionSpace::Discrete(6),
        max_episode_steps: None,
        reward_threshold: None,
    };
    let agent = drill_algo::ppo::build_agent(&cfg, &policy, &spec, &device.clone().autodiff())
        .expect("the LSTM actor-critic builds");
    let (envs, n) = (8, 8 * LSTM_STEPS);
    let rollout = drill_algo::data::Rollout {
        obs_dim: 512,
        num_envs: envs,
        obs: ObsBuf::F32((0..n * 512).map(|_| rng.random_range(0.0..1.0)).collect()),
        actions: ActionBuf::Discrete((0..n).map(|_| rng.random_range(0u32..6)).collect()),
        logp: (0..n).map(|_| rng.random_range(-2.0..-1.5)).collect(),
        adv: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        returns: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        values: (0..n).map(|_| rng.random_range(-1.0..1.0)).collect(),
        ended: (0..n).map(|k| k % 37 == 36).collect(),
        hidden0: drill_algo::policy::Hidden::zeros(envs, 256),
        ..drill_algo::data::Rollout::default()
    };
    let cols: Vec<usize> = (0..LSTM_SEQS).collect();
    let rows = (0..LSTM_STEPS)
        .flat_map(|t| cols.iter().map(move |&j| t * envs + j))
        .collect();
    let step = PpoStep {
        trainer: Trainer::new(agent, 1e-5),
        policy,
        rollout,
        rows,
    };
    (step, cols)
}

/// Updates (a DQN update on DI-engine's CartPole net, batch 64, or with `case` "pong" its Pong
/// net, batch 32; with "pong-ppo" a PPO minibatch update of `pong_ppo`, batch 256) on `device`
/// without and with DDP on this job's ranks; every rank times both in lock step, rank 0
/// prints the medians and the overhead.
fn ddp_bench(
    report: &Report,
    case: Option<&str>,
    device: Device,
    iters: Option<usize>,
) -> anyhow::Result<()> {
    let pg = drill_comm::ProcessGroup::from_env()?;
    device.seed(0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(pg.rank() as u64);
    let (what, net) = match case {
        None | Some("cartpole") => ("dqn-update", "cartpole net, batch 64"),
        Some("pong") => ("dqn-update", "pong net, batch 32"),
        Some("pong-ppo") => ("ppo-update", "pong_ppo actor-critic, minibatch 256"),
        Some(other) => {
            anyhow::bail!("--case {other}: bench ddp knows `cartpole`, `pong` and `pong-ppo`")
        }
    };
    let mut learner = || -> anyhow::Result<Learner> {
        Ok(match case {
            Some("pong") => Learner::Dqn(Box::new(pong_learner(&device, &mut rng))),
            Some("pong-ppo") => pong_ppo_learner(&device, &mut rng)?,
            _ => Learner::Dqn(Box::new(cartpole_learner(&device, &mut rng))),
        })
    };
    let mut alone = learner()?;
    // The all-reduce started during the backward pass (the default), and after it.
    let (mut ddp, mut after) = (learner()?, learner()?);
    let opts = drill_algo::optim::DdpOptions::default();
    ddp.distribute(pg.clone(), opts)?;
    after.distribute(
        pg.clone(),
        drill_algo::optim::DdpOptions {
            overlap: false,
            ..opts
        },
    )?;
    let small = matches!(case, None | Some("cartpole")) && device == Device::flex();
    let (n, warmup) = if small { (2000, 100) } else { (20, 3) };
    let n = iters.unwrap_or(n);
    // Interleaved, so both see the same machine load (this host is shared and noisy).
    let mut us = [(); 3].map(|_| Vec::with_capacity(n));
    pg.barrier()?;
    for i in 0..n + warmup {
        let t = Instant::now();
        alone.update().expect("one process");
        let a = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        ddp.update()?;
        let d = t.elapsed().as_secs_f64() * 1e6;
        let t = Instant::now();
        after.update()?;
        let f = t.elapsed().as_secs_f64() * 1e6;
        if i >= warmup {
            for (v, x) in us.iter_mut().zip([a, d, f]) {
                v.push(x);
            }
        }
    }
    let [alone_us, ddp_us, after_us] = us;
    let (t_alone, t_ddp, t_after) = (median(alone_us), median(ddp_us), median(after_us));
    let params = ddp.params();
    let mut grads = vec![0.0f32; params];
    let t_sync = time_us(warmup.min(n), n, || {
        pg.all_reduce(&mut grads, drill_comm::ReduceOp::Avg)
            .expect("all_reduce");
    });
    let (early, buckets) = ddp.buckets().expect("distributed");
    let mut times = [t_alone, t_ddp, t_sync, t_after];
    pg.all_reduce(&mut times, drill_comm::ReduceOp::Max)?;
    if pg.is_main() {
        let w = pg.world_size();
        report.row(
            &format!("{what}-alone"),
            "us",
            times[0],
            n,
            &format!("{net}, {params} params, {w} ranks busy, {device:?}"),
        );
        report.row(
            &format!("{what}-ddp"),
            "us",
            times[1],
            n,
            &format!(
                "same, gradients averaged over {w} ranks, {} of {} buckets started during backward",
                early,
                buckets * (n + warmup),
            ),
        );
        report.row(
            &format!("{what}-ddp-after"),
            "us",
            times[3],
            n,
            "same, each bucket's all-reduce started after the backward pass",
        );
        report.row(
            "overlap-hidden",
            "percent",
            100.0 * (times[3] - times[1]) / (times[3] - times[0]).max(1e-9),
            n,
            "share of DDP's cost that starting buckets during backward hides: (after - ddp) / (after - alone)",
        );
        report.row(
            "grad-all_reduce",
            "us",
            times[2],
            n,
            &format!("{} KiB, {}", params * 4 / 1024, pg.backend_name()),
        );
        report.row(
            "ddp-overhead",
            "percent",
            100.0 * (times[1] - times[0]) / times[0],
            n,
            "(ddp - alone) / alone, slowest rank",
        );
    }
    Ok(())
}

/// Per-step cost of the task runtime itself: 5 middlewares that do nothing.
fn task_bench(report: &Report, iters: Option<usize>) {
    use drill_task::{Middleware, OnlineRLContext, Task, TaskError, TaskHandle};
    struct Noop;
    impl Middleware<OnlineRLContext> for Noop {
        fn name(&self) -> String {
            "noop".into()
        }
        fn forward(&mut self, _: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
            Ok(())
        }
    }
    let n = iters.unwrap_or(1_000_000) as u64;
    for timed in [false, true] {
        let mut task = Task::<OnlineRLContext>::new();
        if timed {
            task.step_timer(0);
        }
        for _ in 0..5 {
            task.use_mw(Noop);
        }
        let t = Instant::now();
        task.run(Some(n)).expect("no-op middlewares cannot fail");
        let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let (case, note) = if timed {
            (
                "task-step-5-noop-timed",
                "5 no-op middlewares, StepTimer on; mean per step",
            )
        } else {
            (
                "task-step-5-noop",
                "5 no-op middlewares (forward + backward + renew); mean per step",
            )
        };
        report.row(case, "us", us, n as usize, note);
    }
}

/// The CPU, or with `gpu` the device `policy.cuda = true` selects.
fn device(gpu: bool) -> anyhow::Result<Device> {
    if !gpu {
        return Ok(Device::flex());
    }
    drill_algo::compute::gpu().map_err(|why| anyhow::anyhow!("--gpu: {why}"))
}

/// Run the selected benchmarks.
pub fn run(args: Args) -> anyhow::Result<()> {
    let report = Report { json: args.json };
    let want = |name: &str| args.case.as_deref().is_none_or(|c| c == name);
    match args.target {
        Target::Env => match &args.env {
            Some(id) => {
                return vec_env_bench(&report, id, args.num_envs, args.env_threads, args.iters);
            }
            None => env_bench(&report, &want, args.iters),
        },
        Target::Ddp => {
            return ddp_bench(&report, args.case.as_deref(), device(args.gpu)?, args.iters);
        }
        Target::Learner if args.gpu && args.case.as_deref() == Some("nature-cnn-products") => {
            anyhow::bail!(
                "--case nature-cnn-products times drill's CPU products; it does not run with --gpu"
            )
        }
        Target::Task => task_bench(&report, args.iters),
        Target::Learner => learner_bench(
            &report,
            &want,
            args.case.as_deref(),
            device(args.gpu)?,
            args.iters,
            usize::from(args.batch),
        ),
        Target::Replay => {
            return replay_bench(
                &report,
                args.env.as_deref().unwrap_or("PongNoFrameskip-v4"),
                args.num_envs,
                args.iters,
            );
        }
        Target::Comm => {
            return super::comm_bench::run(
                args.backend.as_deref(),
                args.ops.as_deref(),
                args.sizes.as_deref(),
                args.iters,
                args.json,
            );
        }
    }
    Ok(())
}

fn env_bench(report: &Report, want: &dyn Fn(&str) -> bool, iters: Option<usize>) {
    let steps = iters.unwrap_or(20_000_000);
    if want("cartpole-single") {
        // One env, alternating actions (episodes end and reset as in training), 5 repeats.
        let mut env = CartPole::new("CartPole-v1");
        let mut obs = [0f32; 4];
        env.reset(Some(0), &mut obs);
        let rates: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                for k in 0..steps / 5 {
                    let s = env.step(Action::Discrete(k & 1), &mut obs);
                    if s.terminated {
                        env.reset(None, &mut obs);
                    }
                }
                (steps / 5) as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        report.row(
            "cartpole-single",
            "steps/s",
            median(rates),
            steps,
            "1 thread, Env::step + reset",
        );
    }
    for n in [8usize, 64, 256] {
        let name = format!("cartpole-vec{n}");
        if !want(&name) {
            continue;
        }
        let mut venv = make_vec("CartPole-v1", n, 0, 1).expect("known id");
        venv.reset(None).expect("a native env");
        let actions: Vec<u32> = (0..n as u32).map(|i| i & 1).collect();
        let calls = steps / n / 5;
        let rates: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..calls {
                    venv.step(Actions::Discrete(&actions))
                        .expect("a native env");
                }
                (calls * n) as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        report.row(
            &name,
            "steps/s",
            median(rates),
            calls * n * 5,
            "1 thread, VecEnv with auto-reset + TimeLimit",
        );
    }
}

/// `id` vectorised: `n` copies on `threads` threads, uniformly random actions (as ale-py's
/// and envpool's benchmarks step), auto-reset included; 5 timed repeats after a warm-up.
fn vec_env_bench(
    report: &Report,
    id: &str,
    n: usize,
    threads: usize,
    iters: Option<usize>,
) -> anyhow::Result<()> {
    let mut venv = make_vec(id, n, 0, threads)?;
    venv.reset(None)?;
    let spec = venv.spec().clone();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let steps = iters.unwrap_or(50_000);
    let calls = (steps / n / 5).max(1);
    let mut table = vec![0u32; 4096 * n];
    let mut cont = vec![0f32; 4096 * n * spec.action_space.dim()];
    match &spec.action_space {
        drill_env::ActionSpace::Discrete(k) => table
            .iter_mut()
            .for_each(|a| *a = rng.random_range(0..*k as u32)),
        drill_env::ActionSpace::Continuous { .. } => cont
            .iter_mut()
            .for_each(|a| *a = rng.random_range(-1.0..1.0)),
    }
    let d = spec.action_space.dim();
    let mut step = |k: usize| {
        let k = k % 4096;
        match &spec.action_space {
            drill_env::ActionSpace::Discrete(_) => {
                venv.step(Actions::Discrete(&table[k * n..(k + 1) * n]))
            }
            drill_env::ActionSpace::Continuous { .. } => {
                venv.step(Actions::Continuous(&cont[k * n * d..(k + 1) * n * d]))
            }
        }
    };
    for k in 0..calls.min(100) {
        step(k)?;
    }
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for k in 0..calls {
            step(k)?;
        }
        rates.push((calls * n) as f64 / t.elapsed().as_secs_f64());
    }
    report.row(
        &format!("{id}-vec{n}"),
        "steps/s",
        median(rates),
        calls * n * 5,
        &format!(
            "{threads} threads, obs {:?} {:?}, random actions, auto-reset",
            spec.obs.shape, spec.obs.dtype
        ),
    );
    Ok(())
}

/// Fill a replay buffer from `id` (`n` copies, random actions, 1-step transitions as the
/// collector stores them) and report its bytes per transition against whole stacks.
fn replay_bench(report: &Report, id: &str, n: usize, iters: Option<usize>) -> anyhow::Result<()> {
    use drill_algo::data::{ReplayBuffer, Transition};
    let total = iters.unwrap_or(20_000);
    let mut venv = make_vec(id, n, 0, 2)?;
    let spec = venv.spec().clone();
    let d = spec.obs_dim();
    let drill_env::ActionSpace::Discrete(k) = spec.action_space else {
        anyhow::bail!("drill bench replay takes a discrete-action env; {id} is continuous");
    };
    let mut buffer = ReplayBuffer::new(total, &spec.obs, &spec.action_space);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let mut prev = ObsBuf::new(spec.obs.dtype);
    prev.extend(venv.reset(None)?);
    let mut actions = vec![0u32; n];
    let t = Instant::now();
    while buffer.len() < total {
        actions
            .iter_mut()
            .for_each(|a| *a = rng.random_range(0..k as u32));
        venv.step(Actions::Discrete(&actions))?;
        let room = n.min(total - buffer.len());
        for (i, &a) in actions.iter().enumerate().take(room) {
            buffer.push(&Transition {
                obs: prev.as_obs().rows(i..i + 1, d),
                action: Action::Discrete(a as usize),
                reward: venv.rewards()[i],
                next_obs: venv.final_obs().rows(i..i + 1, d),
                done: venv.terminated()[i],
                discount: 0.99,
            });
        }
        prev.clear();
        prev.extend(venv.obs());
    }
    let per = buffer.bytes_per_transition();
    let elem = match spec.obs.dtype {
        drill_env::Dtype::U8 => 1,
        drill_env::Dtype::F32 => 4,
    };
    report.row(
        &format!("replay-{id}"),
        "B/transition",
        per,
        total,
        &format!(
            "obs {:?} {:?}; whole stacks would take {} B; {:.1} s to fill",
            spec.obs.shape,
            spec.obs.dtype,
            2 * d * elem + 16,
            t.elapsed().as_secs_f64()
        ),
    );
    // What `drill train --save-replay` costs: the file, its write and its restore.
    let dir = tempfile::tempdir()?;
    let path = drill_algo::data::replay_path(dir.path(), 0);
    let stamp = drill_algo::data::Stamp {
        env_steps: total as u64,
        train_iters: 0,
        world_size: 1,
    };
    let t = Instant::now();
    let bytes = buffer.save(&path, stamp)?;
    let save = t.elapsed().as_secs_f64();
    let mut back = ReplayBuffer::new(total, &spec.obs, &spec.action_space);
    let t = Instant::now();
    back.restore(&path)?;
    let restore = t.elapsed().as_secs_f64();
    anyhow::ensure!(
        back.len() == buffer.len(),
        "restored {} of {}",
        back.len(),
        buffer.len()
    );
    report.row(
        &format!("replay-file-{id}"),
        "B/transition",
        bytes as f64 / total as f64,
        total,
        &format!(
            "--save-replay: {:.1} MB, saved in {save:.3} s, restored in {restore:.3} s",
            bytes as f64 / 1e6
        ),
    );
    Ok(())
}

fn random_batch(bs: usize, obs_dim: usize, actions: u32, rng: &mut impl Rng) -> Batch {
    Batch {
        obs: ObsBuf::F32(
            (0..bs * obs_dim)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect(),
        ),
        next_obs: ObsBuf::F32(
            (0..bs * obs_dim)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect(),
        ),
        actions: ActionBuf::Discrete((0..bs).map(|_| rng.random_range(0..actions)).collect()),
        rewards: vec![1.0; bs],
        dones: (0..bs)
            .map(|k| if k % 10 == 0 { 1.0 } else { 0.0 })
            .collect(),
        discounts: vec![0.97; bs],
        weights: vec![1.0; bs],
        indices: (0..bs).collect(),
    }
}

/// A DQN learner on DI-engine's CartPole net (4-128-128-64, dueling) and a batch of 64.
fn cartpole_learner(device: &Device, rng: &mut rand_chacha::ChaCha8Rng) -> (Dqn, Batch) {
    let net = QNet::new(4, &[128, 128, 64], 2, true, &device.clone().autodiff());
    let learner = Dqn::new(net, &DqnPolicy::default(), 4, 2, device);
    (learner, random_batch(64, 4, 2, rng))
}

/// A DQN learner as DI-engine's pong_dqn_config.py: ConvEncoder 128-128-512, dueling head,
/// 3-step double DQN; a batch of 32 with u8 frames as the replay hands them over.
fn pong_learner(device: &Device, rng: &mut rand_chacha::ChaCha8Rng) -> (Dqn, Batch) {
    let ad = device.clone().autodiff();
    let trunk = ConvEncoder::ding([4, 84, 84], &[128, 128, 512], &ad)
        .expect("84x84 frames fit the encoder");
    let net = QNet::with_trunk(trunk, 6, true, &ad);
    let policy = DqnPolicy {
        discount_factor: 0.99,
        nstep: 3,
        ..DqnPolicy::default()
    };
    let learner = Dqn::new(net, &policy, 4 * 84 * 84, 6, device);
    let mut batch = random_batch(32, 1, 6, rng);
    let mut frames = || ObsBuf::U8((0..32 * 4 * 84 * 84).map(|_| rng.random::<u8>()).collect());
    batch.obs = frames();
    batch.next_obs = frames();
    batch.discounts = vec![0.99f32.powi(3); 32];
    (learner, batch)
}

fn learner_bench(
    report: &Report,
    want: &dyn Fn(&str) -> bool,
    case: Option<&str>,
    device: Device,
    iters: Option<usize>,
    bs: usize,
) {
    device.seed(0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let threads = rayon::current_num_threads();
    let policy = DqnPolicy::default();
    // (name, hidden sizes, dueling): the anchor net of the notes, and DI-engine's CartPole net.
    for (name, hidden, dueling, note) in [
        (
            "dqn-update",
            vec![128usize, 128],
            false,
            "4-128-128-2, batch 64, Adam, double-DQN target",
        ),
        (
            "dqn-update-dueling",
            vec![128, 128, 64],
            true,
            "DI-engine cartpole net: 4-128-128-64 + dueling head, batch 64",
        ),
    ] {
        if !want(name) {
            continue;
        }
        let net = QNet::new(4, &hidden, 2, dueling, &device.clone().autodiff());
        let mut learner = Dqn::new(net, &policy, 4, 2, &device);
        let batch = random_batch(64, 4, 2, &mut rng);
        let n = iters.unwrap_or(2000);
        let us = time_us(50.min(n), n, || {
            learner
                .update(&batch, None)
                .expect("one process: nothing to fail");
        });
        report.row(name, "us", us, n, &format!("{note}, {threads} thread(s)"));
    }
    if want("inference-b8") {
        let net = QNet::new(4, &[128, 128], 2, false, &device);
        let obs: Vec<f32> = (0..32).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut out = [0u32; 8];
        let n = iters.unwrap_or(20000);
        let us = time_us(100.min(n), n, || {
            greedy(&net, Obs::F32(&obs), 4, &device, &mut out)
        });
        report.row(
            "inference-b8",
            "us",
            us,
            n,
            &format!("4-128-128-2 greedy actions, {threads} thread(s)"),
        );
    }
    if want("pong-dqn-update") {
        let (mut learner, batch) = pong_learner(&device, &mut rng);
        let n = iters.unwrap_or(10);
        let us = time_us(2.min(n), n, || {
            learner
                .update(&batch, None)
                .expect("one process: nothing to fail");
        });
        report.row(
            "pong-dqn-update",
            "us",
            us,
            n,
            &format!(
                "DI-engine pong net 128-128-512 + dueling, u8 4x84x84, batch 32, double DQN, Adam, {threads} thread(s)"
            ),
        );
    }
    if want("nature-cnn-inference") {
        // The collector's forward pass: a batch of one frame stack per env copy (8 in
        // `pong_ppo`, 4 for half of them), frames to actions; on the CPU in bf16 too
        // (`policy.precision = "bf16"`).
        let (fwd, _) = nature_cnn_macs(6);
        let on_cpu = device == Device::flex();
        for bf16 in [false, true] {
            if bf16 && !on_cpu {
                continue;
            }
            for bs in [4, 8] {
                let n = iters.unwrap_or(400);
                drill_kernels::precision::set_enabled(bf16);
                let us = nature_cnn_inference_us(&device, bs, n);
                drill_kernels::precision::set_enabled(false);
                report.row(
                    &format!(
                        "nature-cnn-inference-b{bs}{}",
                        if bf16 { "-bf16" } else { "" }
                    ),
                    "us",
                    us,
                    n,
                    &format!(
                        "4x84x84 frames to greedy actions, {:.1} GFLOP/s, {threads} thread(s){}",
                        2.0 * bs as f64 * fwd / (us * 1e3),
                        if bf16 { ", bf16 products" } else { "" }
                    ),
                );
            }
        }
    }
    if want("lstm-ppo-update") {
        let (mut step, cols) = lstm_ppo_step(&device, &mut rng);
        let n = iters.unwrap_or(20);
        let us = time_us(2.min(n), n, || {
            step.update(&cols).expect("one process: nothing to fail");
        });
        report.row(
            "lstm-ppo-update",
            "us",
            us,
            n,
            &format!(
                "CleanRL ppo_atari_lstm's recurrent core: 512 features -> LSTM 128 -> 6 logits + value, {LSTM_SEQS} sequences x {LSTM_STEPS} steps with episode ends, PPO loss, Adam, {threads} thread(s)"
            ),
        );
    }
    if want("nature-cnn-update")
        || want("nature-cnn-update-bf16")
        || case == Some("nature-cnn-products")
    {
        // The roofline: the update's multiply-adds (target forward, online forward, weight
        // gradients, input gradients but the first layer's) against the FMA peak measured on
        // every thread of the pool at once. On a GPU (`--gpu`) neither the CPU's peak nor the
        // CPU's bf16 kernels apply: the f32 update and its GFLOP/s only.
        let (fwd, first) = nature_cnn_macs(6);
        let gflop = 2.0 * bs as f64 * (4.0 * fwd - first) / 1e9;
        let on_cpu = device == Device::flex();
        let peak = on_cpu.then(|| {
            let peak: f64 = rayon::broadcast(|_| drill_kernels::peak::fma_peak_gflops())
                .into_iter()
                .sum();
            report.row(
                "fma-peak",
                "GFLOP/s",
                peak,
                5,
                &format!("f32 FMA peak measured on {threads} thread(s) at once"),
            );
            peak
        });
        // Asked for by name only: not part of a plain `drill bench learner`.
        if let Some(peak) = peak.filter(|_| case == Some("nature-cnn-products")) {
            nature_cnn_products(report, &device, bs, (peak, gflop), iters.unwrap_or(10));
        }
        let mut f32_us = None;
        for (name, bf16) in [
            ("nature-cnn-update", false),
            ("nature-cnn-update-bf16", true),
        ] {
            // `--case nature-cnn-update` runs both precisions, side by side.
            if !(want(name) || want("nature-cnn-update")) || (bf16 && !on_cpu) {
                continue;
            }
            drill_kernels::precision::set_enabled(bf16);
            let us = nature_cnn_update_us(&device, bs, iters.unwrap_or(30));
            drill_kernels::precision::set_enabled(false);
            let level = if bf16 {
                format!(
                    ", bf16 products ({:?})",
                    drill_kernels::precision::Level::current()
                )
            } else {
                String::new()
            };
            let on = if on_cpu {
                format!("{threads} thread(s)")
            } else {
                format!("{device:?}")
            };
            report.row(
                name,
                "us",
                us,
                iters.unwrap_or(30),
                &format!("4x84x84, batch {bs}, Adam, {on}{level}"),
            );
            let achieved = gflop / (us * 1e-6);
            let versus = match f32_us {
                Some(f) if bf16 => format!(", {:.2}x the f32 update", f / us),
                _ => String::new(),
            };
            let share = match peak {
                Some(peak) => format!("{:.1} % of the f32 FMA peak", 100.0 * achieved / peak),
                None => "on the GPU".to_string(),
            };
            report.row(
                &format!("{name}-rate"),
                "GFLOP/s",
                achieved,
                iters.unwrap_or(30),
                &format!("{share} ({gflop:.2} GFLOP per update){versus}"),
            );
            if !bf16 {
                f32_us = Some(us);
            }
        }
    }
}

/// Median microseconds of a Nature-CNN DQN update (see [`nature_cnn_update`]) over `n`
/// iterations.
fn nature_cnn_update_us(device: &Device, bs: usize, n: usize) -> f64 {
    time_us(2.min(n), n, nature_cnn_update(device, bs))
}

/// One Nature-CNN DQN update per call (batch `bs`, 4x84x84, 6 actions: target forward,
/// online forward, gather, MSE, backward, Adam), on a net seeded 0. The observations are
/// made once, as `scripts/bench_torch_learner.py` makes its own: each call shares them
/// instead of copying 3.6 MB twice, which the timed update would count.
fn nature_cnn_update(device: &Device, bs: usize) -> impl FnMut() {
    device.seed(0);
    let ad = device.clone().autodiff();
    let mut trainer = Trainer::new(NatureCnn::new(6, &ad), 1e-8);
    let target = NatureCnn::new(6, device);
    let obs = Tensor::<4>::random([bs, 4, 84, 84], Distribution::Uniform(0.0, 1.0), device);
    let obs_ad = Tensor::<4>::from_data(obs.to_data(), &ad);
    let actions = TensorData::new((0..bs as i64).map(|k| k % 6).collect::<Vec<_>>(), [bs, 1]);
    move || {
        let next = target.forward(obs.clone()).max_dim(1).reshape([bs]);
        let y = next.mul_scalar(0.99).add_scalar(1.0);
        let x = obs_ad.clone();
        let q = trainer
            .model()
            .forward(x)
            .gather(1, Tensor::<2, Int>::from_data(actions.clone(), &ad))
            .reshape([bs]);
        let td = q - Tensor::<1>::from_data(y.into_data(), &ad);
        trainer
            .backward((td.clone() * td).mean())
            .expect("one process: nothing to fail");
        trainer
            .step(1e-4, 0.0)
            .expect("one process: nothing to fail");
    }
}

/// `--case nature-cnn-products` (asked for by name only): the matrix products of
/// [`nature_cnn_update`], each shape timed inside `n` updates on the CPU
/// ([`drill_kernels::profile`]): calls and microseconds per update, GFLOP/s and
/// share of the FMA peak of one thread, the kernel that ran it, and the same product alone
/// with its operands hot in cache ([`drill_kernels::time_alone`]: what the
/// kernel reaches); then the products' share of the update, the Adam step alone (a pass over
/// the parameters, bound by memory: [`adam_step_us`]) and what the two leave as the most the
/// update (`gflop` of work) can reach. A `^T` after the shape marks a transposed operand
/// (left, right). Run it with `--threads 1`: on more threads a product's time is its caller's.
fn nature_cnn_products(
    report: &Report,
    device: &Device,
    bs: usize,
    (peak, gflop): (f64, f64),
    n: usize,
) {
    use std::collections::BTreeMap;
    let mut update = nature_cnn_update(device, bs);
    update();
    update();
    let start = Instant::now();
    let timed = drill_kernels::profile(|| (0..n).for_each(|_| update()));
    let wall = start.elapsed().as_secs_f64() / n as f64;
    // (shape, kernel, layout) -> (one of its calls, calls, seconds)
    let mut shapes = BTreeMap::new();
    for t in &timed {
        let layout = (t.strides, t.accumulate);
        let entry = shapes
            .entry((t.shape, t.kernel, layout))
            .or_insert((t, 0usize, 0.0));
        entry.1 += 1;
        entry.2 += t.seconds;
    }
    let mut rows: Vec<_> = shapes.into_values().collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    let one = peak / rayon::current_num_threads() as f64;
    let (mut total, mut total_alone) = ((0.0, 0.0), 0.0);
    for (t, calls, seconds) in rows {
        let (m, n_, k) = t.shape;
        let per_call = 2.0 * (m * n_ * k) as f64;
        let flop = per_call * calls as f64;
        let rate = flop / seconds / 1e9;
        let alone_seconds =
            drill_kernels::time_alone(t, 0.05_f64.max(2.0 * seconds / calls as f64));
        let alone = per_call / alone_seconds / 1e9;
        total = (total.0 + flop, total.1 + seconds);
        total_alone += alone_seconds * calls as f64;
        let transposed = |(rs, cs): (usize, usize)| if rs == 1 && cs != 1 { "^T" } else { "" };
        report.row(
            &format!(
                "product {m}x{n_}x{k}{}{}",
                transposed(t.strides[0]),
                transposed(t.strides[1])
            ),
            "us",
            seconds / n as f64 * 1e6,
            n,
            &format!(
                "per update: {} calls, {}, {rate:.1} GFLOP/s = {:.1} % of one thread's FMA peak; alone (operands hot): {alone:.1} GFLOP/s = {:.1} %",
                calls / n,
                t.kernel,
                100.0 * rate / one,
                100.0 * alone / one
            ),
        );
    }
    let rate = total.0 / total.1 / 1e9;
    let alone = total.0 / total_alone / 1e9;
    report.row(
        "products",
        "us",
        total.1 / n as f64 * 1e6,
        n,
        &format!(
            "all products of an update ({:.1} ms): {:.1} % of its time, {rate:.1} GFLOP/s = {:.1} % of one thread's FMA peak; alone (operands hot): {:.1} ms, {alone:.1} GFLOP/s = {:.1} %",
            wall * 1e3,
            100.0 * total.1 / n as f64 / wall,
            100.0 * rate / one,
            total_alone / n as f64 * 1e3,
            100.0 * alone / one
        ),
    );
    let params = burn::module::Module::num_params(&NatureCnn::new(6, device));
    let adam = adam_step_us(params, n.max(10));
    report.row(
        "adam-step",
        "us",
        adam,
        n.max(10),
        &format!(
            "{params} parameters, 8 floats each read or written (parameter, gradient and moments in; parameter, moments and the model's copy out): {:.1} GB/s",
            8.0 * 4.0 * params as f64 / (adam * 1e3)
        ),
    );
    let floor = total_alone / n as f64 + adam * 1e-6;
    report.row(
        "update-floor",
        "us",
        floor * 1e6,
        n,
        &format!(
            "products alone + Adam step: with nothing else costing anything, the update could reach {:.1} % of the f32 FMA peak ({gflop:.2} GFLOP in {:.1} ms)",
            100.0 * gflop / floor / one,
            floor * 1e3
        ),
    );
}

/// Median microseconds of one Adam step over `params` parameters, alone, as
/// [`Trainer::step`] takes it: parameters, gradients and both moments read, the three
/// written back, the new parameters also written into a fresh buffer for the model.
fn adam_step_us(params: usize, n: usize) -> f64 {
    let mut adam = drill_algo::optim::Adam::new(params, 1e-8);
    let mut p: Vec<f32> = (0..params).map(|i| (i as f32 * 0.37).sin()).collect();
    let g: Vec<f32> = (0..params)
        .map(|i| 1e-3 * (i as f32 * 0.11).cos())
        .collect();
    time_us(3, n, || {
        std::hint::black_box(adam.step_copy(&mut p, &g, 1e-4));
    })
}

/// Median microseconds of a Nature-CNN forward pass over `bs` frame stacks to greedy
/// actions (no autodiff), over `n` iterations.
fn nature_cnn_inference_us(device: &Device, bs: usize, n: usize) -> f64 {
    device.seed(0);
    let net = NatureCnn::new(6, device);
    let obs =
        Tensor::<4>::random([bs, 4, 84, 84], Distribution::Uniform(0.0, 1.0), device).into_data();
    time_us(20.min(n), n, || {
        let actions = net
            .forward(Tensor::<4>::from_data(obs.clone(), device))
            .argmax(1)
            .into_data();
        assert_eq!(actions.num_elements(), bs);
    })
}

/// Multiply-adds of one 4x84x84 frame through the Nature CNN (convolutions 32 8x8/4,
/// 64 4x4/2, 64 3x3/1, dense 3136-512-`actions`), and those of its first layer (whose input
/// gradient no update needs).
fn nature_cnn_macs(actions: usize) -> (f64, f64) {
    let (mut side, mut c_in, mut total, mut first) = (84, 4, 0.0, 0.0);
    for (c_out, k, stride) in [(32, 8, 4), (64, 4, 2), (64, 3, 1)] {
        side = (side - k) / stride + 1;
        let macs = (c_out * c_in * k * k * side * side) as f64;
        if first == 0.0 {
            first = macs;
        }
        total += macs;
        c_in = c_out;
    }
    total += (c_in * side * side * 512 + 512 * actions) as f64;
    (total, first)
}
