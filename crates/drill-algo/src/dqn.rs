//! DQN as DI-engine runs it: MLP encoder + dueling head, double-DQN targets, n-step returns,
//! hard (or soft) target updates, epsilon-greedy exploration on an exponential schedule driven
//! by env steps, uniform (or prioritized) replay, Adam, MSE TD loss.
//!
//! Read top to bottom: setup, then the loop `evaluate? → collect n_sample → update ×
//! update_per_collect`. Hyper-parameters come from [`DqnPolicy`] (the `[policy]` table).

use crate::checkpoint::Checkpoint;
use crate::data::{Batch, NStep, ReplayBuffer};
use crate::eval::ActionBuf;
use crate::explore::epsilon;
use crate::nets::QNet;
use crate::optim::{ParamLayout, Trainer};
use crate::run::{RunContext, TrainError, TrainResult};
use crate::session::Session;
use burn::tensor::{Device, Int, Tensor, TensorData};
use drill_config::{Config, DqnPolicy};
use drill_env::Actions;
use rand::Rng;

/// The Q-network for `env_id` as `[policy.model]` describes it, checking its shapes.
pub fn build_qnet(cfg: &Config, p: &DqnPolicy, device: &Device) -> Result<QNet, TrainError> {
    let spec = drill_env::spec(&cfg.env.id).map_err(|e| cfg.error("env.id", e.to_string()))?;
    let drill_env::ActionSpace::Discrete(actions) = spec.action_space else {
        return Err(cfg
            .error(
                "policy.type",
                format!(
                    "DQN needs discrete actions; {} is continuous (use ppo)",
                    spec.id
                ),
            )
            .into());
    };
    check_shapes(
        cfg,
        (p.model.obs_shape, p.model.action_shape),
        (spec.obs_dim, actions),
    )?;
    Ok(QNet::new(
        spec.obs_dim,
        &p.model.encoder_hidden_size_list,
        actions,
        p.model.dueling,
        device,
    ))
}

/// Check `policy.model.obs_shape` / `action_shape` (when given) against the environment's.
pub(crate) fn check_shapes(
    cfg: &Config,
    given: (Option<usize>, Option<usize>),
    env: (usize, usize),
) -> Result<(), TrainError> {
    for (path, given, env) in [
        ("policy.model.obs_shape", given.0, env.0),
        ("policy.model.action_shape", given.1, env.1),
    ] {
        if let Some(g) = given.filter(|&g| g != env) {
            return Err(cfg
                .error(path, format!("is {g} but {} has {env}", cfg.env.id))
                .into());
        }
    }
    Ok(())
}

/// Greedy actions for a batch of observations.
pub fn greedy(net: &QNet, obs: &[f32], obs_dim: usize, device: &Device, out: &mut [u32]) {
    let n = obs.len() / obs_dim;
    let q = net
        .forward(Tensor::from_data(
            TensorData::new(obs.to_vec(), [n, obs_dim]),
            device,
        ))
        .into_data();
    let q = q.as_slice::<f32>().expect("f32 q-values");
    let actions = q.len() / n;
    for (i, a) in out.iter_mut().enumerate() {
        let row = &q[i * actions..(i + 1) * actions];
        *a = argmax(row) as u32;
    }
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    best
}

/// One DQN learner: online net (trained), target net, and the update rule. Split out of
/// [`train`] so benchmarks and tests can drive updates directly.
pub struct DqnLearner {
    /// Online network with its flat parameters and Adam state.
    pub online: Trainer<QNet>,
    /// Target network (no gradients).
    pub target: QNet,
    target_params: Vec<f32>,
    layout: ParamLayout,
    device: Device,
    ad_device: Device,
    obs_dim: usize,
    gamma_ignore_done: bool,
    lr: f64,
    target_update_freq: u64,
    target_theta: Option<f64>,
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

impl DqnLearner {
    /// A learner for `net` (built on `device.autodiff()`; `device` is the plain device).
    pub fn new(net: QNet, p: &DqnPolicy, obs_dim: usize, device: &Device) -> Self {
        let online = Trainer::new(net, 1e-8);
        let layout = online.layout.clone();
        let target_params = online.params.clone();
        Self {
            target: online.inference(),
            online,
            target_params,
            layout,
            device: device.clone(),
            ad_device: device.clone().autodiff(),
            obs_dim,
            gamma_ignore_done: p.learn.ignore_done,
            lr: p.learn.learning_rate,
            target_update_freq: p.learn.target_update_freq,
            target_theta: p.learn.target_theta,
            iters: 0,
        }
    }

    /// Train data-parallel on `pg`: rank 0's online and target networks are broadcast, and
    /// every update averages gradients across ranks.
    pub fn distribute(
        &mut self,
        pg: drill_comm::ProcessGroup,
        opts: crate::ddp::DdpOptions,
    ) -> Result<(), TrainError> {
        pg.broadcast(&mut self.target_params, 0)?;
        self.write_target();
        self.online.distribute(pg, opts)
    }

    /// One gradient step on `batch`; returns the TD errors (for priorities) through `td_out`.
    pub fn update(
        &mut self,
        batch: &Batch,
        td_out: Option<&mut Vec<f32>>,
    ) -> Result<UpdateStats, TrainError> {
        let (bs, d) = (batch.actions.len(), self.obs_dim);
        let plain = &self.device;
        // ALGO: double-DQN target y = r + gamma^m (1 - done) Q_target(s', argmax_a Q_online(s', a)).
        let next = Tensor::<2>::from_data(TensorData::new(batch.next_obs.clone(), [bs, d]), plain);
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
        let obs = Tensor::<2>::from_data(TensorData::new(batch.obs.clone(), [bs, d]), &ad);
        let actions =
            Tensor::<2, Int>::from_data(TensorData::new(batch.actions.clone(), [bs, 1]), &ad);
        let q_sa = self
            .online
            .model()
            .forward(obs)
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
        // ALGO: target network update (hard every N iterations, or soft every iteration).
        if let Some(theta) = self.target_theta {
            let t = theta as f32;
            for (tp, op) in self.target_params.iter_mut().zip(&self.online.params) {
                *tp = t * op + (1.0 - t) * *tp;
            }
            self.write_target();
        } else if self.iters.is_multiple_of(self.target_update_freq) {
            self.target_params.copy_from_slice(&self.online.params);
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

    /// Save online net, Adam state, target net and the iteration counter.
    pub fn save(&self, ck: &mut Checkpoint) {
        ck.put_trainer("model", &self.online);
        ck.put_params("target", &self.layout, &self.target_params);
        ck.meta.insert("train_iters".into(), self.iters.to_string());
    }

    /// A checkpoint holding what [`Self::save`] writes.
    pub fn checkpoint(&self) -> Checkpoint {
        let mut ck = Checkpoint::default();
        self.save(&mut ck);
        ck
    }

    /// Restore what [`Self::save`] wrote.
    pub fn load(&mut self, ck: &Checkpoint) -> Result<(), TrainError> {
        ck.get_trainer("model", &mut self.online)?;
        self.target_params = ck.get_params("target", &self.layout)?;
        self.write_target();
        self.iters = ck.counter("train_iters")?;
        Ok(())
    }
}

/// Train DQN as configured; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
pub fn train(
    cfg: &Config,
    p: &DqnPolicy,
    ctx: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    // PLUMBING: seeding, environments, networks, storage.
    let mut s = Session::new(cfg, ctx, "dqn")?;
    let n_env = cfg.env.collector_env_num;
    let obs_dim = s.venv.spec().obs_dim;
    let n_actions = s.venv.spec().action_space.dim() as u32;
    let plain = ctx.device.clone();
    let mut learner = DqnLearner::new(
        build_qnet(cfg, p, &plain.clone().autodiff())?,
        p,
        obs_dim,
        &plain,
    );
    if let Some(ck) = &ctx.resume {
        learner.load(ck)?;
    }
    if let Some(pg) = s.dist() {
        learner.distribute(pg.clone(), Session::ddp_options(cfg))?;
    }
    let batch_size = s.per_rank(cfg, p.learn.batch_size);
    let n_sample = s.per_rank(cfg, p.collect.n_sample);
    let rb = &p.other.replay_buffer;
    let mut buffer = if rb.priority {
        ReplayBuffer::prioritized(rb.replay_buffer_size, obs_dim, rb.priority_alpha)
    } else {
        ReplayBuffer::new(rb.replay_buffer_size, obs_dim)
    };
    let mut nstep = NStep::new(p.nstep, p.discount_factor as f32, n_env, obs_dim);
    let learning_starts = p.learn.learning_starts.max(batch_size);
    let eval_freq = p.eval.evaluator.eval_freq;
    let mut actions = vec![0u32; n_env];
    let mut prev_obs = vec![0.0f32; n_env * obs_dim];
    let mut batch = Batch::default();
    let mut td = Vec::new();
    let mut acting = learner.online.inference();

    loop {
        // ALGO: evaluate greedily every eval_freq train iterations (and before training).
        if s.eval_due(learner.iters, eval_freq) {
            let policy = |obs: &[f32], out: &mut ActionBuf| {
                if let ActionBuf::Discrete(a) = out {
                    greedy(&acting, obs, obs_dim, &plain, a);
                }
            };
            if s.evaluate(cfg, ctx, learner.iters, policy, &mut || {
                learner.checkpoint()
            })? {
                break;
            }
        }
        if s.limits_reached(cfg, learner.iters)? {
            break;
        }

        // ALGO: collect n_sample transitions with epsilon-greedy actions; the schedule runs
        // on the global env-step count.
        let mut local = 0u64;
        for _ in 0..n_sample.div_ceil(n_env) {
            let eps = epsilon(&p.other.eps, s.env_steps_now(local));
            prev_obs.copy_from_slice(s.venv.obs());
            greedy(&acting, &prev_obs, obs_dim, &plain, &mut actions);
            for a in actions.iter_mut() {
                if s.rng.random::<f64>() < eps {
                    *a = s.rng.random_range(0..n_actions);
                }
            }
            s.venv.step(Actions::Discrete(&actions));
            let venv = &s.venv;
            for i in 0..n_env {
                let (term, trunc) = (venv.terminated()[i], venv.truncated()[i]);
                let (obs, next) = (
                    &prev_obs[i * obs_dim..(i + 1) * obs_dim],
                    &venv.final_obs()[i * obs_dim..(i + 1) * obs_dim],
                );
                nstep.push(
                    i,
                    obs,
                    actions[i],
                    venv.rewards()[i],
                    next,
                    term,
                    trunc,
                    |t| buffer.push(&t),
                );
                if term || trunc {
                    ctx.reporter.scalar(
                        "charts/episodic_return",
                        venv.final_returns()[i],
                        s.env_steps_now(local),
                    );
                }
            }
            local += n_env as u64;
        }
        s.collected(local)?;

        // ALGO: update_per_collect gradient steps on uniform (or prioritized) minibatches,
        // pausing at an evaluation boundary as DI-engine's learner does. Under DDP rank 0's
        // buffer decides (buffers fill alike but not in lock step when n-step episodes end at
        // different times), so all ranks run the same number of updates.
        if s.rank0_decides(buffer.len() >= learning_starts)? {
            let mut stats = UpdateStats::default();
            for _ in 0..p.learn.update_per_collect {
                buffer.sample(batch_size, rb.priority_beta, &mut s.rng, &mut batch);
                stats = learner.update(&batch, rb.priority.then_some(&mut td))?;
                if !stats.loss.is_finite() {
                    return Err(TrainError::NonFinite {
                        iter: learner.iters,
                        value: f64::from(stats.loss),
                    });
                }
                if rb.priority {
                    buffer.update_priorities(&batch.indices, &td);
                }
                if learner.iters.is_multiple_of(eval_freq) {
                    break;
                }
            }
            acting = learner.online.inference();
            let mut logged = [stats.loss, stats.target_q_mean];
            s.mean_across_ranks(&mut logged)?;
            ctx.reporter
                .scalar("losses/td_loss", f64::from(logged[0]), s.env_steps);
            ctx.reporter
                .scalar("losses/target_q_mean", f64::from(logged[1]), s.env_steps);
            ctx.reporter.scalar(
                "charts/epsilon",
                epsilon(&p.other.eps, s.env_steps),
                s.env_steps,
            );
        }
        s.progress(cfg, ctx, learner.iters);
    }
    let iters = learner.iters;
    s.finish(ctx, iters, &mut || learner.checkpoint())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nets::QNet;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn batch(seed: u64) -> Batch {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bs = 16;
        Batch {
            obs: (0..bs * 4).map(|_| rng.random_range(-1.0..1.0)).collect(),
            next_obs: (0..bs * 4).map(|_| rng.random_range(-1.0..1.0)).collect(),
            actions: (0..bs).map(|_| rng.random_range(0..2)).collect(),
            rewards: (0..bs).map(|_| rng.random_range(0.0..1.0)).collect(),
            dones: (0..bs).map(|k| (k % 5 == 0) as u8 as f32).collect(),
            discounts: vec![0.9; bs],
            weights: vec![1.0; bs],
            indices: (0..bs).collect(),
        }
    }

    fn learner(seed: u64) -> DqnLearner {
        let device = Device::flex();
        device.seed(seed);
        let mut p = DqnPolicy::default();
        p.learn.target_update_freq = 3;
        let net = QNet::new(4, &[16, 8], 2, true, &device.clone().autodiff());
        DqnLearner::new(net, &p, 4, &device)
    }

    fn q_values(l: &DqnLearner, b: &Batch) -> Vec<f32> {
        let x = Tensor::<2>::from_data(TensorData::new(b.obs.clone(), [16, 4]), &Device::flex());
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
        let mut ck = a.checkpoint();
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
        b.load(&loaded).unwrap();
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
            a.online.params, b.online.params,
            "identical continued training"
        );
        assert_eq!(a.target_params, b.target_params);
        assert_eq!(a.online.adam, b.online.adam);
    }

    #[test]
    fn loading_a_mismatched_checkpoint_names_the_tensor() {
        let a = learner(1);
        let mut ck = a.checkpoint();
        ck.tensors.remove("model.encoder.0.weight");
        ck.path = "x.safetensors".into();
        let err = learner(2).load(&ck).unwrap_err().to_string();
        assert_eq!(
            err,
            "checkpoint x.safetensors: missing tensor model.encoder.0.weight"
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
