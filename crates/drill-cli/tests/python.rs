//! Gymnasium environments through drill's Python bridge (feature `python`; run with
//! `VIRTUAL_ENV` set to a virtualenv with gymnasium, as `.ci/run` does): a registered id
//! trains to its stop value alone and with two DDP ranks, an env of one's own comes in
//! through `env.entry_point` (sync and async copies), and an exception or an unsupported
//! space stops the run with the traceback and the id, never a panic.
#![cfg(feature = "python")]

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

use common::{drill, repo, result, text};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python")
}

/// `drill train ARGS` in `cwd` with the test envs importable.
fn train(args: &[&str], cwd: &Path) -> Output {
    assert!(
        std::env::var_os("VIRTUAL_ENV").is_some(),
        "set VIRTUAL_ENV to a virtualenv with gymnasium (python3 -m venv V && V/bin/pip install gymnasium)"
    );
    drill()
        .arg("train")
        .args(args)
        .current_dir(cwd)
        .env("PYTHONPATH", fixtures())
        .output()
        .unwrap()
}

fn config(name: &str) -> String {
    repo().join("configs").join(name).display().to_string()
}

/// `--set` pairs for the corridor of `drill_test_envs.py` under `class`.
fn corridor(class: &str) -> Vec<String> {
    [
        "env.id=\"gymnasium:Corridor-v0\"".to_string(),
        format!("env.entry_point=\"drill_test_envs:{class}\""),
        "env.kwargs={length = 4}".into(),
        "env.stop_value=0.95".into(),
        "env.n_evaluator_episode=4".into(),
        "env.evaluator_env_num=2".into(),
        "max_env_step=20000".into(),
    ]
    .into_iter()
    .flat_map(|s| ["--set".to_string(), s])
    .collect()
}

#[test]
fn a_registered_gymnasium_id_trains_to_the_stop_value_with_drill_python() {
    // The packages found through DRILL_PYTHON (an interpreter) rather than VIRTUAL_ENV.
    let venv = std::env::var_os("VIRTUAL_ENV").expect("VIRTUAL_ENV set (see train)");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn.toml");
    let out = drill()
        .args(["train", &cfg, "--quiet", "--exp-dir", "gym"])
        .args(["--set", "env.id=\"gymnasium:CartPole-v0\""])
        .current_dir(tmp.path())
        .env_remove("VIRTUAL_ENV")
        .env("DRILL_PYTHON", Path::new(&venv).join("bin/python"))
        .output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = result(&tmp.path().join("gym"));
    assert_eq!(r["stop_reached"], true, "{r}");
}

#[test]
fn two_ddp_ranks_each_run_their_own_interpreter() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn_ddp.toml");
    let out = train(
        &[
            &cfg,
            "--nproc-per-node",
            "2",
            "--quiet",
            "--exp-dir",
            "ddp",
            "--set",
            "env.id=\"gymnasium:CartPole-v0\"",
        ],
        tmp.path(),
    );
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = result(&tmp.path().join("ddp"));
    assert_eq!(
        (r["stop_reached"].clone(), r["world_size"].clone()),
        (true.into(), 2.into()),
        "{r}"
    );
}

#[test]
fn an_env_of_ones_own_comes_in_through_its_entry_point_sync_and_async() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn.toml");
    for mode in ["sync", "async"] {
        let mut args = vec![
            cfg.clone(),
            "--quiet".into(),
            "--exp-dir".into(),
            mode.into(),
        ];
        args.extend(corridor("Corridor"));
        args.extend(["--set".into(), format!("env.vectorization=\"{mode}\"")]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = train(&args, tmp.path());
        let log = text(&out);
        assert!(out.status.success(), "{mode}: {log}");
        let r = result(&tmp.path().join(mode));
        assert_eq!(r["stop_reached"], true, "{mode}: {r}");
    }
}

#[test]
fn a_python_exception_stops_the_run_with_its_traceback_and_the_id() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn.toml");
    let mut args = vec![cfg, "--quiet".into()];
    args.extend(corridor("Raises"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = train(&args, tmp.path());
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    for want in [
        "gymnasium:Corridor-v0: Python raised:",
        "Traceback (most recent call last):",
        "drill_test_envs.py",
        "RuntimeError: the simulator broke after 30 steps",
    ] {
        assert!(log.contains(want), "{want:?} not in:\n{log}");
    }
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn a_space_drill_cannot_hold_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn.toml");
    let mut args = vec![cfg, "--quiet".into()];
    args.extend(corridor("DictObs"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = train(&args, tmp.path());
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("gymnasium:Corridor-v0: its observation space is Dict"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn native_and_gymnasium_cartpole_learn_step_for_step_alike() {
    // drill's CartPole is Gymnasium's (dynamics to 1e-6, numpy's PCG64 for the resets), so
    // one config and seed give the same run: env steps, iterations and evaluations.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn.toml");
    for seed in ["0", "1"] {
        let run = |dir: &str, extra: &[&str]| {
            let args = [
                &[&cfg[..], "--quiet", "--seed", seed, "--exp-dir", dir][..],
                extra,
            ]
            .concat();
            let out = train(&args, tmp.path());
            assert!(out.status.success(), "{}", text(&out));
            let r = result(&tmp.path().join(dir));
            (
                r["env_steps"].clone(),
                r["train_iters"].clone(),
                r["eval_reward_mean"].clone(),
            )
        };
        let native = run(&format!("native{seed}"), &[]);
        let gym = run(
            &format!("gym{seed}"),
            &["--set", "env.id=\"gymnasium:CartPole-v0\""],
        );
        assert_eq!(native, gym, "seed {seed}");
    }
}

#[test]
fn the_parallel_runner_and_ppo_take_gymnasium_ids_too() {
    let tmp = tempfile::tempdir().unwrap();
    let gym = ["--set", "env.id=\"gymnasium:CartPole-v0\""];
    let dist = config("cartpole_dqn_dist.toml");
    let out = train(
        &[
            &[
                &dist[..],
                "--parallel-workers",
                "2",
                "--quiet",
                "--exp-dir",
                "dist",
            ][..],
            &gym,
        ]
        .concat(),
        tmp.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(result(&tmp.path().join("dist"))["stop_reached"], true);
    let ppo = config("cartpole_v1_ppo.toml");
    let out = train(
        &[
            &ppo,
            "--quiet",
            "--exp-dir",
            "ppo",
            "--set",
            "env.id=\"gymnasium:CartPole-v1\"",
            "--set",
            "max_env_step=4096",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(result(&tmp.path().join("ppo"))["env_steps"], 4096);
}
