//! Environment ids and constructors: [`make`] and [`make_vec`] from a Gymnasium id.

use crate::classic::{Acrobot, CartPole, MountainCar, Pendulum};
use crate::{DynVecEnv, Env, EnvSpec, TimeLimit, VecEnv};

/// Every id [`make`] knows, with Gymnasium's registered step limit and reward threshold.
pub const ENV_IDS: [(&str, u32, Option<f64>); 5] = [
    ("CartPole-v0", 200, Some(195.0)),
    ("CartPole-v1", 500, Some(475.0)),
    ("Pendulum-v1", 200, None),
    ("MountainCar-v0", 200, Some(-110.0)),
    ("Acrobot-v1", 500, Some(-100.0)),
];

/// Errors building an environment.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The id is not one of [`ENV_IDS`].
    #[error("unknown environment id {id:?}; known ids: {known}")]
    UnknownId {
        /// The id asked for.
        id: String,
        /// The known ids, comma separated.
        known: String,
    },
    /// A vectorised environment needs at least one copy.
    #[error("a vectorised environment needs at least 1 copy, got 0")]
    NoCopies,
}

fn unknown(id: &str) -> EnvError {
    EnvError::UnknownId {
        id: id.to_string(),
        known: ENV_IDS.iter().map(|e| e.0).collect::<Vec<_>>().join(", "),
    }
}

fn with_limits<E: Env>(env: E, id: &str) -> TimeLimit<E> {
    let (_, limit, threshold) = ENV_IDS.iter().find(|e| e.0 == id).copied().unwrap();
    let mut env = TimeLimit::new(env, limit);
    env.spec_mut().reward_threshold = threshold;
    env
}

/// Build one environment by Gymnasium id, wrapped in its registered [`TimeLimit`].
pub fn make(id: &str) -> Result<Box<dyn Env>, EnvError> {
    Ok(match id {
        "CartPole-v0" => Box::new(with_limits(CartPole::new("CartPole-v0"), id)),
        "CartPole-v1" => Box::new(with_limits(CartPole::new("CartPole-v1"), id)),
        "Pendulum-v1" => Box::new(with_limits(Pendulum::new(), id)),
        "MountainCar-v0" => Box::new(with_limits(MountainCar::new(), id)),
        "Acrobot-v1" => Box::new(with_limits(Acrobot::new(), id)),
        _ => return Err(unknown(id)),
    })
}

/// The spec of an id (spaces, limits) without building anything heavy.
pub fn spec(id: &str) -> Result<EnvSpec, EnvError> {
    Ok(make(id)?.spec().clone())
}

/// Build `n` copies of `id` stepped together; copy `i` is seeded with `seed + i` on the first
/// reset. `threads > 1` steps them on a private pool of that many worker threads.
pub fn make_vec(
    id: &str,
    n: usize,
    seed: u64,
    threads: usize,
) -> Result<Box<dyn DynVecEnv>, EnvError> {
    if n == 0 {
        return Err(EnvError::NoCopies);
    }
    fn build<E: Env + 'static>(
        f: impl Fn() -> E,
        id: &str,
        n: usize,
        seed: u64,
        threads: usize,
    ) -> Box<dyn DynVecEnv> {
        let envs = (0..n).map(|_| with_limits(f(), id)).collect();
        Box::new(VecEnv::new(envs, seed, threads))
    }
    Ok(match id {
        "CartPole-v0" => build(|| CartPole::new("CartPole-v0"), id, n, seed, threads),
        "CartPole-v1" => build(|| CartPole::new("CartPole-v1"), id, n, seed, threads),
        "Pendulum-v1" => build(Pendulum::new, id, n, seed, threads),
        "MountainCar-v0" => build(MountainCar::new, id, n, seed, threads),
        "Acrobot-v1" => build(Acrobot::new, id, n, seed, threads),
        _ => return Err(unknown(id)),
    })
}
