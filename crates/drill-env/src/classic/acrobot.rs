//! Acrobot: Gymnasium's `acrobot.py` ("book" dynamics, RK4 over one 0.2 s step, no torque noise).

use super::EnvRng;
use crate::{Action, ActionSpace, ClassicEnv, Env, EnvSpec, ObsSpace, Step};
use std::f64::consts::PI;

const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
const LINK_MOI: f64 = 1.0;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const AVAIL_TORQUE: [f64; 3] = [-1.0, 0.0, 1.0];

/// Swing the tip of a two-link pendulum above a line: observation
/// `[cos θ1, sin θ1, cos θ2, sin θ2, θ̇1, θ̇2]`, actions `0,1,2` (torque -1, 0, +1), reward -1
/// per step and 0 on the terminal one. [`crate::make`] truncates at 500.
#[derive(Debug, Clone)]
pub struct Acrobot {
    state: [f64; 4],
    rng: EnvRng,
    spec: EnvSpec,
}

impl Default for Acrobot {
    fn default() -> Self {
        Self::new()
    }
}

fn dsdt(s: &[f64; 5]) -> [f64; 5] {
    let (m1, m2, l1, lc1, lc2, i1, i2, g) = (
        LINK_MASS_1,
        LINK_MASS_2,
        LINK_LENGTH_1,
        LINK_COM_POS_1,
        LINK_COM_POS_2,
        LINK_MOI,
        LINK_MOI,
        9.8,
    );
    let a = s[4];
    let (theta1, theta2, dtheta1, dtheta2) = (s[0], s[1], s[2], s[3]);
    let d1 = m1 * lc1.powi(2)
        + m2 * (l1.powi(2) + lc2.powi(2) + 2.0 * l1 * lc2 * theta2.cos())
        + i1
        + i2;
    let d2 = m2 * (lc2.powi(2) + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * dtheta2.powi(2) * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.powi(2) * theta2.sin() - phi2)
        / (m2 * lc2.powi(2) + i2 - d2.powi(2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0]
}

fn axpy(y: &[f64; 5], h: f64, k: &[f64; 5]) -> [f64; 5] {
    std::array::from_fn(|i| y[i] + h * k[i])
}

fn wrap(mut x: f64, m: f64, big_m: f64) -> f64 {
    let diff = big_m - m;
    while x > big_m {
        x -= diff;
    }
    while x < m {
        x += diff;
    }
    x
}

impl Acrobot {
    /// A new Acrobot-v1.
    pub fn new() -> Self {
        Self {
            state: [0.0; 4],
            rng: EnvRng::new(),
            spec: EnvSpec {
                id: "Acrobot-v1".into(),
                obs: ObsSpace::vector(6),
                action_space: ActionSpace::Discrete(3),
                max_episode_steps: None,
                reward_threshold: None,
            },
        }
    }

    fn write_obs(&self, obs: &mut [f32]) {
        let s = self.state;
        obs[0] = s[0].cos() as f32;
        obs[1] = s[0].sin() as f32;
        obs[2] = s[1].cos() as f32;
        obs[3] = s[1].sin() as f32;
        obs[4] = s[2] as f32;
        obs[5] = s[3] as f32;
    }
}

impl Env for Acrobot {
    type Elem = f32;

    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn reset(&mut self, seed: Option<u64>, obs: &mut [f32]) {
        let rng = self.rng.reseed(seed);
        // Gymnasium draws float64 and stores them as float32.
        for s in &mut self.state {
            *s = f64::from(rng.uniform(-0.1, 0.1) as f32);
        }
        self.write_obs(obs);
    }

    fn step(&mut self, action: Action<'_>, obs: &mut [f32]) -> Step {
        let torque = match action {
            Action::Discrete(a @ 0..=2) => AVAIL_TORQUE[a],
            other => panic!("Acrobot takes Discrete(0..=2), got {other:?}"),
        };
        let s = self.state;
        let y0 = [s[0], s[1], s[2], s[3], torque];
        let dt2 = DT / 2.0;
        let k1 = dsdt(&y0);
        let k2 = dsdt(&axpy(&y0, dt2, &k1));
        let k3 = dsdt(&axpy(&y0, dt2, &k2));
        let k4 = dsdt(&axpy(&y0, DT, &k3));
        let ns: [f64; 4] =
            std::array::from_fn(|i| y0[i] + DT / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]));
        self.state = [
            wrap(ns[0], -PI, PI),
            wrap(ns[1], -PI, PI),
            ns[2].clamp(-MAX_VEL_1, MAX_VEL_1),
            ns[3].clamp(-MAX_VEL_2, MAX_VEL_2),
        ];
        self.write_obs(obs);
        let s = self.state;
        let terminated = -s[0].cos() - (s[1] + s[0]).cos() > 1.0;
        Step {
            reward: if terminated { 0.0 } else { -1.0 },
            terminated,
            truncated: false,
        }
    }
}

impl ClassicEnv for Acrobot {
    fn state(&self) -> Vec<f64> {
        self.state.to_vec()
    }

    fn set_state(&mut self, state: &[f64], obs: &mut [f32]) {
        self.state.copy_from_slice(&state[..4]);
        self.write_obs(obs);
    }
}
