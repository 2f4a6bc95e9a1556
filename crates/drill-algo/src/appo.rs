//! APPO: asynchronous PPO (Sample Factory's; IMPALA's V-trace, Espeholt et al. 2018). PPO's
//! network, acting and clipped update ([`Ppo`]), learning from rollouts that collectors may
//! have gathered with older weights: each rollout carries the behaviour policy's
//! log-probabilities, and before the update the learner corrects for the lag with V-trace
//! (value targets and policy-gradient advantages from importance weights clipped at
//! `rho_clip_ratio`, `c_clip_ratio` and `rho_pg_clip_ratio`, DI-engine IMPALA's keys).
//!
//! Read top to bottom: [`Appo`] (the policy: PPO's, under its own name in checkpoints), then
//! [`train_roles`]: the pipeline `evaluate? → roll out n_sample steps → V-trace → learn →
//! log`, whole in one process or split over worker processes (`--parallel-workers`,
//! `[task.roles]`): collectors on other processes or hosts send their rollouts, which queue
//! at the learner in arrival order, and act with the newest weights the learner sent them
//! (at most `task.model_staleness` rollouts behind). In one process every rollout is
//! on-policy and the update is PPO's with V-trace's targets: GAE(lambda)'s returns, and for
//! `gae_lambda = 1` its advantages too.

use std::cell::RefCell;

use drill_config::{Config, PpoPolicy};
use drill_env::{ActionBuf, Obs};
use drill_task::{Task, TaskHandle};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::Checkpoint;
use crate::context;
use crate::context::{RunContext, TrainResult};
use crate::data::{Rollout, VtraceClip};
use crate::ddp;
use crate::envs;
use crate::error::TrainError;
use crate::middleware::{
    CkptSaver, InteractionEvaluator, OnPolicyLearner, OnlineLogger, Outputs, Roles,
    RolloutCollector, TerminationChecker, TrainClock, VtraceEstimator, in_one_process,
    learner_sender, run_result, use_exchangers,
};
use crate::policy::{Acted, Explore, Hidden, LearnOutput, Policy};
use crate::ppo::Ppo;
use crate::resume;

/// APPO's policy: PPO's actor-critic and update; its rollouts arrive with V-trace's targets
/// (the `VtraceEstimator` before the learner).
pub struct Appo(pub Ppo);

impl Policy for Appo {
    type Data = Rollout;
    const NAME: &'static str = "appo";

    fn eval(&mut self, obs: Obs<'_>, hidden: &mut Hidden, out: &mut ActionBuf) {
        self.0.eval(obs, hidden, out);
    }

    fn collect(
        &mut self,
        obs: Obs<'_>,
        hidden: &mut Hidden,
        e: &Explore,
        rng: &mut ChaCha8Rng,
        out: &mut Acted,
    ) {
        self.0.collect(obs, hidden, e, rng, out);
    }

    fn values(
        &mut self,
        obs: Obs<'_>,
        hidden: &Hidden,
        out: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        self.0.values(obs, hidden, out)
    }

    fn evaluate_actions(
        &mut self,
        r: &Rollout,
        logp: &mut Vec<f32>,
        values: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        self.0.evaluate_actions(r, logp, values)
    }

    /// PPO's epochs of clipped minibatch updates; the ratio is to the behaviour policy that
    /// collected the rollout, the advantages and value targets V-trace's.
    fn learn(
        &mut self,
        r: &Rollout,
        env_step: u64,
        rng: &mut ChaCha8Rng,
        out: &mut LearnOutput,
    ) -> Result<(), TrainError> {
        self.0.learn(r, env_step, rng, out)
    }

    fn train_iter(&self) -> u64 {
        self.0.train_iter()
    }

    fn state_dict(&self) -> Checkpoint {
        self.0.state_dict()
    }

    fn load_state_dict(&mut self, ck: &Checkpoint) -> Result<(), TrainError> {
        self.0.load_state_dict(ck)
    }

    fn weights(&self) -> Vec<f32> {
        self.0.weights()
    }

    fn load_weights(&mut self, weights: &[f32]) {
        self.0.load_weights(weights);
    }
}

/// V-trace's clips as `[policy.learn]` gives them.
fn clips(p: &PpoPolicy) -> VtraceClip {
    let [rho, c, rho_pg] = p.learn.vtrace_clips().map(|(_, v)| v as f32);
    VtraceClip { rho, c, rho_pg }
}

/// Train APPO in one process; stops at `env.stop_value`, `max_env_step` or `max_train_iter`.
pub fn train(
    cfg: &Config,
    p: &PpoPolicy,
    run: &mut RunContext<'_>,
) -> Result<TrainResult, TrainError> {
    in_one_process(|handle, roles| train_roles(cfg, p, run, handle, roles))
}

/// Train APPO as the pipeline of built-in middlewares, running the parts `roles` names on
/// `handle`'s task (all of them in one process; a share under the Parallel runner, with the
/// exchangers that reach the others). Returns the result where the learner runs.
pub fn train_roles(
    cfg: &Config,
    p: &PpoPolicy,
    run: &mut RunContext<'_>,
    handle: TaskHandle,
    roles: &Roles,
) -> Result<Option<TrainResult>, TrainError> {
    // PLUMBING: seeding, environments, networks. A collector worker is seeded as a DDP rank
    // would be; several learner workers (`policy.multi_gpu`) form one data-parallel group,
    // which starts from the lead's checkpoint.
    let clock = TrainClock::start(run.resume.as_ref().filter(|_| roles.learner));
    if let Some(remote) = roles.remote.as_ref().filter(|r| r.learners.len() > 1)
        && let Some(k) = remote.learner_rank()
    {
        let place = (k, remote.learners.len());
        run.dist = Some(ddp::learner_group(cfg, place, remote.timeout)?);
    }
    let ranks = ddp::setup(cfg, run);
    let streams = resume::stream_seed(cfg, run.resume.as_ref(), run.restarts);
    let (rank, world) = (ranks.rank(), ranks.world());
    let (slot, slots) = roles.slot(rank, world);
    let mut appo = Appo(Ppo::from_spec(
        cfg,
        p,
        &run.spec,
        &run.device,
        ranks.clone(),
    )?);
    let resume = resume::shared(run.resume.as_ref().filter(|_| roles.learner), &ranks)?;
    let env_step = resume::restore(&mut appo, resume.as_ref())?;
    if let Some(pg) = ranks.group() {
        appo.0.distribute(pg.clone(), ddp::options(cfg))?;
    }
    let appo = RefCell::new(appo);
    // A learner's generator (its minibatches) is its rank's in the learners' group.
    let stream = if roles.learner { rank } else { slot };
    let rng = RefCell::new(resume::rank_rng(streams, resume.as_ref(), stream));
    let eval_freq = p.eval.evaluator.eval_freq;
    let out = Outputs::new(&mut *run.reporter);
    let iters = appo.borrow().train_iter();
    let mut task = context::task(cfg, Task::with_handle(handle.clone()), env_step, iters);

    // ALGO: the pipeline. Each role's middlewares run only where the role does; exchangers
    // carry rollouts to the learner and weights back.
    if let Some(remote) = &roles.remote {
        use_exchangers::<Rollout, _>(&mut task, &handle, (roles, &ranks), remote, &appo)?;
    }
    if roles.evaluator {
        // Evaluate deterministically every eval_freq train iterations (and before training).
        let evaluator = envs::evaluator(cfg, world.max(slots), rank, world)?;
        let stop = cfg.env.stop_value;
        let mut evaluator =
            InteractionEvaluator::new(evaluator, eval_freq, stop, ranks.clone(), &appo);
        if roles.learner_elsewhere() {
            evaluator = evaluator.remote();
        }
        task.use_mw(evaluator);
    }
    if roles.learner {
        let mut saver = CkptSaver::new(&out, &appo, ranks.clone(), &rng, clock);
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
        // Roll out n_sample / env_num steps in every env with the stochastic policy (the
        // newest weights this collector has), keeping their log-probabilities.
        let venv = envs::collector_envs(cfg, streams, slot)?;
        let steps = (ddp::split(cfg, &ranks, p.collect.n_sample) / venv.num_envs()).max(1);
        let mut collector = RolloutCollector::new(venv, steps, &appo, &rng, ranks.clone());
        if p.learn.reward_norm {
            collector = collector.reward_norm(p.collect.discount_factor);
        }
        task.use_mw(collector);
    }
    if roles.learner {
        // V-trace targets and advantages with the learner's weights, then PPO's epochs of
        // shuffled minibatches.
        task.use_mw(VtraceEstimator::new(
            &appo,
            p.collect.discount_factor as f32,
            p.collect.gae_lambda as f32,
            clips(p),
        ));
        task.use_mw(OnPolicyLearner::new(&appo, &rng, ranks.clone()));
        if let Some(remote) = &roles.remote {
            let at = (eval_freq, iters);
            task.use_mw(learner_sender(&handle, roles, remote, at, &appo));
        }
        task.use_mw(OnlineLogger::new(&out, cfg.max_env_step, env_step));
    }
    handle.barrier()?;
    let ctx = task.run(None)?;
    Ok(roles
        .lead_learner()
        .then(|| run_result(&ctx, env_step, &clock, world, run.restarts)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ddp::Ranks;
    use crate::middleware::GaeEstimator;
    use burn::tensor::Device;
    use drill_task::{Context, OnlineRLContext};
    use rand::SeedableRng;

    fn config(lambda: f64) -> Config {
        let text = format!(
            "seed = 5\n[env]\nid = \"CartPole-v1\"\ncollector_env_num = 4\n[policy]\ntype = \"ppo\"\n\
             [policy.collect]\nn_sample = 128\ngae_lambda = {lambda}\n\
             [policy.learn]\nepoch_per_collect = 2\nbatch_size = 32\n"
        );
        Config::parse(&text, "t.toml", &[]).unwrap()
    }

    /// `steps` collect-and-learn steps of one process's on-policy pipeline from the network
    /// and optimizer state `start`, with V-trace (APPO) or GAE (PPO) before the update; the
    /// weights after.
    fn weights_after(cfg: &Config, start: &Checkpoint, steps: usize, vtrace: bool) -> Vec<f32> {
        let drill_config::Policy::Ppo(p) = &cfg.policy else {
            unreachable!("a PPO config")
        };
        let mut ppo = Ppo::from_config(cfg, p, &Device::flex(), Ranks::alone()).unwrap();
        ppo.load_state_dict(start).unwrap();
        let appo = RefCell::new(Appo(ppo));
        let rng = RefCell::new(ChaCha8Rng::seed_from_u64(7));
        let mut task = Task::<OnlineRLContext>::new();
        let venv = envs::collector_envs(cfg, cfg.seed, 0).unwrap();
        let rows = p.collect.n_sample / cfg.env.collector_env_num;
        task.use_mw(RolloutCollector::new(
            venv,
            rows,
            &appo,
            &rng,
            Ranks::alone(),
        ));
        let (gamma, lambda) = (0.99, p.collect.gae_lambda as f32);
        if vtrace {
            task.use_mw(VtraceEstimator::new(&appo, gamma, lambda, clips(p)));
        } else {
            task.use_mw(GaeEstimator::new(gamma, lambda));
        }
        task.use_mw(OnPolicyLearner::new(&appo, &rng, Ranks::alone()));
        for _ in 0..steps {
            task.step().unwrap();
            task.ctx_mut().renew();
        }
        appo.borrow().weights()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// One collector acting with the learner's newest weights (zero staleness): the behaviour
    /// policy is the target policy, V-trace's advantages are GAE's for lambda 1, and APPO's
    /// updates are PPO's. For lambda < 1 the value targets still agree but the advantages
    /// differ (IMPALA's r + γ v_{t+1} − V), so the weights part.
    #[test]
    fn with_zero_staleness_and_one_collector_appo_is_ppo() {
        let on = config(1.0);
        let drill_config::Policy::Ppo(p) = &on.policy else {
            unreachable!("a PPO config")
        };
        // One start for every run (the device's generator is shared by the tests that run
        // beside this one).
        let ck = Ppo::from_config(&on, p, &Device::flex(), Ranks::alone())
            .unwrap()
            .state_dict();
        let run = |cfg: &Config, steps, vtrace| weights_after(cfg, &ck, steps, vtrace);
        let (ppo, appo) = (run(&on, 3, false), run(&on, 3, true));
        let moved = max_diff(&ppo, &run(&on, 0, false));
        assert!(moved > 1e-3, "the updates moved the weights ({moved})");
        let same = max_diff(&ppo, &appo);
        let lambda = config(0.8);
        let apart = max_diff(&run(&lambda, 3, false), &run(&lambda, 3, true));
        assert!(
            same < 1e-6,
            "APPO's weights are PPO's: max difference {same}"
        );
        assert!(
            apart > 1e-4,
            "with lambda 0.8 the advantages differ ({apart})"
        );
    }
}
