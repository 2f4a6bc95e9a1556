//! CartPole: Gymnasium's `cartpole.py` (Barto, Sutton & Anderson), Euler integration.

use super::EnvRng;
use crate::{Action, ActionSpace, ClassicEnv, Env, EnvSpec, ObsSpace, Step};

const GRAVITY: f64 = 9.8;
const MASSCART: f64 = 1.0;
const MASSPOLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASSPOLE + MASSCART;
const LENGTH: f64 = 0.5;
const POLEMASS_LENGTH: f64 = MASSPOLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;

/// Balance a pole on a cart: observation `[x, x_dot, theta, theta_dot]`, actions
/// `0` (push left) and `1` (push right), reward 1 per step including the terminal one.
/// Without a [`crate::TimeLimit`] it never truncates; [`crate::make`] adds 200 (`v0`) or 500
/// (`v1`) steps. `CartPoleNoVel-v1` (rl-zoo3's id) observes `[x, theta]` only: a policy
/// must remember earlier observations to balance it.
#[derive(Debug, Clone)]
pub struct CartPole {
    state: [f64; 4],
    /// Observe positions only (`CartPoleNoVel-v1`).
    no_velocities: bool,
    rng: EnvRng,
    spec: EnvSpec,
}

impl CartPole {
    /// A new CartPole; `id` is the Gymnasium id it is registered as.
    pub fn new(id: &'static str) -> Self {
        let no_velocities = id == "CartPoleNoVel-v1";
        Self {
            state: [0.0; 4],
            no_velocities,
            rng: EnvRng::new(),
            spec: EnvSpec {
                id: id.into(),
                obs: ObsSpace::vector(if no_velocities { 2 } else { 4 }),
                action_space: ActionSpace::Discrete(2),
                max_episode_steps: None,
                reward_threshold: None,
            },
        }
    }

    #[inline]
    fn write_obs(&self, obs: &mut [f32]) {
        if self.no_velocities {
            obs[0] = self.state[0] as f32;
            obs[1] = self.state[2] as f32;
        } else {
            for (o, s) in obs[..4].iter_mut().zip(self.state) {
                *o = s as f32;
            }
        }
    }
}

impl Env for CartPole {
    type Elem = f32;

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        let rng = self.rng.reseed(seed);
        for s in &mut self.state {
            *s = rng.uniform(-0.05, 0.05);
        }
        self.write_obs(obs);
    }

    #[inline]
    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Step {
        let push_right = match action {
            Action::Discrete(0) => false,
            Action::Discrete(1) => true,
            other => panic!("CartPole takes Discrete(0|1), got {other:?}"),
        };
        let [x, x_dot, theta, theta_dot] = self.state;
        let force = if push_right { FORCE_MAG } else { -FORCE_MAG };
        let (sintheta, costheta) = theta.sin_cos();
        let temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
        let thetaacc = (GRAVITY * sintheta - costheta * temp)
            / (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
        let xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
        let x = x + TAU * x_dot;
        let x_dot = x_dot + TAU * xacc;
        let theta = theta + TAU * theta_dot;
        let theta_dot = theta_dot + TAU * thetaacc;
        self.state = [x, x_dot, theta, theta_dot];
        self.write_obs(obs);
        let terminated = !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
            || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta);
        Step {
            reward: 1.0,
            terminated,
            truncated: false,
        }
    }
}

impl ClassicEnv for CartPole {
    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) {
        self.state.copy_from_slice(&state[..4]);
        self.write_obs(obs);
    }
}

#[cfg(test)]
mod tests {
    use crate::{Action, make};

    #[test]
    fn no_vel_observes_the_positions_of_the_same_dynamics() {
        let (mut full, mut pos) = (
            make("CartPole-v1").unwrap(),
            make("CartPoleNoVel-v1").unwrap(),
        );
        assert_eq!(pos.spec().obs.shape, vec![2]);
        assert_eq!(pos.spec().max_episode_steps, Some(500));
        let (mut a, mut b) = ([0f32; 4], [0f32; 2]);
        full.reset(Some(3), &mut a);
        pos.reset(Some(3), &mut b);
        for t in 0..30 {
            assert_eq!(b, [a[0], a[2]], "step {t}");
            let act = Action::Discrete(usize::from(t % 3 == 0));
            let (s, r) = (full.step(act, &mut a), pos.step(act, &mut b));
            assert_eq!((s.reward, s.terminated), (r.reward, r.terminated));
        }
    }
}
