//! The Atari wrapper chain and vector env (needs `--features atari` and ROMs in
//! `ALE_ROM_DIR`): episodic life, fire reset, reward clipping, noop resets, the vector env
//! against single envs, and the error for a missing ROM.
#![cfg(feature = "atari")]

use drill_env::atari::AtariOptions;
use drill_env::{Action, Actions, Env, EnvError, make_atari, make_vec_with};

fn rng_actions(n: usize, k: usize, seed: u64) -> Vec<usize> {
    // A small LCG: the same actions on every run, no extra dependency.
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as usize) % k
        })
        .collect()
}

#[test]
fn episodic_life_ends_an_episode_per_life_and_continues_the_game() {
    // Breakout: 5 lives. Training chain: every lost life is a terminated episode, the game
    // goes on (lives keep falling), and only the last life restarts the game.
    let mut env = make_atari("BreakoutNoFrameskip-v4", &AtariOptions::default()).unwrap();
    let mut obs = vec![0u8; env.spec().obs_dim()];
    env.reset(Some(3), &mut obs);
    let acts = rng_actions(20_000, 4, 3);
    let mut ends = 0;
    let mut rewards = Vec::new();
    for &a in &acts {
        let s = env.step(Action::Discrete(a), &mut obs);
        rewards.push(s.reward);
        if s.done() {
            assert!(s.terminated && !s.truncated);
            ends += 1;
            env.reset(None, &mut obs);
            if ends == 6 {
                break;
            }
        }
    }
    assert_eq!(ends, 6, "five lives, then a new game's first life");
    assert!(rewards.iter().all(|r| [0.0, 1.0].contains(r)), "clipped");

    // Evaluation chain: one episode is the whole game (5 lives), rewards unclipped.
    let mut env = make_atari("BreakoutNoFrameskip-v4", &AtariOptions::default().eval()).unwrap();
    env.reset(Some(3), &mut obs);
    let mut steps_whole = 0;
    for &a in &acts {
        steps_whole += 1;
        if env.step(Action::Discrete(a), &mut obs).done() {
            break;
        }
    }
    assert!(
        steps_whole > 100,
        "a whole game lasts ({steps_whole} steps)"
    );
}

#[test]
fn fire_reset_starts_breakout_and_noop_resets_vary_the_start() {
    // Without FIRE after reset Breakout waits; with fire reset the ball is in play, so the
    // first NOOP steps already change the screen.
    let opts = AtariOptions {
        noop_max: 0,
        ..AtariOptions::default()
    };
    let mut env = make_atari("BreakoutNoFrameskip-v4", &opts).unwrap();
    let d = env.spec().obs_dim();
    let mut obs = vec![0u8; d];
    env.reset(Some(0), &mut obs);
    let first = obs.clone();
    for _ in 0..10 {
        env.step(Action::Discrete(0), &mut obs);
    }
    assert_ne!(
        first[3 * d / 4..],
        obs[3 * d / 4..],
        "the ball moves after fire reset"
    );

    // Noop resets: different seeds start at different frames.
    let mut starts = Vec::new();
    for seed in 0..4 {
        let mut env = make_atari("PongNoFrameskip-v4", &AtariOptions::default()).unwrap();
        env.reset(Some(seed), &mut obs);
        starts.push(obs.clone());
    }
    starts.sort();
    starts.dedup();
    assert!(starts.len() > 1, "noop resets vary the first frame");
}

#[test]
fn the_vector_env_equals_single_envs_on_any_thread_count() {
    let opts = AtariOptions::default();
    let (n, steps) = (3, 300);
    let acts = rng_actions(n * steps, 6, 9);
    let mut singles: Vec<_> = (0..n)
        .map(|_| make_atari("PongNoFrameskip-v4", &opts).unwrap())
        .collect();
    let d = singles[0].spec().obs_dim();
    let mut want_obs = vec![0u8; n * d];
    for (i, e) in singles.iter_mut().enumerate() {
        e.reset(Some(5 + i as u64), &mut want_obs[i * d..(i + 1) * d]);
    }
    let mut vecs: Vec<_> = [1, 2]
        .iter()
        .map(|&t| make_vec_with("PongNoFrameskip-v4", n, 5, t, &opts).unwrap())
        .collect();
    for v in &mut vecs {
        assert_eq!(v.reset(None).unwrap().len(), n * d);
        assert!(v.obs() == drill_env::Obs::U8(&want_obs));
    }
    for t in 0..steps {
        let a = &acts[t * n..(t + 1) * n];
        let mut rewards = vec![0f32; n];
        let mut finals = want_obs.clone();
        for (i, e) in singles.iter_mut().enumerate() {
            let o = &mut want_obs[i * d..(i + 1) * d];
            let s = e.step(Action::Discrete(a[i]), o);
            rewards[i] = s.reward as f32;
            finals[i * d..(i + 1) * d].copy_from_slice(o);
            if s.done() {
                e.reset(None, o);
            }
        }
        let a32: Vec<u32> = a.iter().map(|&x| x as u32).collect();
        for v in &mut vecs {
            v.step(Actions::Discrete(&a32)).unwrap();
            assert_eq!(v.rewards(), &rewards[..], "step {t}");
            assert!(v.obs() == drill_env::Obs::U8(&want_obs), "step {t}: obs");
            assert!(
                v.final_obs() == drill_env::Obs::U8(&finals),
                "step {t}: final obs"
            );
        }
    }
}

#[test]
fn a_missing_rom_says_where_it_looked_and_how_to_get_roms() {
    let found = drill_env::atari::roms::find("pong");
    assert!(found.1.is_some(), "this test needs ROMs (ALE_ROM_DIR)");
    let err = drill_env::atari_rom("ALE/Tetris-v5", "no_such_game").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, EnvError::RomMissing { .. }));
    for want in [
        "ALE/Tetris-v5",
        "no_such_game.bin",
        "pip install ale-py",
        "ALE_ROM_DIR",
    ] {
        assert!(text.contains(want), "{want:?} missing from: {text}");
    }
}

#[test]
fn the_full_action_space_has_all_18_actions() {
    let minimal = make_atari("PongNoFrameskip-v4", &AtariOptions::default()).unwrap();
    assert_eq!(minimal.action_set(), &[0, 1, 3, 4, 11, 12]);
    let full = AtariOptions {
        full_action_space: true,
        ..AtariOptions::default()
    };
    let env = make_atari("ALE/Pong-v5", &full).unwrap();
    assert_eq!(
        env.spec().action_space,
        drill_env::ActionSpace::Discrete(18)
    );
    assert_eq!(env.action_set(), (0..18).collect::<Vec<i32>>());
}
