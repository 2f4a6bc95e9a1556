//! V-trace targets and advantages (Espeholt et al. 2018, IMPALA) over a time-major rollout
//! collected by a behaviour policy μ and learned on by a target policy π: importance weights
//! clipped at ρ̄ for the TD errors (and the policy gradient's advantage) and λ·min(c̄, π/μ)
//! for the traces. On-policy (π = μ) with ρ̄, c̄ ≥ 1 the targets are GAE(λ)'s returns.

/// The clipping of V-trace (DI-engine's IMPALA names: `rho_clip_ratio`, `c_clip_ratio`,
/// `rho_pg_clip_ratio`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VtraceClip {
    /// ρ̄: clips the importance weight of each TD error.
    pub rho: f32,
    /// c̄: clips the importance weight of each trace.
    pub c: f32,
    /// Clips the importance weight of the policy gradient's advantage.
    pub rho_pg: f32,
}

impl Default for VtraceClip {
    fn default() -> Self {
        VtraceClip {
            rho: 1.0,
            c: 1.0,
            rho_pg: 1.0,
        }
    }
}

/// One rollout of `T` steps × `num_envs` envs, time-major (`t * num_envs + i`), as
/// GAE reads it, with the log-probabilities of the actions taken under the
/// behaviour policy (`behaviour_logp`, what the collector sampled with) and the target policy
/// (`target_logp`, the learner's current weights); `values` and `next_values` are the
/// learner's V of each observation and of the transition's next one.
pub struct Trajectory<'a> {
    /// Rewards.
    pub rewards: &'a [f32],
    /// V(x_t).
    pub values: &'a [f32],
    /// V of the next observation (the finished episode's last one when it ended).
    pub next_values: &'a [f32],
    /// The step terminated its episode (no bootstrap).
    pub terminated: &'a [bool],
    /// The step ended its episode (terminated or truncated: nothing flows back across it).
    pub episode_end: &'a [bool],
    /// log μ(a_t | x_t).
    pub behaviour_logp: &'a [f32],
    /// log π(a_t | x_t).
    pub target_logp: &'a [f32],
    /// Envs side by side.
    pub num_envs: usize,
}

/// V-trace targets `vs` (the value function's regression targets) and the policy gradient's
/// advantages `pg_adv` = ρ_pg,t (r_t + γ v_{t+1} − V(x_t)), for discount `gamma` and trace
/// factor `lambda`. A terminated step does not bootstrap; no episode end lets a trace or
/// v_{t+1} cross it (a truncated step bootstraps with V of its last observation).
pub fn vtrace(
    t: &Trajectory<'_>,
    gamma: f32,
    lambda: f32,
    clip: VtraceClip,
    vs: &mut [f32],
    pg_adv: &mut [f32],
) {
    let n = t.rewards.len();
    let same = [
        t.values.len(),
        t.next_values.len(),
        t.terminated.len(),
        t.episode_end.len(),
        t.behaviour_logp.len(),
        t.target_logp.len(),
        vs.len(),
        pg_adv.len(),
    ];
    assert!(
        n.is_multiple_of(t.num_envs) && same.iter().all(|&m| m == n),
        "every array of a trajectory holds T x num_envs values"
    );
    let steps = n / t.num_envs;
    for i in 0..t.num_envs {
        // v_{t+1} − V(x_{t+1}) along the trace.
        let mut acc = 0.0f32;
        for s in (0..steps).rev() {
            let k = s * t.num_envs + i;
            let ratio = (t.target_logp[k] - t.behaviour_logp[k]).exp();
            let not_term = if t.terminated[k] { 0.0 } else { 1.0 };
            let carry = if t.episode_end[k] || s + 1 == steps {
                0.0
            } else {
                1.0
            };
            let bootstrap = gamma * not_term * t.next_values[k];
            let delta = ratio.min(clip.rho) * (t.rewards[k] + bootstrap - t.values[k]);
            acc = delta + gamma * lambda * ratio.min(clip.c) * carry * acc;
            vs[k] = t.values[k] + acc;
        }
        for s in 0..steps {
            let k = s * t.num_envs + i;
            let ratio = (t.target_logp[k] - t.behaviour_logp[k]).exp();
            // v_{t+1}: the next step's target inside the episode and the rollout, else V.
            let next = if t.episode_end[k] || s + 1 == steps {
                t.next_values[k]
            } else {
                vs[k + t.num_envs]
            };
            let not_term = if t.terminated[k] { 0.0 } else { 1.0 };
            pg_adv[k] =
                ratio.min(clip.rho_pg) * (t.rewards[k] + gamma * not_term * next - t.values[k]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn hand_computed_off_policy_targets_and_advantages() {
        // One env, 3 steps, gamma 0.9, lambda 1, rho-bar 1, c-bar 1, no episode end.
        // r = [1, 0, 2], V = [0.5, 1.0, 1.5], V(next) = [1.0, 1.5, 0.8];
        // pi/mu = [2.0, 0.5, 1.0] -> rho = c = [1, 0.5, 1].
        let half = 0.5f32.ln();
        let tr = Trajectory {
            rewards: &[1.0, 0.0, 2.0],
            values: &[0.5, 1.0, 1.5],
            next_values: &[1.0, 1.5, 0.8],
            terminated: &[false; 3],
            episode_end: &[false; 3],
            behaviour_logp: &[-1.0, -1.0, -1.0],
            target_logp: &[-1.0 - half, -1.0 + half, -1.0],
            num_envs: 1,
        };
        let (mut vs, mut adv) = ([0.0; 3], [0.0; 3]);
        vtrace(&tr, 0.9, 1.0, VtraceClip::default(), &mut vs, &mut adv);
        // delta_2 = 1 * (2 + 0.9*0.8 - 1.5) = 1.22;        v_2 = 1.5 + 1.22 = 2.72
        // delta_1 = 0.5 * (0 + 0.9*1.5 - 1.0) = 0.175;     v_1 - V_1 = 0.175 + 0.9*0.5*1.22
        //                                                   = 0.724; v_1 = 1.724
        // delta_0 = 1 * (1 + 0.9*1.0 - 0.5) = 1.4;         v_0 - V_0 = 1.4 + 0.9*1*0.724
        //                                                   = 2.0516; v_0 = 2.5516
        close(&vs, &[2.5516, 1.724, 2.72]);
        // pg_adv_0 = 1 * (1 + 0.9*1.724 - 0.5) = 2.0516
        // pg_adv_1 = 0.5 * (0 + 0.9*2.72 - 1.0) = 0.724
        // pg_adv_2 = 1 * (2 + 0.9*0.8 - 1.5) = 1.22 (the rollout's last step bootstraps V)
        close(&adv, &[2.0516, 0.724, 1.22]);
    }

    #[test]
    fn on_policy_targets_are_gae_returns_and_episode_ends_stop_the_traces() {
        // Two envs, 4 steps; env 0 terminates at t=1, env 1 is truncated at t=2.
        let rewards = [1.0, 0.5, -1.0, 2.0, 0.3, 1.0, 2.0, -0.5];
        let values = [0.2, 0.1, 0.4, 0.9, -0.3, 0.6, 1.1, 0.0];
        let next_values = [0.4, 0.9, 7.0, 0.6, 1.1, 5.0, 0.5, 0.7];
        let terminated = [false, false, true, false, false, false, false, false];
        let episode_end = [false, false, true, false, false, true, false, false];
        let logp = [-0.7, -1.2, -0.3, -2.0, -0.9, -0.1, -1.5, -0.4];
        for lambda in [1.0, 0.95, 0.5] {
            let mut adv = [0.0; 8];
            super::super::gae(
                &rewards,
                &values,
                &next_values,
                &terminated,
                &episode_end,
                2,
                0.99,
                lambda,
                &mut adv,
            );
            let returns: Vec<f32> = adv.iter().zip(&values).map(|(a, v)| a + v).collect();
            let tr = Trajectory {
                rewards: &rewards,
                values: &values,
                next_values: &next_values,
                terminated: &terminated,
                episode_end: &episode_end,
                behaviour_logp: &logp,
                target_logp: &logp,
                num_envs: 2,
            };
            let (mut vs, mut pg) = ([0.0; 8], [0.0; 8]);
            vtrace(&tr, 0.99, lambda, VtraceClip::default(), &mut vs, &mut pg);
            close(&vs, &returns);
            // With lambda 1 the policy gradient's advantage is GAE's too.
            if lambda == 1.0 {
                close(&pg, &adv);
            }
        }
    }

    #[test]
    fn the_clips_bound_each_weight() {
        // pi/mu = 4 on every step: rho-bar 2 scales the TD error, c-bar 0.5 the trace,
        // rho_pg-bar 3 the advantage.
        let lr = 4.0f32.ln();
        let tr = Trajectory {
            rewards: &[1.0, 1.0],
            values: &[0.0, 0.0],
            next_values: &[0.0, 0.0],
            terminated: &[false; 2],
            episode_end: &[false; 2],
            behaviour_logp: &[0.0, 0.0],
            target_logp: &[lr, lr],
            num_envs: 1,
        };
        let clip = VtraceClip {
            rho: 2.0,
            c: 0.5,
            rho_pg: 3.0,
        };
        let (mut vs, mut pg) = ([0.0; 2], [0.0; 2]);
        vtrace(&tr, 1.0, 1.0, clip, &mut vs, &mut pg);
        // v_1 = 2 * 1 = 2; v_0 = 2 * 1 + 1 * 0.5 * 2 = 3.
        close(&vs, &[3.0, 2.0]);
        // pg_0 = 3 * (1 + 2 - 0) = 9; pg_1 = 3 * (1 + 0 - 0) = 3.
        close(&pg, &[9.0, 3.0]);
    }
}
