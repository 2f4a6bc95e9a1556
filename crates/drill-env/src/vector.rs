//! [`VecEnv`]: N copies of an environment stepped in one call into structure-of-arrays buffers.
//!
//! # Auto-reset: same-step
//! When copy `i` ends an episode (terminated or truncated) during `step`, it is reset in that
//! same call. Afterwards:
//! - `obs()[i]` is the first observation of the *new* episode (what the next action is for),
//! - `final_obs()[i]` is the last observation of the *finished* episode (for the transition's
//!   `next_obs` and truncation bootstrapping),
//! - `rewards()[i]`, `terminated()[i]`, `truncated()[i]` describe the finished step,
//! - `final_returns()[i]` / `final_lengths()[i]` hold the finished episode's return and length.
//!
//! Where copy `i` did not finish, `final_obs()[i]` equals `obs()[i]`, so `final_obs` is always
//! the transition's next observation. This is Gymnasium 1.x's `AutoresetMode.SAME_STEP`
//! (and SB3's behaviour), chosen so that every step yields a usable transition.
//!
//! Seeding: `reset(Some(seed))` seeds copy `i` with `seed + i`; auto-resets continue each copy's
//! own stream, so one seed fixes the whole run.
//!
//! Continuous actions are clipped to the action box before they reach a copy (Gymnasium's
//! `ClipAction`), so a policy may hand over unbounded samples.

use crate::{Action, ActionSpace, Actions, Elem, Env, EnvError, EnvSpec, Obs};

/// The object-safe interface of a vectorised environment (what [`crate::make_vec`] returns).
pub trait DynVecEnv: Send {
    /// The spec shared by every copy.
    fn spec(&self) -> &EnvSpec;
    /// Number of copies.
    fn num_envs(&self) -> usize;
    /// Reset every copy (see the module docs for seeding); returns the observations. Fails
    /// only for environments outside drill (a Python exception).
    fn reset(&mut self, seed: Option<u64>) -> Result<Obs<'_>, EnvError>;
    /// Step every copy with its action, auto-resetting finished ones (see the module docs).
    /// Fails only for environments outside drill (a Python exception, a wrong shape).
    fn step(&mut self, actions: Actions<'_>) -> Result<(), EnvError>;
    /// Current observations, `num_envs * obs_dim` elements.
    fn obs(&self) -> Obs<'_>;
    /// Next observations of the last step's transitions (pre-reset where an episode ended).
    fn final_obs(&self) -> Obs<'_>;
    /// Rewards of the last step.
    fn rewards(&self) -> &[f32];
    /// Terminated flags of the last step.
    fn terminated(&self) -> &[bool];
    /// Truncated flags of the last step.
    fn truncated(&self) -> &[bool];
    /// Returns of the episodes that ended on the last step (valid where terminated or truncated).
    fn final_returns(&self) -> &[f64];
    /// Lengths of the episodes that ended on the last step (valid where terminated or truncated).
    fn final_lengths(&self) -> &[u32];
}

/// Per-copy output buffers, borrowed for a shard of copies.
struct Shard<'a, T> {
    obs: &'a mut [T],
    final_obs: &'a mut [T],
    rewards: &'a mut [f32],
    terminated: &'a mut [bool],
    truncated: &'a mut [bool],
    running_return: &'a mut [f64],
    running_length: &'a mut [u32],
    final_return: &'a mut [f64],
    final_length: &'a mut [u32],
}

/// After one copy's step with `reward`: add it to the running episode (return, length); when
/// `done`, that episode becomes the copy's last finished one (`final_returns`,
/// `final_lengths`) and a new one starts. Every vectorised env keeps its tallies this way.
pub(crate) fn tally(
    running: (&mut f64, &mut u32),
    last: (&mut f64, &mut u32),
    reward: f64,
    done: bool,
) {
    *running.0 += reward;
    *running.1 += 1;
    if done {
        (*last.0, *last.1) = (*running.0, *running.1);
        (*running.0, *running.1) = (0.0, 0);
    }
}

impl<T: Elem> Shard<'_, T> {
    fn step<E: Env<Elem = T>>(self, envs: &mut [E], actions: Actions<'_>, obs_dim: usize) {
        // Values per copy; only continuous actions use it.
        let act_dim = match actions {
            Actions::Discrete(_) => 1,
            Actions::Continuous(a) => a.len() / envs.len().max(1),
        };
        for (i, env) in envs.iter_mut().enumerate() {
            let action = match actions {
                Actions::Discrete(a) => Action::Discrete(a[i] as usize),
                Actions::Continuous(a) => Action::Continuous(&a[i * act_dim..(i + 1) * act_dim]),
            };
            let obs = &mut self.obs[i * obs_dim..(i + 1) * obs_dim];
            let step = env.step(action, obs);
            self.final_obs[i * obs_dim..(i + 1) * obs_dim].copy_from_slice(obs);
            self.rewards[i] = step.reward as f32;
            self.terminated[i] = step.terminated;
            self.truncated[i] = step.truncated;
            let done = step.terminated || step.truncated;
            tally(
                (&mut self.running_return[i], &mut self.running_length[i]),
                (&mut self.final_return[i], &mut self.final_length[i]),
                step.reward,
                done,
            );
            if done {
                env.reset(None, obs);
            }
        }
    }
}

/// N copies of `E` with contiguous output buffers; see the module docs for auto-reset.
pub struct VecEnv<E: Env> {
    envs: Vec<E>,
    spec: EnvSpec,
    obs_dim: usize,
    obs: Vec<E::Elem>,
    final_obs: Vec<E::Elem>,
    rewards: Vec<f32>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
    running_return: Vec<f64>,
    running_length: Vec<u32>,
    final_return: Vec<f64>,
    final_length: Vec<u32>,
    pool: Option<rayon::ThreadPool>,
    first_seed: Option<u64>,
    /// Continuous actions after clipping to the box.
    clipped: Vec<f32>,
}

impl<E: Env> VecEnv<E> {
    /// Wrap `envs` (at least one); `seed` is used by the first `reset(None)`; `threads > 1`
    /// steps and resets shards of copies on that many worker threads (worth it only for
    /// expensive envs).
    pub fn new(envs: Vec<E>, seed: u64, threads: usize) -> Self {
        assert!(!envs.is_empty(), "VecEnv needs at least one environment");
        let n = envs.len();
        let spec = envs[0].spec().clone();
        let obs_dim = spec.obs_dim();
        let pool = (threads > 1).then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("drill-env-{i}"))
                .build()
                .expect("could not start environment worker threads")
        });
        Self {
            envs,
            spec,
            obs_dim,
            obs: vec![E::Elem::default(); n * obs_dim],
            final_obs: vec![E::Elem::default(); n * obs_dim],
            rewards: vec![0.0; n],
            terminated: vec![false; n],
            truncated: vec![false; n],
            running_return: vec![0.0; n],
            running_length: vec![0; n],
            final_return: vec![0.0; n],
            final_length: vec![0; n],
            pool,
            first_seed: Some(seed),
            clipped: Vec::new(),
        }
    }

    fn shard(&mut self) -> Shard<'_, E::Elem> {
        Shard {
            obs: &mut self.obs,
            final_obs: &mut self.final_obs,
            rewards: &mut self.rewards,
            terminated: &mut self.terminated,
            truncated: &mut self.truncated,
            running_return: &mut self.running_return,
            running_length: &mut self.running_length,
            final_return: &mut self.final_return,
            final_length: &mut self.final_length,
        }
    }
}

impl<E: Env> DynVecEnv for VecEnv<E> {
    fn spec(&self) -> &EnvSpec {
        &self.spec
    }

    fn num_envs(&self) -> usize {
        self.envs.len()
    }

    fn reset(&mut self, seed: Option<u64>) -> Result<Obs<'_>, EnvError> {
        // The construction seed applies to the first reset unless one is given.
        let seed = seed.or(self.first_seed.take());
        self.first_seed = None;
        let d = self.obs_dim;
        // Copy `i` is seeded `seed + i`; on the worker threads when there are some (an Atari
        // copy's seeded reset loads its ROM: about 70 ms).
        let reset = move |first: usize, envs: &mut [E], obs: &mut [E::Elem]| {
            for (j, (env, o)) in envs.iter_mut().zip(obs.chunks_exact_mut(d)).enumerate() {
                env.reset(seed.map(|s| s.wrapping_add((first + j) as u64)), o);
            }
        };
        match &self.pool {
            Some(pool) => {
                let per = self.envs.len().div_ceil(pool.current_num_threads());
                let shards = self.envs.chunks_mut(per).zip(self.obs.chunks_mut(per * d));
                pool.scope(|scope| {
                    for (k, (envs, obs)) in shards.enumerate() {
                        scope.spawn(move |_| reset(k * per, envs, obs));
                    }
                });
            }
            None => reset(0, &mut self.envs, &mut self.obs),
        }
        self.final_obs.copy_from_slice(&self.obs);
        self.running_return.fill(0.0);
        self.running_length.fill(0);
        Ok(E::Elem::obs(&self.obs))
    }

    fn step(&mut self, actions: Actions<'_>) -> Result<(), EnvError> {
        let n = self.envs.len();
        match actions {
            Actions::Discrete(a) => assert_eq!(a.len(), n, "one discrete action per copy"),
            Actions::Continuous(a) => assert_eq!(a.len() % n, 0, "act_dim values per copy"),
        }
        let mut clipped = std::mem::take(&mut self.clipped);
        let actions = match (actions, &self.spec.action_space) {
            (Actions::Continuous(a), ActionSpace::Continuous { low, high }) => {
                clipped.clear();
                let dim = low.len();
                clipped.extend(
                    a.iter()
                        .enumerate()
                        .map(|(k, x)| x.clamp(low[k % dim], high[k % dim])),
                );
                Actions::Continuous(&clipped)
            }
            (actions, _) => actions,
        };
        self.step_copies(actions);
        self.clipped = clipped;
        Ok(())
    }

    fn obs(&self) -> Obs<'_> {
        E::Elem::obs(&self.obs)
    }
    fn final_obs(&self) -> Obs<'_> {
        E::Elem::obs(&self.final_obs)
    }
    fn rewards(&self) -> &[f32] {
        &self.rewards
    }
    fn terminated(&self) -> &[bool] {
        &self.terminated
    }
    fn truncated(&self) -> &[bool] {
        &self.truncated
    }
    fn final_returns(&self) -> &[f64] {
        &self.final_return
    }
    fn final_lengths(&self) -> &[u32] {
        &self.final_length
    }
}

impl<E: Env> VecEnv<E> {
    fn step_copies(&mut self, actions: Actions<'_>) {
        let n = self.envs.len();
        let d = self.obs_dim;
        let Some(pool) = self.pool.take() else {
            let mut envs = std::mem::take(&mut self.envs);
            self.shard().step(&mut envs, actions, d);
            self.envs = envs;
            return;
        };
        let per = n.div_ceil(pool.current_num_threads());
        let mut envs = std::mem::take(&mut self.envs);
        {
            let s = self.shard();
            let act_dim = match actions {
                Actions::Discrete(_) => 1,
                Actions::Continuous(a) => a.len() / n,
            };
            let shards = envs
                .chunks_mut(per)
                .zip(s.obs.chunks_mut(per * d))
                .zip(s.final_obs.chunks_mut(per * d))
                .zip(s.rewards.chunks_mut(per))
                .zip(s.terminated.chunks_mut(per))
                .zip(s.truncated.chunks_mut(per))
                .zip(s.running_return.chunks_mut(per))
                .zip(s.running_length.chunks_mut(per))
                .zip(s.final_return.chunks_mut(per))
                .zip(s.final_length.chunks_mut(per))
                .enumerate();
            pool.scope(|scope| {
                for (k, (((((((((e, o), fo), r), te), tr), rr), rl), fr), fl)) in shards {
                    let acts = match actions {
                        Actions::Discrete(a) => Actions::Discrete(&a[k * per..k * per + e.len()]),
                        Actions::Continuous(a) => Actions::Continuous(
                            &a[k * per * act_dim..(k * per + e.len()) * act_dim],
                        ),
                    };
                    let shard = Shard {
                        obs: o,
                        final_obs: fo,
                        rewards: r,
                        terminated: te,
                        truncated: tr,
                        running_return: rr,
                        running_length: rl,
                        final_return: fr,
                        final_length: fl,
                    };
                    scope.spawn(move |_| shard.step(e, acts, d));
                }
            });
        }
        self.envs = envs;
        self.pool = Some(pool);
    }
}

#[cfg(test)]
mod tests {
    use crate::make_vec;

    fn run(threads: usize) -> (Vec<f32>, Vec<f64>) {
        let mut v = make_vec("CartPole-v1", 6, 42, threads).unwrap();
        v.reset(None).unwrap();
        let mut obs_log = Vec::new();
        let mut returns = Vec::new();
        for t in 0..300u32 {
            let actions: Vec<u32> = (0..6).map(|i| (t + i) % 2).collect();
            v.step(super::Actions::Discrete(&actions)).unwrap();
            obs_log.extend_from_slice(v.obs().f32());
            for i in 0..6 {
                if v.terminated()[i] || v.truncated()[i] {
                    returns.push(v.final_returns()[i]);
                }
            }
        }
        (obs_log, returns)
    }

    #[test]
    fn same_step_autoreset_keeps_final_obs_and_episode_stats() {
        let mut v = make_vec("CartPole-v0", 3, 0, 1).unwrap();
        v.reset(None).unwrap();
        let mut finished = 0;
        for _ in 0..100 {
            v.step(super::Actions::Discrete(&[1, 1, 1])).unwrap();
            for i in 0..3 {
                let (o, f) = (
                    &v.obs().f32()[i * 4..i * 4 + 4],
                    &v.final_obs().f32()[i * 4..i * 4 + 4],
                );
                if v.terminated()[i] {
                    finished += 1;
                    // Terminal obs is out of bounds; the new episode's obs is near zero.
                    assert!(f[0].abs() > 2.4 || f[2].abs() > 0.2094, "final obs {f:?}");
                    assert!(o.iter().all(|x| x.abs() <= 0.05), "reset obs {o:?}");
                    assert_eq!(v.final_returns()[i], v.final_lengths()[i] as f64);
                } else {
                    assert_eq!(o, f, "final_obs equals obs when not done");
                }
            }
        }
        assert!(finished >= 3, "always pushing right ends episodes quickly");
    }

    #[test]
    fn seeds_fix_the_run_and_threads_do_not_change_it() {
        let a = run(1);
        assert_eq!(a, run(1), "same seed, same trajectories");
        assert_eq!(a, run(2), "worker threads give the same result");
        let mut other = make_vec("CartPole-v1", 6, 43, 1).unwrap();
        let from_43 = other.reset(None).unwrap().f32().to_vec();
        let first = other.reset(Some(42)).unwrap().f32().to_vec();
        assert_ne!(from_43, first, "different seeds, different starts");
        let mut same = make_vec("CartPole-v1", 6, 42, 1).unwrap();
        assert_eq!(
            same.reset(None).unwrap().f32(),
            &first[..],
            "reset(Some(seed)) equals the construction seed"
        );
        // Copies get distinct seeds.
        assert_ne!(first[0..4], first[4..8]);
    }

    #[test]
    fn truncation_at_the_registered_limit() {
        let mut v = make_vec("Pendulum-v1", 2, 1, 1).unwrap();
        v.reset(None).unwrap();
        for t in 1..=200 {
            v.step(super::Actions::Continuous(&[0.0, 0.5])).unwrap();
            assert_eq!(v.truncated()[0], t == 200);
            assert!(!v.terminated()[1]);
        }
        assert_eq!(v.final_lengths(), &[200, 200]);
    }

    #[test]
    fn continuous_actions_are_clipped_to_the_box() {
        let mut a = make_vec("Pendulum-v1", 1, 3, 1).unwrap();
        let mut b = make_vec("Pendulum-v1", 1, 3, 1).unwrap();
        a.reset(None).unwrap();
        b.reset(None).unwrap();
        for _ in 0..20 {
            a.step(super::Actions::Continuous(&[7.5])).unwrap();
            b.step(super::Actions::Continuous(&[2.0])).unwrap();
            assert_eq!(a.obs(), b.obs());
            assert_eq!(a.rewards(), b.rewards());
        }
    }
}
