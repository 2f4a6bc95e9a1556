//! [`Policy`]: an algorithm as the pipeline sees it — DI-engine's `Policy` with its collect,
//! eval and learn sides in one trait. Every built-in middleware takes a policy (shared as
//! `&RefCell<P>` by the middlewares of one process) and calls only its own side:
//!
//! | side | methods | called by |
//! |---|---|---|
//! | eval | [`Policy::eval`] | `InteractionEvaluator` |
//! | collect | [`Policy::collect`] (+ [`Policy::values`] on-policy) | `StepCollector`, `RolloutCollector` |
//! | learn | [`Policy::learn`], [`Policy::train_iter`] (+ [`Policy::evaluate_actions`] for V-trace) | `OffPolicyLearner`, `OnPolicyLearner`, `VtraceEstimator` |
//! | state | [`Policy::state_dict`], [`Policy::load_state_dict`], [`Policy::weights`], [`Policy::load_weights`] | `CkptSaver`, `ModelExchanger`, resume |
//!
//! Observations arrive as [`Obs`] (`f32` vectors or `u8` frames) and actions leave as an
//! [`ActionBuf`] of the env's space, so one data path serves every algorithm: DQN (discrete,
//! replay), PPO (any space, rollouts) and SAC (continuous, replay).

use drill_env::{ActionBuf, Obs};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::Checkpoint;
pub use crate::data::Hidden;
use crate::data::Rollout;
use crate::error::TrainError;

/// What the collect side is told about exploration this step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Explore {
    /// Epsilon-greedy rate set by `EpsGreedyHandler` (0: none).
    pub epsilon: f64,
    /// Env steps collected so far (every rank's), for warm-up phases.
    pub env_step: u64,
}

/// What the collect side writes for a batch of observations.
#[derive(Debug, Clone, Default)]
pub struct Acted {
    /// One action per observation, as the environment takes it and the learner stores it
    /// (continuous actions may leave the box: the vector env clips them).
    pub actions: ActionBuf,
    /// Log-probability of each action under the behaviour policy (on-policy algorithms;
    /// left empty by the others).
    pub logp: Vec<f32>,
    /// The critic's value of each observation, from the same forward pass as the actions
    /// (on-policy algorithms with a value critic; left empty by the others, and the rollout
    /// collector then asks [`Policy::values`]).
    pub values: Vec<f32>,
}

/// What one call of the learn side reports.
#[derive(Debug, Clone, Default)]
pub struct LearnOutput {
    /// Loss of the last gradient step (the learner stops the run when it is not finite).
    pub loss: f32,
    /// Scalars to log (`losses/...`), averaged across DDP ranks before logging.
    pub scalars: Vec<(&'static str, f32)>,
    /// New priorities of the sampled transitions (prioritized replay; empty otherwise).
    pub priorities: Vec<f32>,
}

impl LearnOutput {
    /// Start a new report, keeping the allocations.
    pub fn clear(&mut self) {
        self.loss = 0.0;
        self.scalars.clear();
        self.priorities.clear();
    }
}

/// An RL algorithm's acting, learning and state, as the middlewares use it.
pub trait Policy {
    /// What the learn side trains on: a replay [`Batch`](crate::data::Batch) (off-policy) or
    /// a whole [`Rollout`] (on-policy).
    type Data;
    /// Its name in checkpoints and messages (`dqn`, `ppo`, `sac`).
    const NAME: &'static str;

    /// Eval side: deterministic actions for a batch of observations into `out`, from and to
    /// the recurrent state `hidden` (one row per observation; untouched by feed-forward
    /// policies).
    fn eval(&mut self, obs: Obs<'_>, hidden: &mut Hidden, out: &mut ActionBuf);

    /// Collect side: exploring actions (and their log-probabilities, on-policy) for a batch
    /// of observations into `out`, from and to the recurrent state `hidden`.
    fn collect(
        &mut self,
        obs: Obs<'_>,
        hidden: &mut Hidden,
        explore: &Explore,
        rng: &mut ChaCha8Rng,
        out: &mut Acted,
    );

    /// Collect side, on-policy: the critic's state values of a batch of observations (GAE's
    /// bootstrap values: the rollout's last observations and truncated episodes' final ones),
    /// each seen from its row of the recurrent state `hidden` (empty: zeros, or a
    /// feed-forward policy). Policies without a state-value critic keep the default, which
    /// says so.
    fn values(
        &mut self,
        obs: Obs<'_>,
        hidden: &Hidden,
        out: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let _ = (obs, hidden, out);
        Err(TrainError::Unsupported {
            policy: Self::NAME,
            what: "state values (GAE needs a policy with a value critic)",
        })
    }

    /// Learn side, off-policy correction (APPO's V-trace): the log-probabilities of the
    /// rollout's taken actions and the values of its observations under the current weights,
    /// in one forward pass (a recurrent policy's over each env copy's sequence from the
    /// rollout's initial state). Policies without a value critic keep the default, which
    /// says so.
    fn evaluate_actions(
        &mut self,
        rollout: &Rollout,
        logp: &mut Vec<f32>,
        values: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let _ = (rollout, logp, values);
        Err(TrainError::Unsupported {
            policy: Self::NAME,
            what: "action log-probabilities and state values (V-trace needs an actor-critic)",
        })
    }

    /// Learn side: train on `data` (one gradient step on a replay batch, or the epochs of an
    /// on-policy update on a rollout); `env_step` is the global count (schedules), `rng`
    /// this rank's generator.
    fn learn(
        &mut self,
        data: &Self::Data,
        env_step: u64,
        rng: &mut ChaCha8Rng,
        out: &mut LearnOutput,
    ) -> Result<(), TrainError>;

    /// Gradient steps taken so far.
    fn train_iter(&self) -> u64;

    /// Everything a resume needs: networks, optimizer state, the iteration counter.
    fn state_dict(&self) -> Checkpoint;

    /// Restore what [`Self::state_dict`] wrote.
    fn load_state_dict(&mut self, ck: &Checkpoint) -> Result<(), TrainError>;

    /// The learner's acting weights, flat in visit order (what a remote collector or
    /// evaluator loads).
    fn weights(&self) -> Vec<f32>;

    /// Act with `weights` (from [`Self::weights`] in another process) from now on.
    fn load_weights(&mut self, weights: &[f32]);
}
