//! Generalised advantage estimation (Schulman et al. 2016) over a time-major rollout.

/// Advantages for a rollout of `T` steps × `num_envs` envs, time-major (`t * num_envs + i`).
///
/// `next_values[k]` is V of the transition's next observation (the finished episode's last one
/// when it ended). A terminated step does not bootstrap; any episode end (terminated or
/// truncated) stops the advantage from flowing back across it. Writes `adv`; returns are
/// `adv + values`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gae(
    rewards: &[f32],
    values: &[f32],
    next_values: &[f32],
    terminated: &[bool],
    episode_end: &[bool],
    num_envs: usize,
    gamma: f32,
    lambda: f32,
    adv: &mut [f32],
) {
    let n = rewards.len();
    assert!(
        n.is_multiple_of(num_envs) && values.len() == n && next_values.len() == n && adv.len() == n
    );
    let steps = n / num_envs;
    for i in 0..num_envs {
        let mut last = 0.0f32;
        for t in (0..steps).rev() {
            let k = t * num_envs + i;
            let not_term = if terminated[k] { 0.0 } else { 1.0 };
            let carry = if episode_end[k] { 0.0 } else { 1.0 };
            let delta = rewards[k] + gamma * next_values[k] * not_term - values[k];
            last = delta + gamma * lambda * carry * last;
            adv[k] = last;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_advantages() {
        // One env, gamma 0.9, lambda 0.8. Steps: r = [1, 2, 3], V = [0.5, 1.0, 1.5],
        // V(next) = [1.0, 1.5, 2.0]; step 1 terminates (episode ends), step 2 does not.
        let r = [1.0, 2.0, 3.0];
        let v = [0.5, 1.0, 1.5];
        let nv = [1.0, 1.5, 2.0];
        let term = [false, true, false];
        let end = [false, true, false];
        let mut adv = [0.0; 3];
        gae(&r, &v, &nv, &term, &end, 1, 0.9, 0.8, &mut adv);
        // t=2: delta = 3 + 0.9*2 - 1.5 = 3.3; A = 3.3
        // t=1: delta = 2 + 0 - 1.0 = 1.0; A = 1.0 (no carry past the end)
        // t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4; A = 1.4 + 0.72 * 1.0 = 2.12
        let want = [2.12, 1.0, 3.3];
        for (a, w) in adv.iter().zip(want) {
            assert!((a - w).abs() < 1e-6, "{adv:?}");
        }
    }

    #[test]
    fn truncation_bootstraps_but_does_not_carry_and_envs_are_independent() {
        // Two envs interleaved; env 0 truncates at t=0, env 1 never ends. gamma 0.5, lambda 1.
        let r = [1.0, 1.0, 1.0, 1.0];
        let v = [0.0; 4];
        let nv = [10.0, 2.0, 4.0, 6.0];
        let end = [true, false, false, false];
        let mut adv = [0.0; 4];
        gae(&r, &v, &nv, &[false; 4], &end, 2, 0.5, 1.0, &mut adv);
        // env 0: t=1 (k=2): 1 + 0.5*4 = 3; t=0 (k=0): 1 + 0.5*10 = 6 (no carry).
        // env 1: t=1 (k=3): 1 + 3 = 4; t=0 (k=1): 1 + 1 + 0.5*4 = 4.
        assert_eq!(adv, [6.0, 4.0, 3.0, 4.0]);
    }
}
