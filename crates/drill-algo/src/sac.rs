//! SAC (Haarnoja et al. 2018) as CleanRL's `sac_continuous_action` and DI-engine's
//! `SACPolicy` write it: a tanh-squashed Gaussian actor, twin Q critics with soft-updated
//! targets, a learned temperature towards the entropy target `-action_dim`, uniform replay.
//!
//! Read top to bottom: the squashing (`squash`), acting (random warm-up, sampling for
//! collection, the mean for evaluation), the update ([`Sac`]'s [`Policy::learn`]: critics,
//! then actor, then temperature, then targets), then [`train`]: the pipeline of built-in
//! middlewares `evaluate? → collect n_sample → push → update × update_per_collect → log` —
//! DQN's off-policy data path, unchanged. Hyper-parameters come from [`SacPolicy`].

use std::cell::RefCell;

use crate::checkpoint::{Checkpoint, CheckpointExt};
use crate::context;
use crate::context::{RunContext, TrainResult};
use crate::data::Batch;
use crate::data::ReplayBuffer;
use crate::ddp;
use crate::ddp::Ranks;
use crate::envs;
use crate::error::TrainError;
use crate::middleware::{
    CkptSaver, DataPusher, InteractionEvaluator, NStepRewardEnhancer, OffPolicyLearner,
    OnlineLogger, Outputs, StepCollector, TerminationChecker, TrainClock, run_result,
};
use crate::nets;
use crate::nets::{HALF_LN_2PI, SquashedGaussian, TwinQ, input};
use crate::optim::{ActingCopy, Adam, Trainer};
use crate::policy::{Acted, Explore, Hidden, LearnOutput, Policy};
use crate::resume;
use burn::tensor::{Device, Tensor, TensorData};
use drill_config::{Config, SacPolicy};
use drill_env::{ActionBuf, ActionSpace, EnvSpec, Obs};
use drill_task::Task;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

/// The action box as `scale * a + bias` for `a` in `[-1, 1]`, per dimension.
#[derive(Debug, Clone)]
struct Squash {
    scale: Vec<f32>,
    bias: Vec<f32>,
    low: Vec<f32>,
    high: Vec<f32>,
}

impl Squash {
    fn new(low: &[f32], high: &[f32]) -> Self {
        Self {
            scale: low.iter().zip(high).map(|(l, h)| (h - l) / 2.0).collect(),
            bias: low.iter().zip(high).map(|(l, h)| (h + l) / 2.0).collect(),
            low: low.to_vec(),
            high: high.to_vec(),
        }
    }

    fn row(v: &[f32], device: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [1, v.len()]), device)
    }
}

/// Reparameterised sample of the squashed Gaussian: `(action in the box, log-probability)`,
/// with `noise` standard-normal `[batch, act_dim]` (CleanRL's `get_action`).
fn squash(
    mean: Tensor<2>,
    log_std: Tensor<2>,
    noise: Tensor<2>,
    sq: &Squash,
) -> (Tensor<2>, Tensor<1>) {
    let device = mean.device();
    let [b, _] = mean.dims();
    let u = mean + log_std.clone().exp() * noise.clone();
    let a = burn::tensor::activation::tanh(u);
    let scale = Squash::row(&sq.scale, &device);
    // log N(u; mean, std) - log(scale * (1 - tanh(u)^2) + 1e-6)
    let gauss = (noise.clone() * noise).mul_scalar(-0.5) - log_std - HALF_LN_2PI;
    let jacobian = (scale.clone() * (a.clone().square().neg().add_scalar(1.0))).add_scalar(1e-6);
    let logp = (gauss - jacobian.log()).sum_dim(1).reshape([b]);
    let action = a * scale + Squash::row(&sq.bias, &device);
    (action, logp)
}

fn noise(rng: &mut ChaCha8Rng, b: usize, dim: usize, device: &Device) -> Tensor<2> {
    let z: Vec<f32> = (0..b * dim).map(|_| rng.sample(StandardNormal)).collect();
    Tensor::from_data(TensorData::new(z, [b, dim]), device)
}

/// Check that `[policy.model]` makes SAC's networks for the environment `spec` describes,
/// without building them: continuous actions and the given shapes. Returns the action
/// bounds.
pub(crate) fn check_model<'a>(
    cfg: &Config,
    p: &SacPolicy,
    spec: &'a EnvSpec,
) -> Result<(&'a [f32], &'a [f32]), TrainError> {
    let ActionSpace::Continuous { low, high } = &spec.action_space else {
        return Err(cfg
            .error(
                "policy.type",
                format!(
                    "SAC needs continuous actions; {} is discrete (use dqn or ppo)",
                    spec.id
                ),
            )
            .into());
    };
    nets::check_shapes(
        cfg,
        (p.model.obs_shape.as_ref(), p.model.action_shape),
        (&spec.obs.shape, low.len()),
    )?;
    Ok((low, high))
}

/// SAC: the actor and twin critics with their flat parameters and Adam states, the critics'
/// targets, the temperature, and the actor copy the collector and evaluator act with.
pub(crate) struct Sac {
    /// The actor.
    pub(crate) actor: Trainer<SquashedGaussian>,
    /// Both critics.
    pub(crate) critic: Trainer<TwinQ>,
    target: TwinQ,
    target_params: Vec<f32>,
    /// `ln alpha` and its Adam state.
    log_alpha: [f32; 1],
    alpha_adam: Adam,
    acting: ActingCopy<SquashedGaussian>,
    sq: Squash,
    p: SacPolicy,
    ranks: Ranks,
    obs_dim: usize,
    act_dim: usize,
    device: Device,
    ad: Device,
    /// Updates done.
    pub(crate) iters: u64,
}

impl Sac {
    /// SAC for the environment `spec` describes, on `device` (the plain device); `ranks`
    /// average the temperature's gradient under DDP.
    pub(crate) fn from_spec(
        cfg: &Config,
        p: &SacPolicy,
        spec: &EnvSpec,
        device: &Device,
        ranks: Ranks,
    ) -> Result<Self, TrainError> {
        let (low, high) = check_model(cfg, p, spec)?;
        let (obs_dim, act_dim) = (spec.obs_dim(), low.len());
        let ad = device.clone().autodiff();
        let actor = Trainer::new(
            SquashedGaussian::new(obs_dim, p.model.actor_head_hidden_size, act_dim, &ad),
            1e-8,
        );
        let critic = Trainer::new(
            TwinQ::new(obs_dim, act_dim, p.model.critic_head_hidden_size, &ad),
            1e-8,
        );
        Ok(Self {
            acting: ActingCopy::new(&actor),
            target: critic.inference(),
            target_params: critic.params().to_vec(),
            actor,
            critic,
            log_alpha: [p.learn.init_alpha.ln() as f32],
            alpha_adam: Adam::new(1, 1e-8),
            sq: Squash::new(low, high),
            p: p.clone(),
            ranks,
            obs_dim,
            act_dim,
            device: device.clone(),
            ad,
            iters: 0,
        })
    }

    /// Train data-parallel on `pg`: rank 0's networks are broadcast; every update averages
    /// gradients across ranks.
    pub(crate) fn distribute(
        &mut self,
        pg: drill_comm::ProcessGroup,
        opts: crate::optim::DdpOptions,
    ) -> Result<(), TrainError> {
        pg.broadcast(&mut self.target_params, 0)?;
        self.write_target();
        self.actor.distribute(pg.clone(), opts)?;
        self.critic.distribute(pg, opts)?;
        self.acting.invalidate();
        Ok(())
    }

    fn alpha(&self) -> f32 {
        self.log_alpha[0].exp()
    }

    fn write_target(&mut self) {
        let target = std::mem::replace(&mut self.target, self.critic.inference());
        self.target = self.critic.layout().write(target, &self.target_params);
    }

    /// The actor's mean and log-std for a batch, as host vectors.
    fn gaussian(&mut self, obs: Obs<'_>) -> (Vec<f32>, Vec<f32>) {
        let actor = self.acting.get(&self.actor);
        let (mean, log_std) = actor.forward(input(obs, self.obs_dim, &self.device).float());
        (
            mean.into_data().try_into_vec().expect("f32 mean"),
            log_std.into_data().try_into_vec().expect("f32 log-std"),
        )
    }
}

impl Policy for Sac {
    type Data = Batch;
    const NAME: &'static str = "sac";

    fn eval(&mut self, obs: Obs<'_>, _: &mut Hidden, out: &mut ActionBuf) {
        let n = obs.len() / self.obs_dim;
        let (mean, _) = self.gaussian(obs);
        let (dim, sq) = (self.act_dim, &self.sq);
        for (k, a) in out.continuous_mut(n, dim).iter_mut().enumerate() {
            *a = mean[k].tanh() * sq.scale[k % dim] + sq.bias[k % dim];
        }
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
        let dim = self.act_dim;
        // ALGO: uniformly random actions for the first random_collect_size env steps.
        if explore.env_step < self.p.random_collect_size {
            let sq = &self.sq;
            for (k, a) in out.actions.continuous_mut(n, dim).iter_mut().enumerate() {
                *a = rng.random_range(sq.low[k % dim]..=sq.high[k % dim]);
            }
            return;
        }
        // ALGO: then a = scale * tanh(mean + std * z) + bias, z ~ N(0, 1).
        let (mean, log_std) = self.gaussian(obs);
        let sq = &self.sq;
        for (k, a) in out.actions.continuous_mut(n, dim).iter_mut().enumerate() {
            let z: f32 = rng.sample(StandardNormal);
            let u = mean[k] + log_std[k].exp() * z;
            *a = u.tanh() * sq.scale[k % dim] + sq.bias[k % dim];
        }
    }

    fn learn(
        &mut self,
        batch: &Batch,
        _env_step: u64,
        rng: &mut ChaCha8Rng,
        out: &mut LearnOutput,
    ) -> Result<(), TrainError> {
        let (bs, d, dim) = (batch.len(), self.obs_dim, self.act_dim);
        let (plain, ad) = (self.device.clone(), self.ad.clone());
        let alpha = self.alpha();
        let ActionBuf::Continuous { values, .. } = &batch.actions else {
            unreachable!("SAC's replay holds continuous actions")
        };
        // ALGO: soft target y = r + gamma^m (1 - done) (min_i Q'_i(s', a') - alpha log pi(a'|s')),
        // a' sampled from the current actor.
        let next = input(batch.next_obs.as_obs(), d, &plain).float();
        let (mean, log_std) = self.actor.inference().forward(next.clone());
        let (next_a, next_logp) = squash(mean, log_std, noise(rng, bs, dim, &plain), &self.sq);
        let (q1t, q2t) = self.target.forward(next, next_a);
        let soft = q1t.min_pair(q2t) - next_logp.mul_scalar(alpha);
        let soft: Vec<f32> = soft.into_data().try_into_vec().expect("f32 targets");
        let y: Vec<f32> = (0..bs)
            .map(|k| {
                let not_done = if self.p.learn.ignore_done {
                    1.0
                } else {
                    1.0 - batch.dones[k]
                };
                batch.rewards[k] + batch.discounts[k] * not_done * soft[k]
            })
            .collect();
        let y = Tensor::<1>::from_data(TensorData::new(y, [bs]), &ad);
        // ALGO: critics: mean squared error of both to y.
        let obs = input(batch.obs.as_obs(), d, &ad).float();
        let taken = Tensor::<2>::from_data(TensorData::new(values.clone(), [bs, dim]), &ad);
        let (q1, q2) = self.critic.model().forward(obs.clone(), taken);
        let q1_mean = q1.clone().mean().into_scalar::<f32>();
        let qf_loss = (q1 - y.clone()).square().mean() + (q2 - y).square().mean();
        let qf_value = qf_loss.clone().into_scalar::<f32>();
        self.critic.backward(qf_loss)?;
        self.critic.step(self.p.learn.learning_rate_q, 0.0)?;
        // ALGO: actor: minimise alpha log pi(a|s) - min_i Q_i(s, a), a reparameterised.
        let (mean, log_std) = self.actor.model().forward(obs.clone());
        let (a, logp) = squash(mean, log_std, noise(rng, bs, dim, &ad), &self.sq);
        let (q1p, q2p) = self.critic.model().forward(obs, a);
        let actor_loss = (logp.clone().mul_scalar(alpha) - q1p.min_pair(q2p)).mean();
        let actor_value = actor_loss.clone().into_scalar::<f32>();
        let logp: Vec<f32> = logp.into_data().try_into_vec().expect("f32 log-probs");
        self.actor.backward(actor_loss)?;
        self.actor.step(self.p.learn.learning_rate_policy, 0.0)?;
        // ALGO: temperature: minimise -ln(alpha) * (log pi + target entropy), target = -dim.
        if self.p.learn.auto_alpha {
            let target_entropy = -(dim as f32);
            let mean_gap = logp.iter().map(|l| l + target_entropy).sum::<f32>() / bs as f32;
            let mut grad = [-mean_gap];
            self.ranks.mean(&mut grad)?;
            let lr = self.p.learn.learning_rate_alpha as f32;
            self.alpha_adam.step(&mut self.log_alpha, &grad, lr);
        }
        // ALGO: targets follow the critics softly.
        let theta = self.p.learn.target_theta as f32;
        for (t, o) in self.target_params.iter_mut().zip(self.critic.params()) {
            *t = theta * o + (1.0 - theta) * *t;
        }
        self.write_target();
        self.iters += 1;
        self.acting.invalidate();
        out.loss = qf_value;
        out.scalars.extend([
            ("losses/qf_loss", qf_value),
            ("losses/actor_loss", actor_value),
            ("losses/alpha", alpha),
            ("losses/qf1_values", q1_mean),
        ]);
        Ok(())
    }

    fn train_iter(&self) -> u64 {
        self.iters
    }

    /// Actor, critics (with their Adam states), critic targets, temperature (with its Adam
    /// state) and the iteration counter.
    fn state_dict(&self) -> Checkpoint {
        let mut ck = Checkpoint::default();
        ck.put_trainer("actor", &self.actor);
        ck.put_trainer("critic", &self.critic);
        ck.put_params("critic_target", self.critic.layout(), &self.target_params);
        let a = &self.alpha_adam;
        for (name, v) in [
            ("log_alpha", self.log_alpha[0]),
            ("log_alpha_optim.adam_m", a.m[0]),
            ("log_alpha_optim.adam_v", a.v[0]),
        ] {
            ck.tensors.insert(name.into(), (vec![1], vec![v]));
        }
        ck.meta
            .insert("log_alpha_optim.adam_t".into(), a.t.to_string());
        ck.meta.insert("train_iters".into(), self.iters.to_string());
        ck
    }

    fn load_state_dict(&mut self, ck: &Checkpoint) -> Result<(), TrainError> {
        ck.get_trainer("actor", &mut self.actor)?;
        ck.get_trainer("critic", &mut self.critic)?;
        self.target_params = ck.get_params("critic_target", self.critic.layout())?;
        self.write_target();
        self.log_alpha = [ck.tensor_shaped("log_alpha", &[1])?[0]];
        self.alpha_adam.m = ck.tensor_shaped("log_alpha_optim.adam_m", &[1])?.to_vec();
        self.alpha_adam.v = ck.tensor_shaped("log_alpha_optim.adam_v", &[1])?.to_vec();
        self.alpha_adam.t = ck.counter("log_alpha_optim.adam_t")?;
        self.iters = ck.counter("train_iters")?;
        self.acting.invalidate();
        Ok(())
    }

    fn weights(&self) -> Vec<f32> {
        self.actor.params().to_vec()
    }

    fn load_weights(&mut self, weights: &[f32]) {
        self.acting.load(self.actor.layout(), weights);
    }
}

/// Train SAC as configured; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
pub(crate) fn train(
    cfg: &Config,
    p: &SacPolicy,
    run: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    // PLUMBING: seeding, environments, networks, storage.
    let clock = TrainClock::start(run.resume.as_ref());
    let ranks = ddp::setup(cfg, run);
    let streams = resume::stream_seed(cfg, run.resume.as_ref(), run.restarts);
    let (rank, world) = (ranks.rank(), ranks.world());
    let spec = &run.spec;
    let mut sac = Sac::from_spec(cfg, p, spec, &run.device, ranks.clone())?;
    let env_step = resume::restore(&mut sac, run.resume.as_ref())?;
    if let Some(pg) = ranks.group() {
        sac.distribute(pg.clone(), ddp::options(cfg))?;
    }
    let sac = RefCell::new(sac);
    let rng = RefCell::new(resume::rank_rng(streams, run.resume.as_ref(), rank));
    let buffer = RefCell::new(ReplayBuffer::from_config(
        &p.other.replay_buffer,
        spec,
        run.resume.as_ref(),
        rank,
        world,
    )?);
    let eval_freq = p.eval.evaluator.eval_freq;
    let out = Outputs::new(&mut *run.reporter);
    let iters = sac.borrow().iters;
    let mut task = context::task(cfg, Task::new(), env_step, iters);

    // ALGO: the same off-policy pipeline as DQN, without epsilon (SAC explores by sampling).
    let evaluator = envs::evaluator(cfg, world, ranks.rank(), ranks.world())?;
    task.use_mw(InteractionEvaluator::new(
        evaluator,
        eval_freq,
        cfg.env.stop_value,
        ranks.clone(),
        &sac,
    ));
    let mut saver = CkptSaver::new(&out, &sac, ranks.clone(), &rng, clock);
    if let Some(dir) = &run.replay_dir {
        saver = saver.save_replay(&buffer, dir.clone());
    }
    task.use_mw(saver);
    task.use_mw(TerminationChecker::new(
        cfg.max_env_step,
        cfg.max_train_iter,
        ranks.clone(),
    ));
    task.use_mw(StepCollector::new(
        envs::collector_envs(cfg, streams, rank)?,
        ddp::split(cfg, &ranks, p.collect.n_sample),
        &sac,
        &rng,
        ranks.clone(),
    ));
    task.use_mw(NStepRewardEnhancer::new(
        1,
        p.learn.discount_factor as f32,
        cfg.env.collector_env_num,
        &spec.obs,
        &spec.action_space,
    ));
    task.use_mw(DataPusher::new(&buffer));
    let batch_size = ddp::split(cfg, &ranks, p.learn.batch_size);
    let mut learn = OffPolicyLearner::new(&sac, &buffer, &rng, ranks.clone());
    learn.batch_size = batch_size;
    learn.update_per_collect = p.learn.update_per_collect;
    learn.learning_starts = batch_size;
    learn.eval_freq = eval_freq;
    task.use_mw(learn);
    task.use_mw(OnlineLogger::new(&out, cfg.max_env_step, env_step));
    let ctx = task.run(None)?;
    Ok(run_result(&ctx, env_step, &clock, world, run.restarts))
}
