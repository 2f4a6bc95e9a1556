//! [`NStep`]: turns a stream of one-step transitions per environment into n-step transitions.

use drill_env::{Action, ActionBuf, ActionSpace, Obs, ObsBuf, ObsSpace};

/// One n-step transition, ready for the replay buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transition<'a> {
    /// Observation the action was taken in.
    pub obs: Obs<'a>,
    /// The action.
    pub action: Action<'a>,
    /// `sum_{k<m} gamma^k r_{t+k}`.
    pub reward: f32,
    /// Observation `m` steps later (the finished episode's last one if it ended).
    pub next_obs: Obs<'a>,
    /// The episode terminated within those `m` steps (no bootstrap).
    pub done: bool,
    /// `gamma^m`, the factor on the bootstrap value.
    pub discount: f32,
}

/// Per-environment queues of the last `n` one-step transitions.
///
/// Push each environment's step; complete n-step transitions come out once `n` steps are queued,
/// and all queued ones are flushed (with shorter horizons) when the episode ends.
pub(crate) struct NStep {
    n: usize,
    gamma: f32,
    obs_dim: usize,
    /// Per env: queued (obs, action, reward), oldest first.
    obs: Vec<ObsBuf>,
    actions: Vec<ActionBuf>,
    rewards: Vec<Vec<f32>>,
}

impl NStep {
    /// Queues for `num_envs` environments of these spaces.
    pub(crate) fn new(
        n: usize,
        gamma: f32,
        num_envs: usize,
        obs: &ObsSpace,
        actions: &ActionSpace,
    ) -> Self {
        Self {
            n,
            gamma,
            obs_dim: obs.dim(),
            obs: (0..num_envs).map(|_| ObsBuf::new(obs.dtype)).collect(),
            actions: (0..num_envs)
                .map(|_| ActionBuf::for_space(actions, 0))
                .collect(),
            rewards: (0..num_envs).map(|_| Vec::with_capacity(n)).collect(),
        }
    }

    /// Record env `i`'s step (`obs --action--> reward, next_obs`) and pass every completed
    /// n-step transition to `sink`. `terminated`/`truncated` end the episode.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &mut self,
        i: usize,
        obs: Obs<'_>,
        action: Action<'_>,
        reward: f32,
        next_obs: Obs<'_>,
        terminated: bool,
        truncated: bool,
        mut sink: impl FnMut(Transition<'_>),
    ) {
        let d = self.obs_dim;
        self.obs[i].extend(obs);
        self.actions[i].push(action);
        self.rewards[i].push(reward);
        let gamma = self.gamma;
        let emit = |q_obs: &ObsBuf,
                    q_act: &ActionBuf,
                    q_rew: &[f32],
                    start: usize,
                    done: bool,
                    sink: &mut dyn FnMut(Transition<'_>)| {
            let m = q_rew.len() - start;
            let mut ret = 0.0f32;
            let mut g = 1.0f32;
            for r in &q_rew[start..] {
                ret += g * r;
                g *= gamma;
            }
            sink(Transition {
                obs: q_obs.as_obs().rows(start..start + 1, d),
                action: q_act.get(start),
                reward: ret,
                next_obs,
                done,
                discount: gamma.powi(m as i32),
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
            self.obs[i].drain_front(d);
            self.actions[i].drain_front(1);
            self.rewards[i].remove(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(n: usize, steps: &[(f32, bool, bool)]) -> Vec<(f32, u32, f32, f32, bool, f32)> {
        let mut q = NStep::new(n, 0.5, 1, &ObsSpace::vector(1), &ActionSpace::Discrete(100));
        let mut out = vec![];
        for (t, &(r, term, trunc)) in steps.iter().enumerate() {
            let obs = [t as f32];
            let next = [t as f32 + 1.0];
            q.push(
                0,
                Obs::F32(&obs),
                Action::Discrete(t),
                r,
                Obs::F32(&next),
                term,
                trunc,
                |tr| {
                    let Action::Discrete(a) = tr.action else {
                        unreachable!()
                    };
                    out.push((
                        tr.obs.f32()[0],
                        a as u32,
                        tr.reward,
                        tr.next_obs.f32()[0],
                        tr.done,
                        tr.discount,
                    ))
                },
            );
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
