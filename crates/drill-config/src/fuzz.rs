//! Configs are input from anywhere: every config in `configs/`, mutated byte by byte and value
//! by value, and `--set` overrides, must parse or fail with a [`crate::ConfigError`], never
//! panic ([`drill_fuzz`]). What the parsed config then drives (env construction, buffers) is
//! bounded by the validation this exercises.

use crate::Config;

#[global_allocator]
static ALLOC: drill_fuzz::CountingAlloc = drill_fuzz::CountingAlloc;

/// TOML values and keys that probe validation: zeros, negatives, huge and non-finite numbers,
/// wrong types, empty and nested collections.
const DICT: &[&str] = &[
    "0",
    "-1",
    "1",
    "2",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "1e308",
    "-1e308",
    "nan",
    "inf",
    "-inf",
    "0.0",
    "1e-320",
    "true",
    "false",
    "\"\"",
    "\"x\"",
    "[]",
    "[0]",
    "[1, 2]",
    "[[]]",
    "{}",
    "{ a = 1 }",
    "\"ppo\"",
    "\"appo\"",
    "\"dqn\"",
    "\"sac\"",
    "\"bf16\"",
    "\"PongNoFrameskip-v4\"",
    "\"gymnasium:CartPole-v1\"",
    "\"CartPole-v0\"",
    "[policy.model]",
    "[env]",
    "[task]",
    "obs_shape",
    "batch_size",
    "collector_env_num",
    "\n",
    "=",
    ".",
];

fn seeds() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 10, "the configs in {}", dir.display());
    seeds
}

#[test]
fn config_files() {
    drill_fuzz::fuzz_with("config file", &seeds(), DICT, |b| {
        let _ = Config::parse(&String::from_utf8_lossy(b), "fuzz.toml", &[]);
    });
}

#[test]
fn config_overrides() {
    let base = String::from_utf8(seeds().remove(0)).unwrap();
    let overrides: Vec<Vec<u8>> = [
        "policy.learn.batch_size=128",
        "env.collector_env_num=4",
        "policy.model.obs_shape=[4, 84, 84]",
        "seed=3",
        "env.id=\"CartPole-v1\"",
        "policy.eval.evaluator.eval_freq=20",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    drill_fuzz::fuzz_with("config override", &overrides, DICT, |b| {
        let arg = String::from_utf8_lossy(b).into_owned();
        let _ = Config::parse(&base, "fuzz.toml", &[arg]);
    });
}
