//! On-policy data path: [`RolloutCollector`] → [`GaeEstimator`] (PPO) or [`VtraceEstimator`]
//! (APPO) → [`OnPolicyLearner`].

use std::cell::RefCell;

use drill_env::{ActionBuf, DynVecEnv, ObsBuf};
use drill_task::{Middleware, OnlineRLContext, TaskError, TaskHandle};
use rand_chacha::ChaCha8Rng;

use super::learner::log_scalars;
use super::{EpisodeReturns, account_collection, task_err};
use crate::data::{Rollout, Trajectory, VtraceClip, gae, vtrace};
use crate::ddp::Ranks;
use crate::error::TrainError;
use crate::policy::{Acted, Explore, Hidden, LearnOutput, Policy};

/// Running variance of the discounted return, for reward scaling (SB3's `VecNormalize`).
struct RewardScaler {
    ret: Vec<f64>,
    count: f64,
    mean: f64,
    m2: f64,
    gamma: f64,
}

impl RewardScaler {
    fn scale(&mut self, i: usize, r: f32, done: bool) -> f32 {
        self.ret[i] = self.ret[i] * self.gamma + f64::from(r);
        self.count += 1.0;
        let delta = self.ret[i] - self.mean;
        self.mean += delta / self.count;
        self.m2 += delta * (self.ret[i] - self.mean);
        if done {
            self.ret[i] = 0.0;
        }
        let var = if self.count > 1.0 {
            self.m2 / self.count
        } else {
            1.0
        };
        (f64::from(r) / (var.sqrt() + 1e-8)).clamp(-10.0, 10.0) as f32
    }
}

/// Rolls out `steps` steps in every env copy with the policy's collect side into a
/// [`Rollout`], with the critic's values of every state (from the collect side's own forward
/// pass) and of every next state: the next row's value while the episode goes on, one
/// forward pass over the last observations for the final step, and one over the final
/// observations of truncated episodes (DI-engine bootstraps truncation from the final
/// observation); adds every rank's env steps to `ctx.env_step`.
pub(crate) struct RolloutCollector<'a, P> {
    venv: Box<dyn DynVecEnv>,
    steps: usize,
    policy: &'a RefCell<P>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    scaler: Option<RewardScaler>,
    acted: Acted,
    bootstrap: Vec<f32>,
    /// The policy's recurrent state per env copy, carried across rollouts.
    hidden: Hidden,
}

impl<'a, P: Policy<Data = Rollout>> RolloutCollector<'a, P> {
    /// `steps` vector steps per task step from `venv` (already reset).
    pub(crate) fn new(
        venv: Box<dyn DynVecEnv>,
        steps: usize,
        policy: &'a RefCell<P>,
        rng: &'a RefCell<ChaCha8Rng>,
        ranks: Ranks,
    ) -> Self {
        Self {
            venv,
            steps: steps.max(1),
            policy,
            rng,
            ranks,
            scaler: None,
            acted: Acted::default(),
            bootstrap: Vec::new(),
            hidden: Hidden::default(),
        }
    }

    /// Scale rewards by the running standard deviation of the `gamma`-discounted return.
    pub(crate) fn reward_norm(mut self, gamma: f64) -> Self {
        self.scaler = Some(RewardScaler {
            ret: vec![0.0; self.venv.num_envs()],
            count: 0.0,
            mean: 0.0,
            m2: 0.0,
            gamma,
        });
        self
    }
}

impl<P: Policy<Data = Rollout>> Middleware<OnlineRLContext> for RolloutCollector<'_, P> {
    fn name(&self) -> String {
        "rollout_collector".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let (n, spec) = (self.venv.num_envs(), self.venv.spec());
        let d = spec.obs_dim();
        let rows = self.steps * n;
        let mut r = Rollout {
            obs_dim: d,
            num_envs: n,
            obs: ObsBuf::zeros(spec.obs.dtype, rows * d),
            actions: ActionBuf::for_space(&spec.action_space, 0),
            logp: vec![0.0; rows],
            rewards: vec![0.0; rows],
            terminated: vec![false; rows],
            ended: vec![false; rows],
            values: vec![0.0; rows],
            bootstrap_obs: ObsBuf::new(spec.obs.dtype),
            hidden0: self.hidden.clone(),
            ..Rollout::default()
        };
        let explore = Explore {
            epsilon: 0.0,
            env_step: ctx.env_step,
        };
        let mut returns = EpisodeReturns::default();
        let world = self.ranks.world() as u64;
        let mut rng = self.rng.borrow_mut();
        let mut policy = self.policy.borrow_mut();
        for t in 0..self.steps {
            let rows = t * n..(t + 1) * n;
            let obs = self.venv.obs();
            r.obs.write(rows.start * d, obs);
            self.acted.values.clear();
            policy.collect(obs, &mut self.hidden, &explore, &mut rng, &mut self.acted);
            if self.acted.values.len() != n {
                // A feed-forward policy's values (a recurrent one gives them with its
                // actions: its state has moved on).
                debug_assert!(self.hidden.is_empty());
                policy
                    .values(obs, &Hidden::default(), &mut self.acted.values)
                    .map_err(task_err)?;
            }
            r.values[rows.clone()].copy_from_slice(&self.acted.values);
            r.actions.extend(&self.acted.actions);
            r.logp[rows.clone()].copy_from_slice(&self.acted.logp);
            self.venv
                .step(self.acted.actions.as_actions())
                .map_err(task_err)?;
            let v = &self.venv;
            for i in 0..n {
                let (term, done) = (v.terminated()[i], v.terminated()[i] || v.truncated()[i]);
                let rew = v.rewards()[i];
                r.rewards[rows.start + i] = match &mut self.scaler {
                    Some(s) => s.scale(i, rew, done),
                    None => rew,
                };
                r.terminated[rows.start + i] = term;
                r.ended[rows.start + i] = done;
                if done {
                    let at = ctx.env_step + (t * n) as u64 * world;
                    returns.0.push((v.final_returns()[i], at));
                    if !term {
                        r.bootstrap_obs.extend(v.final_obs().rows(i..i + 1, d));
                        r.bootstrap_rows.push(rows.start + i);
                        r.bootstrap_hidden.push_row(&self.hidden, i);
                    }
                    // The next observation starts an episode: from a zero state.
                    self.hidden.reset(i);
                }
            }
        }
        // ALGO: V(next state): the next row's value while the episode goes on; for the last
        // step's observations and truncated episodes' final ones, one forward pass over
        // them (a terminated episode does not bootstrap).
        let last = rows - n;
        for i in 0..n {
            if !r.ended[last + i] {
                r.bootstrap_obs.extend(self.venv.obs().rows(i..i + 1, d));
                r.bootstrap_rows.push(last + i);
                r.bootstrap_hidden.push_row(&self.hidden, i);
            }
        }
        self.bootstrap.clear();
        if !r.bootstrap_rows.is_empty() {
            policy
                .values(
                    r.bootstrap_obs.as_obs(),
                    &r.bootstrap_hidden,
                    &mut self.bootstrap,
                )
                .map_err(task_err)?;
        }
        let values = std::mem::take(&mut r.values);
        r.fill_next_values(&values, &self.bootstrap);
        r.values = values;
        drop((rng, policy));
        ctx.ext.insert(r);
        account_collection(ctx, &self.ranks, rows as u64, returns)
    }
}

/// GAE advantages and returns from the rollout's values and next values (DI-engine's
/// `gae_estimator`; the values come from the collector's forward passes).
pub(crate) struct GaeEstimator {
    gamma: f32,
    lambda: f32,
}

impl GaeEstimator {
    /// Discount `gamma`, GAE `lambda`.
    pub(crate) fn new(gamma: f32, lambda: f32) -> Self {
        Self { gamma, lambda }
    }
}

impl Middleware<OnlineRLContext> for GaeEstimator {
    fn name(&self) -> String {
        "gae_estimator".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, _: &TaskHandle) -> Result<(), TaskError> {
        let Some(r) = ctx.ext.get_mut::<Rollout>() else {
            return Ok(());
        };
        r.adv = vec![0.0; r.len()];
        gae(
            &r.rewards,
            &r.values,
            &r.next_values,
            &r.terminated,
            &r.ended,
            r.num_envs,
            self.gamma,
            self.lambda,
            &mut r.adv,
        );
        r.returns = r.adv.iter().zip(&r.values).map(|(a, v)| a + v).collect();
        Ok(())
    }
}

/// V-trace targets and advantages for the step's [`Rollout`] (IMPALA's off-policy correction;
/// APPO's estimator): one forward pass of the learner's current weights gives the taken
/// actions' log-probabilities and the values of the rollout's observations and bootstrap
/// observations; the rollout's own log-probabilities are the behaviour policy's, which may be
/// older weights (a remote collector's). The learner's values replace the collector's (value
/// clipping is around them).
pub(crate) struct VtraceEstimator<'a, P> {
    policy: &'a RefCell<P>,
    gamma: f32,
    lambda: f32,
    clip: VtraceClip,
    target_logp: Vec<f32>,
    values: Vec<f32>,
    bootstrap: Vec<f32>,
}

impl<'a, P: Policy<Data = Rollout>> VtraceEstimator<'a, P> {
    /// Discount `gamma`, trace factor `lambda`, the importance weights clipped by `clip`.
    pub(crate) fn new(policy: &'a RefCell<P>, gamma: f32, lambda: f32, clip: VtraceClip) -> Self {
        Self {
            policy,
            gamma,
            lambda,
            clip,
            target_logp: Vec::new(),
            values: Vec::new(),
            bootstrap: Vec::new(),
        }
    }
}

impl<P: Policy<Data = Rollout>> Middleware<OnlineRLContext> for VtraceEstimator<'_, P> {
    fn name(&self) -> String {
        "vtrace_estimator".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let Some(r) = ctx.ext.get_mut::<Rollout>() else {
            return Ok(());
        };
        let mut policy = self.policy.borrow_mut();
        policy
            .evaluate_actions(r, &mut self.target_logp, &mut self.values)
            .map_err(task_err)?;
        self.bootstrap.clear();
        if !r.bootstrap_rows.is_empty() {
            // A recurrent policy's bootstrap states are the collector's (Sample Factory
            // keeps the actors' states too).
            policy
                .values(
                    r.bootstrap_obs.as_obs(),
                    &r.bootstrap_hidden,
                    &mut self.bootstrap,
                )
                .map_err(task_err)?;
        }
        drop(policy);
        r.fill_next_values(&self.values, &self.bootstrap);
        r.adv = vec![0.0; r.len()];
        r.returns = vec![0.0; r.len()];
        let t = Trajectory {
            rewards: &r.rewards,
            values: &self.values,
            next_values: &r.next_values,
            terminated: &r.terminated,
            episode_end: &r.ended,
            behaviour_logp: &r.logp,
            target_logp: &self.target_logp,
            num_envs: r.num_envs,
        };
        vtrace(
            &t,
            self.gamma,
            self.lambda,
            self.clip,
            &mut r.returns,
            &mut r.adv,
        );
        std::mem::swap(&mut r.values, &mut self.values);
        Ok(())
    }
}

/// Hands the step's [`Rollout`] (with advantages) to the policy's learn side — epochs,
/// minibatches and their schedule are the algorithm's — and logs the scalars it reports,
/// averaged over ranks.
pub(crate) struct OnPolicyLearner<'a, P> {
    policy: &'a RefCell<P>,
    rng: &'a RefCell<ChaCha8Rng>,
    ranks: Ranks,
    out: LearnOutput,
    logged: Vec<f32>,
}

impl<'a, P: Policy<Data = Rollout>> OnPolicyLearner<'a, P> {
    /// A learner for `policy`.
    pub(crate) fn new(policy: &'a RefCell<P>, rng: &'a RefCell<ChaCha8Rng>, ranks: Ranks) -> Self {
        Self {
            policy,
            rng,
            ranks,
            out: LearnOutput::default(),
            logged: Vec::new(),
        }
    }
}

impl<P: Policy<Data = Rollout>> Middleware<OnlineRLContext> for OnPolicyLearner<'_, P> {
    fn name(&self) -> String {
        "learner".into()
    }

    fn forward(&mut self, ctx: &mut OnlineRLContext, task: &TaskHandle) -> Result<(), TaskError> {
        if task.finished() {
            return Ok(());
        }
        let Some(r) = ctx.ext.get::<Rollout>() else {
            return Ok(());
        };
        if r.adv.len() != r.len() {
            return Err(TaskError::msg(
                "the rollout has no advantages: put GaeEstimator or VtraceEstimator before OnPolicyLearner",
            ));
        }
        let mut policy = self.policy.borrow_mut();
        self.out.clear();
        policy
            .learn(r, ctx.env_step, &mut self.rng.borrow_mut(), &mut self.out)
            .map_err(task_err)?;
        if !self.out.loss.is_finite() {
            return Err(task_err(TrainError::NonFinite {
                iter: policy.train_iter(),
                value: f64::from(self.out.loss),
            }));
        }
        ctx.train_iter = policy.train_iter();
        log_scalars(ctx, &self.ranks, &self.out, &mut self.logged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envs;
    use crate::ppo::Ppo;
    use burn::tensor::Device;
    use drill_config::Config;
    use drill_task::Task;
    use rand::SeedableRng;

    /// Pendulum truncates at 200 steps, so a 256-step rollout of 2 copies holds truncated
    /// episodes, steps that go on, and a last step that bootstraps. The collector's values
    /// (reused from its forward passes, plus the bootstrap passes) give the advantages that
    /// recomputing every value and next value in whole-rollout passes gives.
    #[test]
    fn reused_values_give_the_advantages_of_recomputed_ones() {
        let cfg = Config::parse(
            "seed = 3\n[env]\nid = \"Pendulum-v1\"\ncollector_env_num = 2\n[policy]\ntype = \"ppo\"\n",
            "t.toml",
            &[],
        )
        .unwrap();
        let drill_config::Policy::Ppo(p) = &cfg.policy else {
            unreachable!("a PPO config")
        };
        let ppo = RefCell::new(Ppo::from_config(&cfg, p, &Device::flex(), Ranks::alone()).unwrap());
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(1));
        let steps = 256;
        let mut task = Task::<OnlineRLContext>::new();
        let venv = envs::collector_envs(&cfg, cfg.seed, 0).unwrap();
        task.use_mw(RolloutCollector::new(
            venv,
            steps,
            &ppo,
            &rng,
            Ranks::alone(),
        ));
        task.use_mw(GaeEstimator::new(0.99, 0.95));
        task.step().unwrap();
        let r = task.ctx().ext.get::<Rollout>().unwrap();
        let (n, d) = (r.num_envs, r.obs_dim);
        let truncated = (0..r.len()).filter(|&k| r.ended[k] && !r.terminated[k]);
        assert_eq!(truncated.count(), 2, "one truncation per copy");

        // The same episodes again, with the rollout's actions, keeping every next observation
        // (the episode's last one where it ended).
        let mut twin = envs::collector_envs(&cfg, cfg.seed, 0).unwrap();
        let mut next_obs = ObsBuf::new(r.obs.dtype());
        let ActionBuf::Continuous { dim, values } = &r.actions else {
            unreachable!("Pendulum's actions are continuous")
        };
        for t in 0..steps {
            assert_eq!(
                twin.obs(),
                r.obs.as_obs().rows(t * n..(t + 1) * n, d),
                "the twin follows the rollout"
            );
            let a = ActionBuf::Continuous {
                dim: *dim,
                values: values[t * n * dim..(t + 1) * n * dim].to_vec(),
            };
            twin.step(a.as_actions()).unwrap();
            next_obs.extend(twin.final_obs());
        }
        let (mut values, mut next_values) = (Vec::new(), Vec::new());
        let mut policy = ppo.borrow_mut();
        let none = Hidden::default();
        policy.values(r.obs.as_obs(), &none, &mut values).unwrap();
        policy
            .values(next_obs.as_obs(), &none, &mut next_values)
            .unwrap();
        let mut adv = vec![0.0; r.len()];
        gae(
            &r.rewards,
            &values,
            &next_values,
            &r.terminated,
            &r.ended,
            n,
            0.99,
            0.95,
            &mut adv,
        );
        for (k, (got, want)) in r.adv.iter().zip(&adv).enumerate() {
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "row {k}: advantage {got} from reused values, {want} recomputed"
            );
        }
        for (k, (got, want)) in r.values.iter().zip(&values).enumerate() {
            assert!((got - want).abs() <= 1e-5, "row {k}: value {got} vs {want}");
        }
    }

    /// A collector acting with other weights than the learner's (a remote one, behind): the
    /// estimator takes the behaviour log-probabilities from the rollout and everything else
    /// from the learner's weights (the taken actions' log-probabilities, the values of the
    /// observations and of the bootstrap observations), as V-trace defines them.
    #[test]
    fn vtrace_corrects_with_the_behaviour_logp_and_the_learners_weights() {
        let cfg = Config::parse(
            "seed = 4\n[env]\nid = \"CartPole-v1\"\ncollector_env_num = 2\n[policy]\ntype = \"ppo\"\n",
            "t.toml",
            &[],
        )
        .unwrap();
        let drill_config::Policy::Ppo(p) = &cfg.policy else {
            unreachable!("a PPO config")
        };
        let policy =
            || RefCell::new(Ppo::from_config(&cfg, p, &Device::flex(), Ranks::alone()).unwrap());
        // The learner's weights: the collector's scaled up (a ReLU net's outputs grow with
        // them), so the action probabilities part from the near-uniform start.
        let (behaviour, learner) = (policy(), policy());
        let scaled: Vec<f32> = behaviour
            .borrow()
            .weights()
            .iter()
            .map(|w| w * 5.0)
            .collect();
        learner.borrow_mut().load_weights(&scaled);
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(1));
        let venv = envs::collector_envs(&cfg, cfg.seed, 0).unwrap();
        let mut task = Task::<OnlineRLContext>::new();
        task.use_mw(RolloutCollector::new(
            venv,
            64,
            &behaviour,
            &rng,
            Ranks::alone(),
        ));
        let clip = VtraceClip {
            rho: 1.0,
            c: 0.9,
            rho_pg: 1.2,
        };
        task.use_mw(VtraceEstimator::new(&learner, 0.99, 0.95, clip));
        task.step().unwrap();
        let got = task.ctx().ext.get::<Rollout>().unwrap();
        assert!(
            got.ended.iter().any(|&e| e),
            "episodes end inside the rollout"
        );

        let mut r = got.clone();
        let (mut logp, mut values, mut boot) = (Vec::new(), Vec::new(), Vec::new());
        let mut l = learner.borrow_mut();
        l.evaluate_actions(&r, &mut logp, &mut values).unwrap();
        l.values(r.bootstrap_obs.as_obs(), &Hidden::default(), &mut boot)
            .unwrap();
        let off = logp
            .iter()
            .zip(&r.logp)
            .filter(|(t, b)| (*t - *b).abs() > 1e-3);
        assert!(off.count() > r.len() / 2, "the two policies differ");
        r.fill_next_values(&values, &boot);
        let (mut vs, mut adv) = (vec![0.0; r.len()], vec![0.0; r.len()]);
        let t = Trajectory {
            rewards: &r.rewards,
            values: &values,
            next_values: &r.next_values,
            terminated: &r.terminated,
            episode_end: &r.ended,
            behaviour_logp: &r.logp,
            target_logp: &logp,
            num_envs: r.num_envs,
        };
        vtrace(&t, 0.99, 0.95, clip, &mut vs, &mut adv);
        assert_eq!(got.returns, vs, "V-trace targets");
        assert_eq!(got.adv, adv, "policy-gradient advantages");
        assert_eq!(
            got.values, values,
            "the learner's values replace the collector's"
        );
    }
}
