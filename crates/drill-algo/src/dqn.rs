//! DQN as DI-engine runs it: MLP encoder + dueling head, double-DQN targets, n-step returns,
//! hard (or soft) target updates, epsilon-greedy exploration on an exponential schedule driven
//! by env steps, uniform (or prioritized) replay, Adam, MSE TD loss.
//!
//! Read top to bottom: the network (`check_model`, `build_qnet`), acting (greedy for evaluation,
//! epsilon-greedy for collection: [`Dqn`]'s [`Policy`] impl), the update rule
//! ([`Dqn::update`]), then [`train_roles`]: setup and the pipeline of built-in middlewares
//! `evaluate? → collect n_sample → n-step → push → update × update_per_collect → log`.
//! Hyper-parameters come from [`DqnPolicy`] (the `[policy]` table).

use std::cell::RefCell;

use crate::checkpoint::{Checkpoint, CheckpointExt};
use crate::context;
use crate::context::{RunContext, TrainResult};
use crate::data::Batch;
use crate::data::ReplayBuffer;
use crate::ddp;
use crate::envs;
use crate::error::TrainError;
use crate::middleware::{
    CkptSaver, DataPusher, EpsGreedyHandler, InteractionEvaluator, NStepRewardEnhancer,
    OffPolicyLearner, OnlineLogger, Outputs, Roles, StepCollector, TerminationChecker, TrainClock,
    Transitions, in_one_process, learner_sender, run_result, use_exchangers,
};
use crate::nets;
use crate::nets::{ConvEncoder, ObsShape, QNet, argmax, check_encoder, input};
use crate::optim::{ActingCopy, ParamLayout, Trainer};
use crate::policy::{Acted, Explore, Hidden, LearnOutput, Policy};
use crate::resume;
use burn::tensor::{Device, Int, Tensor, TensorData};
use drill_config::{Config, ConvKind, DqnPolicy};
use drill_env::{ActionBuf, ActionSpace, EnvSpec, Obs};
use drill_task::{Task, TaskHandle};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Check that `[policy.model]` makes a Q-network for the environment `spec` describes, without
/// building it: discrete actions, the given shapes, an encoder that fits the frames. Returns
/// what [`build_qnet`] builds from: the observations and the action count.
pub(crate) fn check_model(
    cfg: &Config,
    p: &DqnPolicy,
    spec: &EnvSpec,
) -> Result<(ObsShape, usize), TrainError> {
    let ActionSpace::Discrete(actions) = spec.action_space else {
        return Err(cfg
            .error(
                "policy.type",
                format!(
                    "DQN needs discrete actions; {} is continuous (use ppo or sac)",
                    spec.id
                ),
            )
            .into());
    };
    nets::check_shapes(
        cfg,
        (p.model.obs_shape.as_ref(), p.model.action_shape),
        (&spec.obs.shape, actions),
    )?;
    let obs = ObsShape::of(cfg, spec, "DQN")?;
    if let ObsShape::Frames(shape) = obs {
        let hidden =
            (p.model.encoder == ConvKind::Ding).then_some(&p.model.encoder_hidden_size_list);
        check_encoder(shape, hidden.map(Vec::as_slice))
            .map_err(|e| cfg.error("policy.model.encoder_hidden_size_list", e))?;
    }
    Ok((obs, actions))
}

/// The Q-network for the environment `spec` describes, as `[policy.model]` says
/// ([`check_model`] first).
pub(crate) fn build_qnet(
    cfg: &Config,
    p: &DqnPolicy,
    spec: &EnvSpec,
    device: &Device,
) -> Result<QNet, TrainError> {
    let (obs, actions) = check_model(cfg, p, spec)?;
    let hidden = &p.model.encoder_hidden_size_list;
    Ok(match obs {
        ObsShape::Vector(dim) => QNet::new(dim, hidden, actions, p.model.dueling, device),
        ObsShape::Frames(shape) => {
            let trunk = match p.model.encoder {
                ConvKind::Ding => ConvEncoder::ding(shape, hidden, device),
                ConvKind::Nature => ConvEncoder::nature(shape, false, device),
            }
            .map_err(|e| cfg.error("policy.model.encoder_hidden_size_list", e))?;
            QNet::with_trunk(trunk, actions, p.model.dueling, device)
        }
    })
}

/// Greedy actions for a batch of observations.
pub fn greedy(net: &QNet, obs: Obs<'_>, obs_dim: usize, device: &Device, out: &mut [u32]) {
    let n = obs.len() / obs_dim;
    let q = net.forward(input(obs, obs_dim, device)).into_data();
    let q = q.as_slice::<f32>().expect("f32 q-values");
    let actions = q.len() / n;
    for (i, a) in out.iter_mut().enumerate() {
        let row = &q[i * actions..(i + 1) * actions];
        *a = argmax(row) as u32;
    }
}

/// DQN: the online net (trained), the target net, the copy the collector and evaluator act
/// with (refreshed after updates, or loaded from another process), and the update rule.
pub struct Dqn {
    /// Online network with its flat parameters and Adam state.
    pub online: Trainer<QNet>,
    /// Target network (no gradients).
    pub target: QNet,
    target_params: Vec<f32>,
    layout: ParamLayout,
    acting: ActingCopy<QNet>,
    device: Device,
    ad_device: Device,
    obs_dim: usize,
    n_actions: u32,
    gamma_ignore_done: bool,
    lr: f64,
    target_update_freq: u64,
    target_theta: Option<f64>,
    priorities: bool,
    /// Updates done.
    pub iters: u64,
}

/// What one update measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct UpdateStats {
    /// Mean (weighted) squared TD error.
    pub loss: f32,
    /// Mean TD target `y` (the bootstrapped Q estimate).
    pub target_q_mean: f32,
    /// Gradient norm.
    pub grad_norm: f32,
}

impl Dqn {
    /// DQN on `net` (built on `device.autodiff()`; `device` is the plain device) for
    /// observations of `obs_dim` elements and `n_actions` actions.
    pub fn new(
        net: QNet,
        p: &DqnPolicy,
        obs_dim: usize,
        n_actions: usize,
        device: &Device,
    ) -> Self {
        let online = Trainer::new(net, 1e-8);
        let layout = online.layout().clone();
        let target_params = online.params().to_vec();
        Self {
            target: online.inference(),
            acting: ActingCopy::new(&online),
            online,
            target_params,
            layout,
            device: device.clone(),
            ad_device: device.clone().autodiff(),
            obs_dim,
            n_actions: n_actions as u32,
            gamma_ignore_done: p.learn.ignore_done,
            lr: p.learn.learning_rate,
            target_update_freq: p.learn.target_update_freq,
            target_theta: p.learn.target_theta,
            priorities: p.other.replay_buffer.priority,
            iters: 0,
        }
    }

    /// DQN for `cfg`'s environment on `device` (the plain device), its spec built here.
    pub fn from_config(cfg: &Config, p: &DqnPolicy, device: &Device) -> Result<Self, TrainError> {
        Self::from_spec(cfg, p, &envs::env_spec(cfg)?, device)
    }

    /// DQN for the environment `spec` describes, on `device` (the plain device).
    pub(crate) fn from_spec(
        cfg: &Config,
        p: &DqnPolicy,
        spec: &EnvSpec,
        device: &Device,
    ) -> Result<Self, TrainError> {
        let net = build_qnet(cfg, p, spec, &device.clone().autodiff())?;
        Ok(Self::new(
            net,
            p,
            spec.obs_dim(),
            spec.action_space.dim(),
            device,
        ))
    }

    /// The online network's Q-values of `obs` (`[n, actions]`, row-major), as the greedy
    /// policy sees them; for exports' checks.
    pub fn q_values(&self, obs: Obs<'_>) -> Vec<f32> {
        let net = self.online.inference();
        let q = net
            .forward(input(obs, self.obs_dim, &self.device))
            .into_data();
        q.as_slice::<f32>().expect("f32 q-values").to_vec()
    }

    /// Train data-parallel on `pg`: rank 0's online and target networks are broadcast, and
    /// every update averages gradients across ranks.
    pub fn distribute(
        &mut self,
        pg: drill_comm::ProcessGroup,
        opts: crate::optim::DdpOptions,
    ) -> Result<(), TrainError> {
        pg.broadcast(&mut self.target_params, 0)?;
        self.write_target();
        self.online.distribute(pg, opts)?;
        self.acting.invalidate();
        Ok(())
    }

    /// One gradient step on `batch`; returns the TD errors (for priorities) through `td_out`.
    pub fn update(
        &mut self,
        batch: &Batch,
        td_out: Option<&mut Vec<f32>>,
    ) -> Result<UpdateStats, TrainError> {
        let (bs, d) = (batch.len(), self.obs_dim);
        let plain = &self.device;
        // ALGO: double-DQN target y = r + gamma^m (1 - done) Q_target(s', argmax_a Q_online(s', a)).
        let next = input(batch.next_obs.as_obs(), d, plain);
        let q_next_online = self.online.inference().forward(next.clone()).into_data();
        let q_next_target = self.target.forward(next).into_data();
        let (qo, qt) = (
            q_next_online.as_slice::<f32>().unwrap(),
            q_next_target.as_slice::<f32>().unwrap(),
        );
        let na = qo.len() / bs;
        let y: Vec<f32> = (0..bs)
            .map(|k| {
                let a = argmax(&qo[k * na..(k + 1) * na]);
                let not_done = if self.gamma_ignore_done {
                    1.0
                } else {
                    1.0 - batch.dones[k]
                };
                batch.rewards[k] + batch.discounts[k] * not_done * qt[k * na + a]
            })
            .collect();
        let target_q_mean = y.iter().sum::<f32>() / bs as f32;
        // ALGO: loss = mean(w * (Q(s, a) - y)^2).
        let ad = self.ad_device.clone();
        let ActionBuf::Discrete(taken) = &batch.actions else {
            unreachable!("DQN's replay holds discrete actions")
        };
        let taken: Vec<i64> = taken.iter().map(|&a| i64::from(a)).collect();
        let actions = Tensor::<2, Int>::from_data(TensorData::new(taken, [bs, 1]), &ad);
        let q_sa = self
            .online
            .model()
            .forward(input(batch.obs.as_obs(), d, &ad))
            .gather(1, actions)
            .reshape([bs]);
        let td = q_sa - Tensor::<1>::from_data(TensorData::new(y, [bs]), &ad);
        let sq = td.clone().square();
        // Uniform replay has unit weights: skip the multiply (and its backward).
        let loss = if batch.weights.iter().all(|&w| w == 1.0) {
            sq.mean()
        } else {
            (sq * Tensor::<1>::from_data(TensorData::new(batch.weights.clone(), [bs]), &ad)).mean()
        };
        if let Some(out) = td_out {
            out.clear();
            out.extend_from_slice(td.clone().into_data().as_slice::<f32>().unwrap());
        }
        let loss_value = loss.clone().into_scalar::<f32>();
        self.online.backward(loss)?;
        let step = self.online.step(self.lr, 0.0)?;
        self.iters += 1;
        self.acting.invalidate();
        // ALGO: target network update (hard every N iterations, or soft every iteration).
        if let Some(theta) = self.target_theta {
            let t = theta as f32;
            for (tp, op) in self.target_params.iter_mut().zip(self.online.params()) {
                *tp = t * op + (1.0 - t) * *tp;
            }
            self.write_target();
        } else if self.iters.is_multiple_of(self.target_update_freq) {
            self.target_params.copy_from_slice(self.online.params());
            self.write_target();
        }
        Ok(UpdateStats {
            loss: loss_value,
            target_q_mean,
            grad_norm: step.grad_norm,
        })
    }

    fn write_target(&mut self) {
        let target = std::mem::replace(&mut self.target, self.online.inference());
        self.target = self.layout.write(target, &self.target_params);
    }
}

impl Policy for Dqn {
    type Data = Batch;
    const NAME: &'static str = "dqn";

    fn eval(&mut self, obs: Obs<'_>, _: &mut Hidden, out: &mut ActionBuf) {
        let n = obs.len() / self.obs_dim;
        let net = self.acting.get(&self.online);
        greedy(net, obs, self.obs_dim, &self.device, out.discrete_mut(n));
    }

    fn collect(
        &mut self,
        obs: Obs<'_>,
        _: &mut Hidden,
        explore: &Explore,
        rng: &mut ChaCha8Rng,
        out: &mut Acted,
    ) {
        let n = obs.len() / self.obs_dim;
        let actions = out.actions.discrete_mut(n);
        let net = self.acting.get(&self.online);
        greedy(net, obs, self.obs_dim, &self.device, actions);
        // ALGO: epsilon-greedy: each action is replaced by a uniform one with probability eps.
        if explore.epsilon > 0.0 {
            for a in actions.iter_mut() {
                if rng.random::<f64>() < explore.epsilon {
                    *a = rng.random_range(0..self.n_actions);
                }
            }
        }
    }

    fn learn(
        &mut self,
        batch: &Batch,
        _env_step: u64,
        _rng: &mut ChaCha8Rng,
        out: &mut LearnOutput,
    ) -> Result<(), TrainError> {
        let td = self.priorities.then_some(&mut out.priorities);
        let stats = self.update(batch, td)?;
        out.loss = stats.loss;
        out.scalars.push(("losses/td_loss", stats.loss));
        out.scalars
            .push(("losses/target_q_mean", stats.target_q_mean));
        Ok(())
    }

    fn train_iter(&self) -> u64 {
        self.iters
    }

    /// Online net, Adam state, target net and the iteration counter.
    fn state_dict(&self) -> Checkpoint {
        let mut ck = Checkpoint::default();
        ck.put_trainer("model", &self.online);
        ck.put_params("target", &self.layout, &self.target_params);
        ck.meta.insert("train_iters".into(), self.iters.to_string());
        ck
    }

    fn load_state_dict(&mut self, ck: &Checkpoint) -> Result<(), TrainError> {
        ck.get_trainer("model", &mut self.online)?;
        self.target_params = ck.get_params("target", &self.layout)?;
        self.write_target();
        self.iters = ck.counter("train_iters")?;
        self.acting.invalidate();
        Ok(())
    }

    fn weights(&self) -> Vec<f32> {
        self.online.params().to_vec()
    }

    fn load_weights(&mut self, weights: &[f32]) {
        self.acting.load(&self.layout, weights);
    }
}

/// Train DQN as configured; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
pub fn train(
    cfg: &Config,
    p: &DqnPolicy,
    run: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    in_one_process(|handle, roles| train_roles(cfg, p, run, handle, roles))
}

/// Train DQN as the pipeline of built-in middlewares, running the parts `roles` names on
/// `handle`'s task (all of them in one process; a share under the Parallel runner, with the
/// exchangers that reach the others). Returns the result where the learner runs.
pub fn train_roles(
    cfg: &Config,
    p: &DqnPolicy,
    run: &mut RunContext<'_>,
    handle: TaskHandle,
    roles: &Roles,
) -> Result<Option<TrainResult>, TrainError> {
    // PLUMBING: seeding, environments, networks, storage.
    let clock = TrainClock::start(run.resume.as_ref().filter(|_| roles.learner));
    let ranks = ddp::setup(cfg, run);
    let streams = resume::stream_seed(cfg, run.resume.as_ref(), run.restarts);
    let (rank, world) = (ranks.rank(), ranks.world());
    // Split over processes, each collector worker is seeded as a DDP rank would be.
    let (slot, slots) = roles.slot(rank, world);
    let spec = &run.spec;
    let mut dqn = Dqn::from_spec(cfg, p, spec, &run.device)?;
    let resume = run.resume.as_ref().filter(|_| roles.learner);
    let env_step = resume::restore(&mut dqn, resume)?;
    if let Some(pg) = ranks.group() {
        dqn.distribute(pg.clone(), ddp::options(cfg))?;
    }
    let dqn = RefCell::new(dqn);
    let rng = RefCell::new(resume::rank_rng(streams, run.resume.as_ref(), slot));
    let rb = &p.other.replay_buffer;
    let buffer = RefCell::new(ReplayBuffer::from_config(rb, spec, resume, rank, world)?);
    let eval_freq = p.eval.evaluator.eval_freq;
    let out = Outputs::new(&mut *run.reporter);
    let iters = dqn.borrow().iters;
    let mut task = context::task(cfg, Task::with_handle(handle.clone()), env_step, iters);

    // ALGO: the pipeline, DI-engine's order. Each role's middlewares run only where the role
    // does; exchangers carry data to the roles that run in other processes.
    if let Some(remote) = &roles.remote {
        use_exchangers::<Transitions, _>(&mut task, &handle, (roles, &ranks), remote, &dqn)?;
    }
    if roles.evaluator {
        // Evaluate greedily every eval_freq train iterations (and before training).
        let evaluator = envs::evaluator(cfg, world.max(slots), ranks.rank(), ranks.world())?;
        let mut evaluator = InteractionEvaluator::new(
            evaluator,
            eval_freq,
            cfg.env.stop_value,
            ranks.clone(),
            &dqn,
        );
        if roles.learner_elsewhere() {
            evaluator = evaluator.remote();
        }
        task.use_mw(evaluator);
    }
    if roles.learner {
        let mut saver = CkptSaver::new(&out, &dqn, ranks.clone(), &rng, clock);
        if let Some(dir) = &run.replay_dir {
            saver = saver.save_replay(&buffer, dir.clone());
        }
        if roles.evaluator_elsewhere() {
            saver = saver.remote_eval(eval_freq);
        }
        task.use_mw(saver);
        task.use_mw(TerminationChecker::new(
            cfg.max_env_step,
            cfg.max_train_iter,
            ranks.clone(),
        ));
    }
    if roles.collector {
        // Collect n_sample transitions with epsilon-greedy actions; the schedule runs on the
        // global env-step count.
        task.use_mw(EpsGreedyHandler::new(p.other.eps.clone()));
        task.use_mw(StepCollector::new(
            envs::collector_envs(cfg, streams, slot)?,
            ddp::split(cfg, &ranks, p.collect.n_sample),
            &dqn,
            &rng,
            ranks.clone(),
        ));
        task.use_mw(NStepRewardEnhancer::new(
            p.nstep,
            p.discount_factor as f32,
            cfg.env.collector_env_num,
            &spec.obs,
            &spec.action_space,
        ));
    }
    if roles.learner {
        // update_per_collect gradient steps on uniform (or prioritized) minibatches.
        task.use_mw(DataPusher::new(&buffer));
        let batch_size = ddp::split(cfg, &ranks, p.learn.batch_size);
        let mut learn = OffPolicyLearner::new(&dqn, &buffer, &rng, ranks.clone());
        learn.batch_size = batch_size;
        learn.update_per_collect = p.learn.update_per_collect;
        learn.learning_starts = p.learn.learning_starts.max(batch_size);
        learn.eval_freq = eval_freq;
        learn.priority_beta = rb.priority.then_some(rb.priority_beta);
        task.use_mw(learn);
        if let Some(remote) = &roles.remote {
            let at = (eval_freq, iters);
            task.use_mw(learner_sender(&handle, roles, remote, at, &dqn));
        }
        task.use_mw(OnlineLogger::new(&out, cfg.max_env_step, env_step));
    }
    handle.barrier()?;
    let ctx = task.run(None)?;
    Ok(roles
        .learner
        .then(|| run_result(&ctx, env_step, &clock, world, run.restarts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nets::QNet;
    use drill_env::ObsBuf;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn batch(seed: u64) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bs = 16;
        Batch {
            obs: ObsBuf::F32((0..bs * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
            next_obs: ObsBuf::F32((0..bs * 4).map(|_| rng.random_range(-1.0..1.0)).collect()),
            actions: ActionBuf::Discrete((0..bs).map(|_| rng.random_range(0..2)).collect()),
            rewards: (0..bs).map(|_| rng.random_range(0.0..1.0)).collect(),
            dones: (0..bs).map(|k| (k % 5 == 0) as u8 as f32).collect(),
            discounts: vec![0.9; bs],
            weights: vec![1.0; bs],
            indices: (0..bs).collect(),
        }
    }

    fn learner(seed: u64) -> Dqn {
        let device = Device::flex();
        device.seed(seed);
        let mut p = DqnPolicy::default();
        p.learn.target_update_freq = 3;
        let net = QNet::new(4, &[16, 8], 2, true, &device.clone().autodiff());
        Dqn::new(net, &p, 4, 2, &device)
    }

    fn q_values(l: &Dqn, b: &Batch) -> Vec<f32> {
        let x = input(b.obs.as_obs(), 4, &Device::flex());
        l.online
            .inference()
            .forward(x)
            .into_data()
            .try_to_vec()
            .unwrap()
    }

    #[test]
    fn checkpoint_round_trip_gives_identical_outputs_and_continued_training() {
        let mut a = learner(1);
        for k in 0..7 {
            a.update(&batch(k), None).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ck.safetensors");
        let mut ck = a.state_dict();
        ck.meta.insert("env_steps".into(), "123".into());
        ck.save(&path).unwrap();
        let loaded = Checkpoint::load(&path).unwrap();
        assert_eq!(loaded.counter("env_steps").unwrap(), 123);
        let mut b = learner(2);
        assert_ne!(
            q_values(&a, &batch(99)),
            q_values(&b, &batch(99)),
            "different init before loading"
        );
        b.load_state_dict(&loaded).unwrap();
        assert_eq!(b.iters, 7);
        assert_eq!(
            q_values(&a, &batch(99)),
            q_values(&b, &batch(99)),
            "identical outputs"
        );
        for k in 7..15 {
            let sa = a.update(&batch(k), None).unwrap();
            let sb = b.update(&batch(k), None).unwrap();
            assert_eq!(sa.loss.to_bits(), sb.loss.to_bits(), "update {k}");
        }
        assert_eq!(
            a.online.params(),
            b.online.params(),
            "identical continued training"
        );
        assert_eq!(a.target_params, b.target_params);
        assert_eq!(a.online.adam(), b.online.adam());
    }

    #[test]
    fn loading_a_mismatched_checkpoint_names_the_tensor() {
        let a = learner(1);
        let mut ck = a.state_dict();
        ck.tensors.remove("model.encoder.0.weight");
        ck.path = "x.safetensors".into();
        let err = learner(2).load_state_dict(&ck).unwrap_err().to_string();
        assert_eq!(
            err,
            "checkpoint x.safetensors: missing tensor model.encoder.0.weight"
        );
    }

    #[test]
    fn a_non_finite_loss_reaches_the_caller_typed() {
        let cfg = Config::parse(
            "[env]\nid = \"CartPole-v0\"\n[policy.learn]\nlearning_rate = 1e30\n",
            "t.toml",
            &[],
        )
        .unwrap();
        let drill_config::Policy::Dqn(p) = &cfg.policy else {
            unreachable!()
        };
        let mut null = crate::context::NullReporter;
        let mut run = RunContext {
            device: Device::flex(),
            spec: envs::env_spec(&cfg).unwrap(),
            reporter: &mut null,
            resume: None,
            dist: None,
            restarts: 0,
            replay_dir: None,
        };
        let e = train(&cfg, p, &mut run).unwrap_err();
        assert!(matches!(e.cause(), TrainError::NonFinite { .. }), "{e}");
        assert!(
            e.to_string().starts_with("middleware 'learner' (forward)"),
            "{e}"
        );
    }

    #[test]
    fn updates_reduce_the_td_error_on_a_fixed_batch() {
        let mut l = learner(3);
        let b = batch(5);
        let first = l.update(&b, None).unwrap().loss;
        let mut last = first;
        for _ in 0..2 {
            last = l.update(&b, None).unwrap().loss;
        }
        assert!(last < first, "loss {first} -> {last}");
    }
}
