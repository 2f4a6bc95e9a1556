//! Seed 001's walk-through in Rust: DQN on CartPole as evaluate / collect / train
//! middlewares, first in one process, then with the evaluator moved to another process.
//!
//! `cargo run --release -p drill-algo --example seed001 -- local`: one process.
//! `cargo run --release -p drill-algo --example seed001 -- parallel`: 2 workers, star. Node 0
//! collects and trains and emits `learn_output` {train_iter, env_step, state_dict} every
//! eval_freq iterations; node 1 (`match_labels(["node.1"])`) `wait_for`s it, evaluates, and
//! at the stop value emits `finish`, which ends node 0 too.
//!
//! `drill train configs/cartpole_dqn_dist.toml` is the same split with the built-in
//! exchangers (ModelExchanger, ContextExchanger, FinishSync) and an experiment folder.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use burn::tensor::Device;
use drill_algo::data::ReplayBuffer;
use drill_algo::ddp::Ranks;
use drill_algo::dqn::Dqn;
use drill_algo::envs;
use drill_algo::eval::Evaluator;
use drill_algo::middleware::{
    DataPusher, EpsGreedyHandler, InteractionEvaluator, NStepRewardEnhancer, OffPolicyLearner,
    StepCollector,
};
use drill_algo::policy::Policy as _;
use drill_config::{Config, DqnPolicy, Policy};
use drill_task::parallel::{Parallel, Topology};
use drill_task::{OnlineRLContext, Task, TaskError, TaskHandle};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
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

/// The policy (learner + the copy it acts with), seeded as `drill train` seeds it.
fn agent(cfg: &Config, p: &DqnPolicy) -> RefCell<Dqn> {
    let device = Device::flex();
    device.seed(cfg.seed);
    RefCell::new(Dqn::from_config(cfg, p, &device).unwrap())
}

/// The evaluate middleware: greedy episodes every eval_freq iterations, finish at 195.
fn evaluate<'a>(
    cfg: &Config,
    p: &DqnPolicy,
    agent: &'a RefCell<Dqn>,
) -> InteractionEvaluator<'a, Dqn> {
    let evaluator: Evaluator = envs::evaluator(cfg, 1, 0, 1)
        .unwrap()
        .expect("one rank holds every evaluator copy");
    InteractionEvaluator::new(
        Some(evaluator),
        p.eval.evaluator.eval_freq,
        cfg.env.stop_value,
        Ranks::alone(),
        agent,
    )
}

/// The collect and train middlewares.
fn collect_and_train<'a>(
    task: &mut Task<'a, OnlineRLContext>,
    cfg: &Config,
    p: &DqnPolicy,
    agent: &'a RefCell<Dqn>,
    buffer: &'a RefCell<ReplayBuffer>,
    rng: &'a RefCell<ChaCha8Rng>,
) {
    let venv = envs::collector_envs(cfg, cfg.seed, 0).unwrap();
    let spec = venv.spec().clone();
    task.use_mw(EpsGreedyHandler::new(p.other.eps.clone()))
        .use_mw(StepCollector::new(
            venv,
            p.collect.n_sample,
            agent,
            rng,
            Ranks::alone(),
        ))
        .use_mw(NStepRewardEnhancer::new(
            p.nstep,
            p.discount_factor as f32,
            cfg.env.collector_env_num,
            &spec.obs,
            &spec.action_space,
        ))
        .use_mw(DataPusher::new(buffer));
    let mut learner = OffPolicyLearner::new(agent, buffer, rng, Ranks::alone());
    learner.batch_size = p.learn.batch_size;
    learner.update_per_collect = p.learn.update_per_collect;
    learner.learning_starts = p.learn.batch_size;
    learner.eval_freq = p.eval.evaluator.eval_freq;
    task.use_mw(learner);
}

fn storage(cfg: &Config, p: &DqnPolicy) -> (RefCell<ReplayBuffer>, RefCell<ChaCha8Rng>) {
    let spec = envs::env_spec(cfg).unwrap();
    (
        RefCell::new(ReplayBuffer::new(
            p.other.replay_buffer.replay_buffer_size,
            &spec.obs,
            &spec.action_space,
        )),
        RefCell::new(ChaCha8Rng::seed_from_u64(0x5eed)),
    )
}

fn report(name: &str, ctx: &OnlineRLContext, t: Instant) {
    println!(
        "{name}: eval {:.1} after {} env steps, {} iters, {:.2} s",
        ctx.last_eval_value.unwrap_or(f64::NAN),
        ctx.env_step,
        ctx.train_iter,
        t.elapsed().as_secs_f64()
    );
}

fn local() -> Result<(), TaskError> {
    let (cfg, p) = config();
    let agent = agent(&cfg, &p);
    let (buffer, rng) = storage(&cfg, &p);
    let mut task = Task::<OnlineRLContext>::new();
    task.step_timer(0);
    task.use_mw(evaluate(&cfg, &p, &agent));
    collect_and_train(&mut task, &cfg, &p, &agent, &buffer, &rng);
    let t = Instant::now();
    let ctx = task.run(Some(100_000))?;
    report("local", &ctx, t);
    for s in task.timer().unwrap().stats() {
        println!("  {:<22} mean {:.3} ms per step", s.name, s.mean_ms);
    }
    Ok(())
}

/// Node 0: collect and train; every eval_freq iterations emit the weights.
fn learner_node(h: TaskHandle) -> Result<(), TaskError> {
    let (cfg, p) = config();
    let agent = agent(&cfg, &p);
    let (buffer, rng) = storage(&cfg, &p);
    let mut task = Task::<OnlineRLContext>::with_handle(h.clone());
    collect_and_train(&mut task, &cfg, &p, &agent, &buffer, &rng);
    let eval_freq = p.eval.evaluator.eval_freq;
    let agent = &agent;
    let mut sent = None;
    task.use_fn("learn_output", move |ctx, task| {
        if ctx.train_iter.is_multiple_of(eval_freq) && sent != Some(ctx.train_iter) {
            sent = Some(ctx.train_iter);
            let state_dict = agent.borrow().weights();
            task.emit(
                "learn_output",
                &LearnOutput {
                    train_iter: ctx.train_iter,
                    env_step: ctx.env_step,
                    state_dict,
                },
            )?;
        }
        Ok(())
    });
    let finish = h.clone();
    h.on("finish", move |_| finish.finish());
    h.barrier()?;
    let t = Instant::now();
    let ctx = task.run(None)?;
    report("node 0 (collect, train)", &ctx, t);
    Ok(())
}

/// Node 1: wait for weights, evaluate, finish everyone at the stop value.
fn evaluator_node(h: TaskHandle) -> Result<(), TaskError> {
    let (cfg, p) = config();
    let agent = agent(&cfg, &p);
    let mut task = Task::<OnlineRLContext>::with_handle(h.clone());
    task.use_fn("wait_for_learn_output", |ctx, task| {
        let out: LearnOutput = task
            .wait_for("learn_output", Duration::from_secs(60))?
            .decode()?;
        agent.borrow_mut().load_weights(&out.state_dict);
        (ctx.train_iter, ctx.env_step) = (out.train_iter, out.env_step);
        Ok(())
    });
    task.use_mw(evaluate(&cfg, &p, &agent));
    task.use_fn("announce", |ctx, task| {
        if let Some(v) = ctx.eval_value {
            println!(
                "iter {:>5}  env step {:>6}  eval {v:.1}",
                ctx.train_iter, ctx.env_step
            );
        }
        if task.finished() {
            task.emit("finish", &())?;
        }
        Ok(())
    });
    // A learn_output emitted while this node evaluates is skipped: the next one is newer.
    h.barrier()?;
    let t = Instant::now();
    let ctx = task.run(None)?;
    report("node 1 (evaluate)", &ctx, t);
    Ok(())
}

fn parallel() -> Result<(), TaskError> {
    Parallel::runner(2)
        .topology(Topology::Star)
        .run::<OnlineRLContext>(|task| {
            let h = task.handle().clone();
            if h.match_labels(&["node.1"])? {
                evaluator_node(h)
            } else {
                learner_node(h)
            }
        })
}

fn main() -> Result<(), TaskError> {
    match std::env::args().nth(1).as_deref() {
        Some("parallel") => parallel(),
        _ => local(),
    }
}
