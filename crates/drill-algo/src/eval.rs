//! [`Evaluator`]: runs whole episodes with a deterministic policy and reports the mean return.

use crate::data::Hidden;
use drill_env::{ActionBuf, DynVecEnv, EnvError, Obs, make_vec};

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

impl EvalResult {
    /// The result of `episodes`, in the order one process running every copy would have
    /// finished them (by step, then copy), whichever ranks ran them.
    pub(crate) fn from_episodes(mut episodes: Vec<Episode>) -> Self {
        episodes.sort_by_key(|e| (e.step, e.copy));
        let returns: Vec<f64> = episodes.iter().map(|e| e.ret).collect();
        let n = returns.len() as f64;
        let mean = returns.iter().sum::<f64>() / n;
        let std = (returns.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
        EvalResult { mean, std, returns }
    }
}

/// One evaluation episode: the step of the evaluation it ended at, its copy (global index) and
/// its return.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Episode {
    /// Vector-env step (within this evaluation) at which it ended.
    pub step: u64,
    /// Global index of the copy that ran it.
    pub copy: usize,
    /// Its return.
    pub ret: f64,
}

/// Runs `episodes` episodes over `num_envs` copies (copy `i` runs its share, so short episodes
/// are not over-represented). Evaluation `k` resets copy `i` with seed `seed + k * copies + i`,
/// so a copy's episodes do not depend on which other copies run beside it: under DDP each rank
/// holds a block of the copies ([`Evaluator::share`]) and the ranks' episodes together are
/// exactly one process's.
pub struct Evaluator {
    venv: Box<dyn DynVecEnv>,
    quota: Vec<usize>,
    /// Global index of `venv`'s first copy.
    first: usize,
    /// Copies in the whole evaluation.
    total: usize,
    /// Seed of global copy 0 in the first evaluation.
    seed: u64,
    /// Evaluations run so far.
    round: u64,
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
        Ok(Self::with_envs(
            make_vec(id, num_envs, seed, 1)?,
            episodes,
            seed,
        ))
    }

    /// An evaluator running `episodes` episodes on `venv`'s copies, from `seed`.
    pub(crate) fn with_envs(venv: Box<dyn DynVecEnv>, episodes: usize, seed: u64) -> Self {
        let n = venv.num_envs();
        Self::share(venv, episodes, n, 0, seed)
    }

    /// The part of an evaluation of `episodes` episodes over `total` copies from `seed` that
    /// `venv` runs: its copies are the global copies `first..first + venv.num_envs()`.
    pub fn share(
        venv: Box<dyn DynVecEnv>,
        episodes: usize,
        total: usize,
        first: usize,
        seed: u64,
    ) -> Self {
        let num_envs = venv.num_envs();
        let quota = (first..first + num_envs)
            .map(|i| episodes / total + usize::from(i < episodes % total))
            .collect();
        let actions = ActionBuf::for_space(&venv.spec().action_space, num_envs);
        Self {
            venv,
            quota,
            first,
            total,
            seed,
            round: 0,
            actions,
        }
    }

    /// Run the episodes; `policy(obs, actions)` fills one action per copy.
    pub fn run(
        &mut self,
        policy: impl FnMut(Obs<'_>, &mut Hidden, &mut ActionBuf),
    ) -> Result<EvalResult, EnvError> {
        Ok(EvalResult::from_episodes(self.run_episodes(policy)?))
    }

    /// Run this evaluator's episodes and report each (see [`EvalResult::from_episodes`]).
    pub(crate) fn run_episodes(
        &mut self,
        mut policy: impl FnMut(Obs<'_>, &mut Hidden, &mut ActionBuf),
    ) -> Result<Vec<Episode>, EnvError> {
        let base = self.seed + self.round * self.total as u64 + self.first as u64;
        self.round += 1;
        self.venv.reset(Some(base))?;
        let mut left = self.quota.clone();
        let mut episodes = Vec::with_capacity(left.iter().sum());
        let mut step = 0;
        // A recurrent policy's state per copy: zeros at every episode's start.
        let mut hidden = Hidden::default();
        while left.iter().any(|&l| l > 0) {
            policy(self.venv.obs(), &mut hidden, &mut self.actions);
            self.venv.step(self.actions.as_actions())?;
            step += 1;
            for (i, l) in left.iter_mut().enumerate() {
                let ended = self.venv.terminated()[i] || self.venv.truncated()[i];
                if ended {
                    hidden.reset(i);
                }
                if *l > 0 && ended {
                    episodes.push(Episode {
                        step,
                        copy: self.first + i,
                        ret: self.venv.final_returns()[i],
                    });
                    *l -= 1;
                }
            }
        }
        Ok(episodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_exactly_the_requested_episodes() {
        let mut ev = Evaluator::new("CartPole-v0", 3, 7, 0).unwrap();
        let r = ev
            .run(|_, _, a| {
                if let ActionBuf::Discrete(a) = a {
                    a.fill(1);
                }
            })
            .unwrap();
        assert_eq!(r.returns.len(), 7);
        assert!(
            r.mean > 5.0 && r.mean < 20.0,
            "always-right fails fast: {}",
            r.mean
        );
        // A balancing controller reaches the 200-step limit.
        let r = ev
            .run(|obs, _, a| {
                if let ActionBuf::Discrete(a) = a {
                    for (i, a) in a.iter_mut().enumerate() {
                        let o = &obs.f32()[i * 4..i * 4 + 4];
                        *a = u32::from(o[2] + 0.5 * o[3] > 0.0);
                    }
                }
            })
            .unwrap();
        assert_eq!(r.mean, 200.0);
        assert_eq!(r.std, 0.0);
    }

    /// A recurrent policy's state starts every episode from zeros: a state that counts the
    /// steps it has seen reads each episode's length (CartPole's return) at its end, in
    /// every round.
    #[test]
    fn the_recurrent_state_restarts_with_every_episode() {
        let mut ev = Evaluator::new("CartPole-v1", 3, 8, 4).unwrap();
        for round in 0..2 {
            let mut seen: Vec<Vec<f32>> = vec![Vec::new(); 3];
            let episodes = ev
                .run_episodes(|obs, hidden, a| {
                    let n = obs.len() / 4;
                    let counts = hidden.rows_mut(n, 1);
                    for (i, c) in counts.iter_mut().enumerate() {
                        *c += 1.0;
                        seen[i].push(*c);
                    }
                    if let ActionBuf::Discrete(a) = a {
                        for (i, a) in a.iter_mut().enumerate() {
                            *a = obs.f32()[i * 4 + 2].to_bits() % 2;
                        }
                    }
                })
                .unwrap();
            for (copy, seen) in seen.iter().enumerate() {
                let want: Vec<f32> = episodes
                    .iter()
                    .filter(|e| e.copy == copy)
                    .flat_map(|e| (1..=e.ret as u32).map(|k| k as f32))
                    .collect();
                assert_eq!(seen[..want.len()], want, "round {round}, copy {copy}");
            }
        }
    }

    #[test]
    fn shares_of_the_copies_give_the_whole_evaluation() {
        // A policy that acts at random but as a function of the observation, so returns differ
        // per episode and the copies must see the same observations in both runs.
        let policy = |obs: Obs<'_>, _: &mut Hidden, a: &mut ActionBuf| {
            if let ActionBuf::Discrete(a) = a {
                for (i, a) in a.iter_mut().enumerate() {
                    let o = &obs.f32()[i * 4..i * 4 + 4];
                    *a = o[0].to_bits() % 2;
                }
            }
        };
        let (copies, episodes, seed) = (5, 13, 7);
        let mut whole = Evaluator::new("CartPole-v1", copies, episodes, seed).unwrap();
        let mut shares: Vec<Evaluator> = [(0, 2), (2, 3), (3, 5)]
            .into_iter()
            .map(|(lo, hi)| {
                let venv = make_vec("CartPole-v1", hi - lo, seed + lo as u64, 1).unwrap();
                Evaluator::share(venv, episodes, copies, lo, seed)
            })
            .collect();
        for round in 0..2 {
            let want = whole.run(policy).unwrap();
            let parts = shares
                .iter_mut()
                .flat_map(|e| e.run_episodes(policy).unwrap());
            let got = EvalResult::from_episodes(parts.collect());
            assert_eq!(got, want, "round {round}");
            assert_eq!(got.returns.len(), episodes);
            assert!(
                got.std > 0.0,
                "returns differ, so their order is checked: {got:?}"
            );
        }
    }
}
