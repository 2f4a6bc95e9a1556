//! Seed 001's walk-through in Rust: DQN on CartPole as evaluate / collect / train middlewares,
//! first in one process, then with the evaluator moved to another process.
//!
//! `cargo run --release -p drill-task --example seed001 -- local`: one process.
//! `cargo run --release -p drill-task --example seed001 -- parallel`: 2 workers, star. Node 0
//! collects and trains and emits `learn_output` {train_iter, env_step, state_dict} every
//! eval_freq iterations; node 1 (`match_labels(["node.1"])`) `wait_for`s it, evaluates and
//! emits `eval_result`; both finish when the stop value is reached.
//! `... -- bench`: learner iterations/s for 3000 iterations alone with no evaluation, then with
//! the evaluator evaluating every learn_output in the other process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::tensor::Device;
use drill_algo::data::{Batch, NStep, ReplayBuffer};
use drill_algo::dqn::{DqnLearner, build_qnet, greedy};
use drill_algo::eval::{ActionBuf, Evaluator};
use drill_algo::explore::epsilon;
use drill_algo::optim::ParamLayout;
use drill_config::{Config, DqnPolicy, Policy};
use drill_env::{Actions, make_vec};
use drill_task::parallel::{Parallel, Topology};
use drill_task::{OnlineRLContext, Task, TaskError};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// What the learner sends the evaluator.
#[derive(Serialize, Deserialize)]
struct LearnOutput {
    train_iter: u64,
    env_step: u64,
    state_dict: Vec<f32>,
}

fn config() -> (Config, DqnPolicy) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../configs/cartpole_dqn.toml"
    );
    let cfg = Config::load(path, &[]).expect("configs/cartpole_dqn.toml");
    let Policy::Dqn(p) = cfg.policy.clone() else {
        panic!("a DQN config")
    };
    (cfg, p)
}

/// The collect and train middlewares (node 0, or the single process). `acting` is the
/// collector's copy of the weights, refreshed after each training round.
fn collect_and_train(
    task: &mut Task<'_, OnlineRLContext>,
    cfg: &Config,
    p: &DqnPolicy,
) -> Arc<Mutex<DqnLearner>> {
    let device = Device::flex();
    device.seed(cfg.seed);
    let n_env = cfg.env.collector_env_num;
    let mut venv = make_vec(&cfg.env.id, n_env, cfg.seed, 1).unwrap();
    venv.reset(None);
    let obs_dim = venv.spec().obs_dim;
    let net = build_qnet(cfg, p, &device.clone().autodiff()).unwrap();
    let learner = Arc::new(Mutex::new(DqnLearner::new(net, p, obs_dim, &device)));
    let acting = Arc::new(Mutex::new(learner.lock().unwrap().online.inference()));
    let buffer = Arc::new(Mutex::new(ReplayBuffer::new(
        p.other.replay_buffer.replay_buffer_size,
        obs_dim,
    )));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed);
    let mut nstep = NStep::new(p.nstep, p.discount_factor as f32, n_env, obs_dim);
    let (mut actions, mut prev) = (vec![0u32; n_env], vec![0f32; n_env * obs_dim]);
    let (pc, buf, act, dev) = (p.clone(), buffer.clone(), acting.clone(), device.clone());
    task.use_fn("collector", move |ctx, _| {
        for _ in 0..pc.collect.n_sample.div_ceil(n_env) {
            let eps = epsilon(&pc.other.eps, ctx.env_step);
            prev.copy_from_slice(venv.obs());
            greedy(&act.lock().unwrap(), &prev, obs_dim, &dev, &mut actions);
            for a in actions.iter_mut() {
                if rng.random::<f64>() < eps {
                    *a = rng.random_range(0..2);
                }
            }
            venv.step(Actions::Discrete(&actions));
            let mut b = buf.lock().unwrap();
            for i in 0..n_env {
                let (term, trunc) = (venv.terminated()[i], venv.truncated()[i]);
                let next = &venv.final_obs()[i * obs_dim..(i + 1) * obs_dim];
                let obs = &prev[i * obs_dim..(i + 1) * obs_dim];
                nstep.push(
                    i,
                    obs,
                    actions[i],
                    venv.rewards()[i],
                    next,
                    term,
                    trunc,
                    |t| b.push(&t),
                );
                ctx.env_episode += u64::from(term || trunc);
            }
            ctx.env_step += n_env as u64;
        }
        Ok(())
    });
    let (pl, l) = (p.clone(), learner.clone());
    let mut batch = Batch::default();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed + 1);
    task.use_fn("learner", move |ctx, task| {
        let b = buffer.lock().unwrap();
        if b.len() < pl.learn.learning_starts.max(pl.learn.batch_size) {
            return Ok(());
        }
        let mut learner = l.lock().unwrap();
        for _ in 0..pl.learn.update_per_collect {
            b.sample(pl.learn.batch_size, 0.4, &mut rng, &mut batch);
            let s = learner
                .update(&batch, None)
                .map_err(|e| TaskError::msg(e.to_string()))?;
            ctx.train_output = vec![("td_loss".into(), f64::from(s.loss))];
            ctx.train_iter = learner.iters;
            if learner.iters.is_multiple_of(pl.eval.evaluator.eval_freq) {
                // Seed 001: the learner publishes its weights every eval_freq iterations.
                task.emit(
                    "learn_output",
                    &LearnOutput {
                        train_iter: learner.iters,
                        env_step: ctx.env_step,
                        state_dict: learner.online.params.clone(),
                    },
                )?;
                break;
            }
        }
        *acting.lock().unwrap() = learner.online.inference();
        Ok(())
    });
    learner
}

/// Evaluate `params` greedily; true when the stop value is reached.
fn evaluate(evaluator: &mut Evaluator, cfg: &Config, p: &DqnPolicy, params: &[f32]) -> (f64, bool) {
    let device = Device::flex();
    let net = build_qnet(cfg, p, &device).unwrap();
    let (layout, _) = ParamLayout::with_values(&net);
    let net = layout.write(net, params);
    let r = evaluator.run(|obs, out| {
        if let ActionBuf::Discrete(a) = out {
            greedy(&net, obs, 4, &device, a);
        }
    });
    (r.mean, cfg.env.stop_value.is_some_and(|v| r.mean >= v))
}

fn local() -> Result<(), TaskError> {
    let (cfg, p) = config();
    let mut task = Task::<OnlineRLContext>::new();
    task.step_timer(0);
    let mut evaluator = Evaluator::new(&cfg.env.id, 5, 5, cfg.seed + 100).unwrap();
    let weights: Arc<Mutex<Option<LearnOutput>>> = Arc::default();
    let w = weights.clone();
    task.handle().on("learn_output", move |e| {
        *w.lock().unwrap() = e.decode().ok();
    });
    let (c, pp) = (cfg.clone(), p.clone());
    task.use_fn("evaluator", move |ctx, task| {
        if let Some(out) = weights.lock().unwrap().take() {
            let (mean, stop) = evaluate(&mut evaluator, &c, &pp, &out.state_dict);
            ctx.last_eval_iter = Some(out.train_iter);
            ctx.last_eval_value = Some(mean);
            println!(
                "iter {:>5}  env step {:>6}  eval {mean:.1}",
                out.train_iter, out.env_step
            );
            if stop {
                task.finish();
            }
        }
        Ok(())
    });
    collect_and_train(&mut task, &cfg, &p);
    let t = Instant::now();
    let ctx = task.run(Some(100_000))?;
    println!(
        "local: eval {:.1} after {} env steps, {} iters, {:.2} s",
        ctx.last_eval_value.unwrap_or(f64::NAN),
        ctx.env_step,
        ctx.train_iter,
        t.elapsed().as_secs_f64()
    );
    for s in task.timer().unwrap().stats() {
        println!("  {:<10} mean {:.3} ms per step", s.name, s.mean_ms);
    }
    Ok(())
}

/// Iterations per second of collect + train until `iters` train iterations, no evaluation.
fn learner_alone(iters: u64) -> Result<f64, TaskError> {
    let (cfg, p) = config();
    let mut task = Task::<OnlineRLContext>::new();
    collect_and_train(&mut task, &cfg, &p);
    task.use_fn("termination", move |ctx, task| {
        if ctx.train_iter >= iters {
            task.finish();
        }
        Ok(())
    });
    let t = Instant::now();
    let ctx = task.run(None)?;
    Ok(ctx.train_iter as f64 / t.elapsed().as_secs_f64())
}

/// `bench_iters`: instead of stopping at the stop value, train that many iterations and
/// report iterations/s while the other process evaluates.
fn parallel(bench_iters: Option<u64>) -> Result<(), TaskError> {
    Parallel::runner(2)
        .topology(Topology::Star)
        .run::<OnlineRLContext>(|task| {
            let (cfg, p) = config();
            let h = task.handle().clone();
            if h.match_labels(&["node.1"])? {
                // The evaluator process: wait for weights, evaluate, report.
                let mut evaluator = Evaluator::new(&cfg.env.id, 5, 5, cfg.seed + 100).unwrap();
                let done = Arc::new(AtomicBool::new(false));
                let d = done.clone();
                h.on("bench_done", move |_| d.store(true, Ordering::SeqCst));
                let latest: Arc<Mutex<Option<LearnOutput>>> = Arc::default();
                let l = latest.clone();
                h.on("learn_output", move |e| *l.lock().unwrap() = e.decode().ok());
                h.barrier()?;
                let t = Instant::now();
                while !done.load(Ordering::SeqCst) {
                    let Some(out) = latest.lock().unwrap().take() else {
                        if t.elapsed() > Duration::from_secs(120) {
                            return Err(TaskError::msg("no learn_output for 120 s"));
                        }
                        std::thread::sleep(Duration::from_micros(200));
                        continue;
                    };
                    let (mean, stop) = evaluate(&mut evaluator, &cfg, &p, &out.state_dict);
                    println!("iter {:>5}  env step {:>6}  eval {mean:.1}", out.train_iter, out.env_step);
                    h.emit("eval_result", &(mean, stop && bench_iters.is_none()))?;
                    if stop && bench_iters.is_none() {
                        return Ok(());
                    }
                }
                return Ok(());
            }
            // Node 0 collects and trains until the evaluator says stop.
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            h.on("eval_result", move |e| {
                if e.decode::<(f64, bool)>().map(|(_, stop)| stop).unwrap_or(false) {
                    s.store(true, Ordering::SeqCst);
                }
            });
            collect_and_train(task, &cfg, &p);
            task.use_fn("termination", move |ctx, task| {
                if stop.load(Ordering::SeqCst) || bench_iters.is_some_and(|n| ctx.train_iter >= n) {
                    task.finish();
                }
                Ok(())
            });
            h.barrier()?;
            let t = Instant::now();
            let ctx = task.run(Some(100_000))?;
            let secs = t.elapsed().as_secs_f64();
            h.emit("bench_done", &())?;
            match bench_iters {
                Some(_) => {
                    let with_eval = ctx.train_iter as f64 / secs;
                    let alone = learner_alone(ctx.train_iter)?;
                    println!(
                        "learner iterations/s: {with_eval:.0} with the evaluator in another process, {alone:.0} with no evaluation: {:.1} %",
                        100.0 * with_eval / alone
                    );
                }
                None => println!(
                    "parallel: stop value reached after {} env steps, {} iters, {secs:.2} s",
                    ctx.env_step, ctx.train_iter
                ),
            }
            Ok(())
        })
}

fn main() -> Result<(), TaskError> {
    match std::env::args().nth(1).as_deref() {
        Some("parallel") => parallel(None),
        Some("bench") => parallel(Some(3000)),
        _ => local(),
    }
}
