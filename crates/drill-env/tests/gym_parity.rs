//! Replays trajectories recorded from Gymnasium (scripts/record_gym_fixtures.py) and checks that
//! drill's environments produce the same observations, rewards, flags and states to 1e-6.

use drill_env::{Action, make};
use serde_json::Value;

const TOL: f64 = 1e-6;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOL * (1.0 + b.abs())
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

#[test]
fn classic_control_matches_gymnasium() {
    let text = include_str!("fixtures/gym_classic.json");
    let fixtures: Value = serde_json::from_str(text).unwrap();
    let envs = fixtures["envs"].as_object().unwrap();
    assert_eq!(envs.len(), 5, "fixtures for all five environments");
    let mut checked = 0;
    for (id, episodes) in envs {
        let mut env = make(id).unwrap();
        let mut obs = vec![0f32; env.spec().obs_dim()];
        for (e, ep) in episodes.as_array().unwrap().iter().enumerate() {
            env.reset(Some(0), &mut obs);
            env.set_state(&floats(&ep["initial_state"]), &mut obs);
            for (o, want) in obs.iter().zip(floats(&ep["initial_obs"])) {
                assert!(
                    close(*o as f64, want),
                    "{id} ep {e}: initial obs {o} vs {want}"
                );
            }
            for (t, step) in ep["steps"].as_array().unwrap().iter().enumerate() {
                let a = floats(&step["action"]);
                let a32: Vec<f32> = a.iter().map(|&x| x as f32).collect();
                let action = if env.spec().action_space.is_discrete() {
                    Action::Discrete(a[0] as usize)
                } else {
                    Action::Continuous(&a32)
                };
                let got = env.step(action, &mut obs);
                let ctx = format!("{id} episode {e} step {t}");
                for (o, want) in obs.iter().zip(floats(&step["obs"])) {
                    assert!(close(*o as f64, want), "{ctx}: obs {o} vs {want}");
                }
                for (s, want) in env.state().iter().zip(floats(&step["state"])) {
                    assert!(close(*s, want), "{ctx}: state {s} vs {want}");
                }
                let want_r = step["reward"].as_f64().unwrap();
                assert!(
                    close(got.reward, want_r),
                    "{ctx}: reward {} vs {want_r}",
                    got.reward
                );
                assert_eq!(
                    got.terminated,
                    step["terminated"].as_bool().unwrap(),
                    "{ctx}: terminated"
                );
                assert_eq!(
                    got.truncated,
                    step["truncated"].as_bool().unwrap(),
                    "{ctx}: truncated"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 4000, "replayed {checked} steps");
}
