//! Environment ids and constructors: [`make`] and [`make_vec`] from a Gymnasium id, classic
//! control or Atari ([`crate::atari`]).

use crate::atari::{self, AtariOptions};
use crate::classic::{Acrobot, CartPole, MountainCar, Pendulum};
use crate::gymnasium::GYMNASIUM;
use crate::{ClassicEnv, DynVecEnv, Env, EnvError, EnvSpec, TimeLimit, VecEnv};

/// Every id [`make`] knows, with Gymnasium's registered step limit and reward threshold.
pub const ENV_IDS: [(&str, u32, Option<f64>); 6] = [
    ("CartPole-v0", 200, Some(195.0)),
    ("CartPole-v1", 500, Some(475.0)),
    ("CartPoleNoVel-v1", 500, Some(475.0)),
    ("Pendulum-v1", 200, None),
    ("MountainCar-v0", 200, Some(-110.0)),
    ("Acrobot-v1", 500, Some(-100.0)),
];

fn unknown(id: &str) -> EnvError {
    EnvError::UnknownId {
        id: id.to_string(),
        known: ENV_IDS.iter().map(|e| e.0).collect::<Vec<_>>().join(", ")
            + ", and 152 Atari ids such as PongNoFrameskip-v4 or ALE/Pong-v5 (`drill env list` prints them all)",
    }
}

/// Every id drill knows: classic control, then Atari.
pub fn ids() -> Vec<String> {
    ENV_IDS
        .iter()
        .map(|e| e.0.to_string())
        .chain(atari::ids())
        .collect()
}

/// The ROM of Atari id `id` (the game `game`), or the error saying where it was looked for.
pub fn atari_rom(id: &str, game: &str) -> Result<std::path::PathBuf, EnvError> {
    match atari::roms::find(game) {
        (_, Some(f)) => Ok(f),
        (searched, None) => Err(EnvError::RomMissing {
            id: id.to_string(),
            file: format!("{game}.bin"),
            searched: searched
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            how: atari::roms::HOW_TO_GET_ROMS,
        }),
    }
}

/// One Atari game with its wrapper chain (see [`crate::atari`]).
#[cfg(feature = "atari")]
pub fn make_atari(id: &str, opts: &AtariOptions) -> Result<atari::Atari, EnvError> {
    let a = atari::parse_id(id).ok_or_else(|| unknown(id))?;
    let rom = atari_rom(id, a.game)?;
    Ok(atari::Atari::new(
        id,
        &rom,
        a.repeat_action_probability,
        opts.full_action_space,
        a.max_frames,
        opts.clone(),
    ))
}

#[cfg(not(feature = "atari"))]
fn atari_not_built(id: &str) -> EnvError {
    EnvError::AtariNotBuilt { id: id.to_string() }
}

fn with_limits<E: Env>(env: E, id: &str) -> TimeLimit<E> {
    let (_, limit, threshold) = ENV_IDS.iter().find(|e| e.0 == id).copied().unwrap();
    let mut env = TimeLimit::new(env, limit);
    env.spec_mut().reward_threshold = threshold;
    env
}

/// Build one environment by Gymnasium id, wrapped in its registered [`TimeLimit`].
pub fn make(id: &str) -> Result<Box<dyn ClassicEnv>, EnvError> {
    Ok(match id {
        "CartPole-v0" => Box::new(with_limits(CartPole::new("CartPole-v0"), id)),
        "CartPole-v1" => Box::new(with_limits(CartPole::new("CartPole-v1"), id)),
        "CartPoleNoVel-v1" => Box::new(with_limits(CartPole::new("CartPoleNoVel-v1"), id)),
        "Pendulum-v1" => Box::new(with_limits(Pendulum::new(), id)),
        "MountainCar-v0" => Box::new(with_limits(MountainCar::new(), id)),
        "Acrobot-v1" => Box::new(with_limits(Acrobot::new(), id)),
        _ => return Err(unknown(id)),
    })
}

/// The spec of an id (spaces, limits); for Atari, with the default wrapper chain (an Atari
/// spec loads the ROM, which tells the action set).
pub fn spec(id: &str) -> Result<EnvSpec, EnvError> {
    spec_with(id, &AtariOptions::default())
}

/// The spec of an id with the Atari wrapper chain `atari` (which sets the frame shape).
pub fn spec_with(id: &str, atari: &AtariOptions) -> Result<EnvSpec, EnvError> {
    if id.starts_with(GYMNASIUM) {
        #[cfg(feature = "python")]
        return crate::python::spec(id);
        #[cfg(not(feature = "python"))]
        return Err(EnvError::PythonNotBuilt { id: id.into() });
    }
    if atari::parse_id(id).is_some() {
        #[cfg(feature = "atari")]
        return Ok(make_atari(id, atari)?.spec().clone());
        #[cfg(not(feature = "atari"))]
        return Err({
            let _ = atari;
            atari_not_built(id)
        });
    }
    Ok(make(id)?.spec().clone())
}

/// Build `n` copies of `id` stepped together; copy `i` is seeded with `seed + i` on the first
/// reset. `threads > 1` steps them on a private pool of that many worker threads. Atari ids
/// get the default (training) wrapper chain; see [`make_vec_with`].
pub fn make_vec(
    id: &str,
    n: usize,
    seed: u64,
    threads: usize,
) -> Result<Box<dyn DynVecEnv>, EnvError> {
    make_vec_with(id, n, seed, threads, &AtariOptions::default())
}

/// [`make_vec`] with the Atari wrapper chain `atari` (ignored by classic control).
pub fn make_vec_with(
    id: &str,
    n: usize,
    seed: u64,
    threads: usize,
    atari: &AtariOptions,
) -> Result<Box<dyn DynVecEnv>, EnvError> {
    if n == 0 {
        return Err(EnvError::NoCopies);
    }
    if id.starts_with(GYMNASIUM) {
        #[cfg(feature = "python")]
        return Ok(Box::new(crate::python::make_vec(id, n, seed)?));
        #[cfg(not(feature = "python"))]
        return Err(EnvError::PythonNotBuilt { id: id.into() });
    }
    if atari::parse_id(id).is_some() {
        #[cfg(feature = "atari")]
        {
            let envs = (0..n)
                .map(|_| make_atari(id, atari))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Box::new(VecEnv::new(envs, seed, threads)));
        }
        #[cfg(not(feature = "atari"))]
        return Err({
            let _ = (atari, threads, seed);
            atari_not_built(id)
        });
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
        "CartPoleNoVel-v1" => build(|| CartPole::new("CartPoleNoVel-v1"), id, n, seed, threads),
        "Pendulum-v1" => build(Pendulum::new, id, n, seed, threads),
        "MountainCar-v0" => build(MountainCar::new, id, n, seed, threads),
        "Acrobot-v1" => build(Acrobot::new, id, n, seed, threads),
        _ => return Err(unknown(id)),
    })
}
