//! [`NStep`]: turns a stream of one-step transitions per environment into n-step transitions.

/// One n-step transition, ready for the replay buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition<'a> {
    /// Observation the action was taken in.
    pub obs: &'a [f32],
    /// Discrete action.
    pub action: u32,
    /// `sum_{k<m} gamma^k r_{t+k}`.
    pub reward: f32,
    /// Observation `m` steps later (the finished episode's last one if it ended).
    pub next_obs: &'a [f32],
    /// The episode terminated within those `m` steps (no bootstrap).
    pub done: bool,
    /// `gamma^m`, the factor on the bootstrap value.
    pub discount: f32,
}

/// Per-environment queues of the last `n` one-step transitions.
///
/// Push each environment's step; complete n-step transitions come out once `n` steps are queued,
/// and all queued ones are flushed (with shorter horizons) when the episode ends.
pub struct NStep {
    n: usize,
    gamma: f32,
    obs_dim: usize,
    /// Per env: ring of (obs, action, reward), oldest first.
    obs: Vec<Vec<f32>>,
    actions: Vec<Vec<u32>>,
    rewards: Vec<Vec<f32>>,
}

impl NStep {
    /// Queues for `num_envs` environments.
    pub fn new(n: usize, gamma: f32, num_envs: usize, obs_dim: usize) -> Self {
        Self {
            n,
            gamma,
            obs_dim,
            obs: (0..num_envs)
                .map(|_| Vec::with_capacity(n * obs_dim))
                .collect(),
            actions: (0..num_envs).map(|_| Vec::with_capacity(n)).collect(),
            rewards: (0..num_envs).map(|_| Vec::with_capacity(n)).collect(),
        }
    }

    /// Record env `i`'s step (`obs --action--> reward, next_obs`) and pass every completed
    /// n-step transition to `sink`. `terminated`/`truncated` end the episode.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        i: usize,
        obs: &[f32],
        action: u32,
        reward: f32,
        next_obs: &[f32],
        terminated: bool,
        truncated: bool,
        mut sink: impl FnMut(Transition<'_>),
    ) {
        let d = self.obs_dim;
        self.obs[i].extend_from_slice(obs);
        self.actions[i].push(action);
        self.rewards[i].push(reward);
        let emit = |q_obs: &[f32],
                    q_act: &[u32],
                    q_rew: &[f32],
                    start: usize,
                    done: bool,
                    sink: &mut dyn FnMut(Transition<'_>)| {
            let m = q_rew.len() - start;
            let mut ret = 0.0f32;
            let mut g = 1.0f32;
            for r in &q_rew[start..] {
                ret += g * r;
                g *= self.gamma;
            }
            sink(Transition {
                obs: &q_obs[start * d..(start + 1) * d],
                action: q_act[start],
                reward: ret,
                next_obs,
                done,
                discount: self.gamma.powi(m as i32),
            });
        };
        if terminated || truncated {
            for start in 0..self.rewards[i].len() {
                emit(
                    &self.obs[i],
                    &self.actions[i],
                    &self.rewards[i],
                    start,
                    terminated,
                    &mut sink,
                );
            }
            self.obs[i].clear();
            self.actions[i].clear();
            self.rewards[i].clear();
        } else if self.rewards[i].len() == self.n {
            emit(
                &self.obs[i],
                &self.actions[i],
                &self.rewards[i],
                0,
                false,
                &mut sink,
            );
            self.obs[i].drain(..d);
            self.actions[i].remove(0);
            self.rewards[i].remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(n: usize, steps: &[(f32, bool, bool)]) -> Vec<(f32, u32, f32, f32, bool, f32)> {
        let mut q = NStep::new(n, 0.5, 1, 1);
        let mut out = vec![];
        for (t, &(r, term, trunc)) in steps.iter().enumerate() {
            let obs = [t as f32];
            let next = [t as f32 + 1.0];
            q.push(0, &obs, t as u32, r, &next, term, trunc, |tr| {
                out.push((
                    tr.obs[0],
                    tr.action,
                    tr.reward,
                    tr.next_obs[0],
                    tr.done,
                    tr.discount,
                ))
            });
        }
        out
    }

    #[test]
    fn three_step_returns_by_hand() {
        // gamma 0.5, rewards 1, 2, 4, 8 then termination at t=3.
        let out = collect(
            3,
            &[
                (1.0, false, false),
                (2.0, false, false),
                (4.0, false, false),
                (8.0, true, false),
            ],
        );
        assert_eq!(
            out,
            vec![
                (0.0, 0, 1.0 + 0.5 * 2.0 + 0.25 * 4.0, 3.0, false, 0.125), // t=0 complete: 3.0
                (1.0, 1, 2.0 + 0.5 * 4.0 + 0.25 * 8.0, 4.0, true, 0.125),  // flushed at the end
                (2.0, 2, 4.0 + 0.5 * 8.0, 4.0, true, 0.25),
                (3.0, 3, 8.0, 4.0, true, 0.5),
            ]
        );
    }

    #[test]
    fn truncation_bootstraps_and_one_step_is_plain() {
        let out = collect(2, &[(1.0, false, false), (1.0, false, true)]);
        assert_eq!(
            out,
            vec![
                (0.0, 0, 1.5, 2.0, false, 0.25),
                (1.0, 1, 1.0, 2.0, false, 0.5)
            ]
        );
        let out = collect(1, &[(3.0, false, false), (5.0, true, false)]);
        assert_eq!(
            out,
            vec![
                (0.0, 0, 3.0, 1.0, false, 0.5),
                (1.0, 1, 5.0, 2.0, true, 0.5)
            ]
        );
    }
}
