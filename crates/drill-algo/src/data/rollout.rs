//! [`Rollout`]: one on-policy rollout, time-major (`steps × num_envs` rows).

use drill_env::{ActionBuf, ObsBuf};

/// One rollout with its values, filled by the `RolloutCollector` and completed by the
/// `GaeEstimator` (advantages, returns); what an on-policy [`Policy`](crate::policy::Policy) learns
/// from.
#[derive(Debug, Clone, Default)]
pub struct Rollout {
    /// Elements per observation.
    pub obs_dim: usize,
    /// Env copies (columns).
    pub num_envs: usize,
    /// `[rows, obs_dim]`.
    pub obs: ObsBuf,
    /// `[rows]` the sampled actions (continuous ones before clipping).
    pub actions: ActionBuf,
    /// Log-probabilities under the behaviour policy.
    pub logp: Vec<f32>,
    /// Rewards (scaled when reward normalisation is on).
    pub rewards: Vec<f32>,
    /// The episode terminated (no bootstrap).
    pub terminated: Vec<bool>,
    /// The episode ended (terminated or truncated).
    pub ended: Vec<bool>,
    /// Values under the behaviour critic.
    pub values: Vec<f32>,
    /// Values of the next observations (the episode's last when it was truncated; unused
    /// where it terminated).
    pub next_values: Vec<f32>,
    /// GAE advantages.
    pub adv: Vec<f32>,
    /// Value targets `adv + values`.
    pub returns: Vec<f32>,
}

impl Rollout {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.logp.len()
    }

    /// None held.
    pub fn is_empty(&self) -> bool {
        self.logp.is_empty()
    }
}
