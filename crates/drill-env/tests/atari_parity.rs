//! Replays the Atari fixtures recorded from ale-py 0.12.1 + Gymnasium's AtariPreprocessing and
//! FrameStackObservation (`scripts/record_atari_fixtures.py`): the same actions must give
//! identical rewards and flags, and frames equal pixel for pixel (at most 1 grey level apart
//! on at most 0.1 % of pixels). Needs `--features atari` and ROMs (`ALE_ROM_DIR`).
#![cfg(feature = "atari")]

use std::path::Path;

use drill_env::atari::AtariOptions;
use drill_env::{Action, Env, make_atari};

struct Fixture {
    obs: Vec<u8>,
    actions: Vec<i64>,
    rewards: Vec<f64>,
    terminated: Vec<bool>,
    truncated: Vec<bool>,
}

fn load(path: &Path) -> Fixture {
    let mut npz =
        npyz::npz::NpzArchive::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    macro_rules! arr {
        ($name:literal) => {
            npz.by_name($name)
                .unwrap()
                .unwrap_or_else(|| panic!("{}: no {}", path.display(), $name))
                .into_vec()
                .unwrap()
        };
    }
    Fixture {
        obs: arr!("obs"),
        actions: arr!("actions"),
        rewards: arr!("rewards"),
        terminated: arr!("terminated"),
        truncated: arr!("truncated"),
    }
}

/// Gymnasium's AtariPreprocessing(noop_max=0) + FrameStackObservation(4): no episodic life,
/// no fire reset, raw rewards.
fn gymnasium_chain() -> AtariOptions {
    AtariOptions {
        noop_max: 0,
        episode_life: false,
        fire_reset: false,
        clip_rewards: false,
        ..AtariOptions::default()
    }
}

/// Pixels of `got` more than 1 grey level from `want`, and those exactly 1 apart.
fn diff(got: &[u8], want: &[u8]) -> (usize, usize) {
    let mut far = 0;
    let mut one = 0;
    for (g, w) in got.iter().zip(want) {
        match g.abs_diff(*w) {
            0 => {}
            1 => one += 1,
            _ => far += 1,
        }
    }
    (far, one)
}

fn replay(id: &str, file: &str, seed: u64) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/atari");
    let f = load(&dir.join(file));
    let mut env = make_atari(id, &gymnasium_chain()).unwrap_or_else(|e| panic!("{e}"));
    let d = env.spec().obs_dim();
    assert_eq!(d, 4 * 84 * 84);
    assert_eq!(f.obs.len(), (f.actions.len() + 1) * d);
    let mut obs = vec![0u8; d];
    env.reset(Some(seed), &mut obs);
    let (mut far, mut one) = diff(&obs, &f.obs[..d]);
    let mut ends = 0;
    for (t, &a) in f.actions.iter().enumerate() {
        let step = env.step(Action::Discrete(a as usize), &mut obs);
        assert_eq!(step.reward, f.rewards[t], "{id} step {t}: reward");
        assert_eq!(
            step.terminated, f.terminated[t],
            "{id} step {t}: terminated"
        );
        assert_eq!(step.truncated, f.truncated[t], "{id} step {t}: truncated");
        if step.done() {
            ends += 1;
            env.reset(None, &mut obs);
        }
        let (x, o) = diff(&obs, &f.obs[(t + 1) * d..(t + 2) * d]);
        assert_eq!(
            x, 0,
            "{id} step {t}: {x} pixels more than 1 grey level apart"
        );
        far += x;
        one += o;
    }
    let pixels = f.obs.len();
    assert_eq!(far, 0);
    assert!(
        one * 1000 <= pixels,
        "{id}: {one} of {pixels} pixels 1 grey level apart (more than 0.1 %)"
    );
    eprintln!(
        "{id}: {} steps, {ends} episode ends, {one} of {pixels} pixels 1 apart",
        f.actions.len()
    );
}

#[test]
fn pong_matches_ale_py_and_gymnasium() {
    replay("PongNoFrameskip-v4", "Pong_seed0.npz", 0);
}

#[test]
fn space_invaders_matches_ale_py_and_gymnasium_across_game_overs() {
    replay("SpaceInvadersNoFrameskip-v4", "SpaceInvaders_seed1.npz", 1);
}

#[test]
fn breakout_matches_ale_py_and_gymnasium_across_game_overs() {
    replay("BreakoutNoFrameskip-v4", "Breakout_seed2.npz", 2);
}
