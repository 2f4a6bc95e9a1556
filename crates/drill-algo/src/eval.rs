//! [`Evaluator`]: runs whole episodes with a deterministic policy and reports the mean return.

use drill_env::{ActionBuf, DynVecEnv, Obs, make_vec};

/// Returns of one evaluation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalResult {
    /// Mean episode return.
    pub mean: f64,
    /// Standard deviation of the returns.
    pub std: f64,
    /// Each episode's return.
    pub returns: Vec<f64>,
}

/// Runs `episodes` episodes over `num_envs` copies (copy `i` runs its share, so short episodes
/// are not over-represented). Each evaluation continues the copies' seeded streams.
pub struct Evaluator {
    venv: Box<dyn DynVecEnv>,
    quota: Vec<usize>,
    actions: ActionBuf,
}

impl Evaluator {
    /// An evaluator on `id` with its own seed.
    pub fn new(
        id: &str,
        num_envs: usize,
        episodes: usize,
        seed: u64,
    ) -> Result<Self, drill_env::EnvError> {
        Ok(Self::with_envs(make_vec(id, num_envs, seed, 1)?, episodes))
    }

    /// An evaluator running `episodes` episodes on `venv`'s copies.
    pub fn with_envs(venv: Box<dyn DynVecEnv>, episodes: usize) -> Self {
        let num_envs = venv.num_envs();
        let quota = (0..num_envs)
            .map(|i| episodes / num_envs + usize::from(i < episodes % num_envs))
            .collect();
        let actions = ActionBuf::for_space(&venv.spec().action_space, num_envs);
        Self {
            venv,
            quota,
            actions,
        }
    }

    /// Run the episodes; `policy(obs, actions)` fills one action per copy.
    pub fn run(&mut self, mut policy: impl FnMut(Obs<'_>, &mut ActionBuf)) -> EvalResult {
        self.venv.reset(None);
        let mut left = self.quota.clone();
        let mut returns = Vec::with_capacity(left.iter().sum());
        while left.iter().any(|&l| l > 0) {
            policy(self.venv.obs(), &mut self.actions);
            self.venv.step(self.actions.as_actions());
            for (i, l) in left.iter_mut().enumerate() {
                if *l > 0 && (self.venv.terminated()[i] || self.venv.truncated()[i]) {
                    returns.push(self.venv.final_returns()[i]);
                    *l -= 1;
                }
            }
        }
        let n = returns.len() as f64;
        let mean = returns.iter().sum::<f64>() / n;
        let std = (returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
        EvalResult { mean, std, returns }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_exactly_the_requested_episodes() {
        let mut ev = Evaluator::new("CartPole-v0", 3, 7, 0).unwrap();
        let r = ev.run(|_, a| {
            if let ActionBuf::Discrete(a) = a {
                a.fill(1);
            }
        });
        assert_eq!(r.returns.len(), 7);
        assert!(
            r.mean > 5.0 && r.mean < 20.0,
            "always-right fails fast: {}",
            r.mean
        );
        // A balancing controller reaches the 200-step limit.
        let r = ev.run(|obs, a| {
            if let ActionBuf::Discrete(a) = a {
                for (i, a) in a.iter_mut().enumerate() {
                    let o = &obs.f32()[i * 4..i * 4 + 4];
                    *a = u32::from(o[2] + 0.5 * o[3] > 0.0);
                }
            }
        });
        assert_eq!(r.mean, 200.0);
        assert_eq!(r.std, 0.0);
    }
}
