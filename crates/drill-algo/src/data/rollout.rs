//! [`Rollout`]: one on-policy rollout, time-major (`steps × num_envs` rows).

use drill_env::{ActionBuf, ObsBuf};
use serde::{Deserialize, Serialize};

use super::Hidden;

/// One rollout with its values, filled by the `RolloutCollector` and completed by the
/// `GaeEstimator` or the `VtraceEstimator` (advantages, returns); what an on-policy
/// [`Policy`](crate::policy::Policy) learns from, and what a remote collector sends its learner.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// Values under the behaviour critic (the learner's after V-trace).
    pub values: Vec<f32>,
    /// Values of the next observations (the episode's last when it was truncated; unused
    /// where it terminated).
    pub next_values: Vec<f32>,
    /// The next observations that are not a later row's: the one after the last step where
    /// the episode goes on, and a truncated episode's final one; row `bootstrap_rows[j]`
    /// bootstraps from the `j`-th (a terminated one has none).
    pub bootstrap_obs: ObsBuf,
    /// The row each of `bootstrap_obs` follows.
    pub bootstrap_rows: Vec<usize>,
    /// A recurrent policy's state before the first row, one row per env copy (empty:
    /// zeros, or a feed-forward policy); training replays each copy's sequence from it.
    pub hidden0: Hidden,
    /// The recurrent state each of `bootstrap_obs` is seen from (as `hidden0`).
    pub bootstrap_hidden: Hidden,
    /// Advantages (GAE's, or V-trace's policy-gradient ones).
    pub adv: Vec<f32>,
    /// Value targets (GAE's `adv + values`, or V-trace's `vs`).
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

    /// `next_values` from `values` (of every row) and `bootstrap` (of `bootstrap_obs`): the
    /// next row's value while the episode goes on, else the bootstrap's, and 0 after a
    /// termination.
    pub fn fill_next_values(&mut self, values: &[f32], bootstrap: &[f32]) {
        let (rows, n) = (self.len(), self.num_envs);
        self.next_values.clear();
        self.next_values.resize(rows, 0.0);
        for k in 0..rows.saturating_sub(n) {
            if !self.ended[k] {
                self.next_values[k] = values[k + n];
            }
        }
        for (&k, v) in self.bootstrap_rows.iter().zip(bootstrap) {
            self.next_values[k] = *v;
        }
    }
}
