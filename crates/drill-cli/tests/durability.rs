//! A full disk during a run: the experiment folder on a small tmpfs that fills up while
//! checkpoints are written. The run stops by itself with exit code 1 and an error naming the
//! checkpoint's path and the bytes it needed; every checkpoint left on disk loads; no
//! temporary file is left; `result.json` says why. Needs root (it mounts the tmpfs and
//! unmounts it, also when it fails): `cargo test --release -p drill-cli --features netns
//! --test durability`.
#![cfg(feature = "netns")]

use std::time::{Duration, Instant};

mod common;

use common::{Tmpfs, drill, repo, text};

#[test]
fn a_full_disk_stops_the_run_naming_the_checkpoint_and_keeps_the_previous_one() {
    let tmp = std::env::temp_dir().join(format!("drill-full-disk-{}", std::process::id()));
    let disk = Tmpfs::mount(&tmp, 1500);
    let exp = tmp.join("run");
    // CartPole DQN's checkpoints are 545 kB each: `best` and `latest` fit, a third does not.
    let start = Instant::now();
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn.toml"))
        .args(["--quiet", "--threads", "1", "--exp-dir"])
        .arg(&exp)
        .args(["--set", "policy.eval.evaluator.eval_freq=20"])
        .args([
            "--set",
            "env.stop_value=1000",
            "--set",
            "max_env_step=20000",
        ])
        .output()
        .unwrap();
    let log = text(&out);
    assert!(start.elapsed() < Duration::from_secs(60), "{log}");
    assert_eq!(out.status.code(), Some(1), "{log}");
    let ckpt = exp.join("ckpt");
    assert!(
        log.contains(&format!("checkpoint {}/", ckpt.display()))
            && log.contains("no space left on the device for 545"),
        "the error names the file and the bytes: {log}"
    );
    let mut loaded = 0;
    for entry in std::fs::read_dir(&ckpt).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.ends_with(".safetensors") && !name.starts_with('.'),
            "left behind: {name}"
        );
        let ck = drill_exp::Checkpoint::load(&path).unwrap();
        ck.counter("train_iters").unwrap();
        loaded += 1;
    }
    assert!(
        loaded >= 1,
        "the checkpoints written before the disk filled stay"
    );
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(exp.join("result.json")).unwrap()).unwrap();
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("no space left"), "{result}");
    assert!(result["env_steps"].as_u64().unwrap() > 0, "{result}");
    // Every line of the metrics log is whole.
    let metrics = std::fs::read_to_string(exp.join("metrics.jsonl")).unwrap();
    for line in metrics.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    eprintln!("{log}");
    drop(disk);
}
