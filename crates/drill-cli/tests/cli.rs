//! End-to-end tests of the `drill` binary: real training runs in temporary folders.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn drill(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("drill runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn result(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap()
}

#[test]
fn di_engine_cartpole_dqn_config_reaches_its_stop_value() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/cartpole_dqn.toml");
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--seed",
            "0",
            "--exp-dir",
            "run",
            "--quiet",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let dir = tmp.path().join("run");
    let r = result(&dir);
    assert_eq!(r["stop_reached"], true, "{r}");
    assert!(r["eval_reward_mean"].as_f64().unwrap() >= 195.0);
    assert_eq!(r["eval_episodes"], 5);
    assert_eq!(r["world_size"], 1);
    assert_eq!(r["restarts"], 0);
    for key in [
        "env_steps",
        "train_iters",
        "wall_seconds",
        "env_steps_per_sec",
        "eval_reward_std",
    ] {
        assert!(r[key].as_f64().unwrap() >= 0.0, "{key} in {r}");
    }
    // The folder: resolved config, checkpoints, TensorBoard events, metrics.
    let resolved = std::fs::read_to_string(dir.join("config.toml")).unwrap();
    assert!(
        resolved.contains("replay_buffer_size = 20000") && resolved.contains("learning_starts = 0"),
        "{resolved}"
    );
    for ck in ["final", "best", "latest"] {
        assert!(
            dir.join(format!("ckpt/{ck}.safetensors")).is_file(),
            "{ck} checkpoint"
        );
    }
    let tb = std::fs::read_dir(dir.join("tb"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let scalars = drill_exp::read_scalars(&tb).unwrap();
    assert!(
        scalars
            .iter()
            .any(|(t, _, v)| t == "eval/episodic_return_mean" && *v >= 195.0)
    );
    assert!(
        std::fs::read_to_string(dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .count()
            > 10
    );

    // The checkpoint evaluates to a good policy.
    let ck = dir.join("ckpt/final.safetensors");
    let cfg = dir.join("config.toml");
    let out = drill(
        &[
            "eval",
            ck.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            "--episodes",
            "10",
            "--json",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["eval_episodes"], 10);
    assert!(e["eval_reward_mean"].as_f64().unwrap() > 150.0, "{e}");

    // A second run with the same folder never overwrites the first.
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "run",
            "--quiet",
            "--set",
            "max_env_step=100",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(tmp.path().join("run_2/result.json").is_file());
    assert_eq!(result(&dir), r);

    // Resuming restores the counters.
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "resumed",
            "--quiet",
            "--resume",
            ck.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let resumed = result(&tmp.path().join("resumed"));
    assert!(
        resumed["train_iters"].as_u64() >= r["train_iters"].as_u64(),
        "{resumed}"
    );

    // The plot is a PNG.
    let out = drill(&["plot", "run", "run_2", "-o", "curve.png"], tmp.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        &std::fs::read(tmp.path().join("curve.png")).unwrap()[1..4],
        b"PNG"
    );
}

#[test]
fn ppo_learns_cartpole_v1_and_runs_continuous_pendulum() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/cartpole_v1_ppo.toml");
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "ppo",
            "--quiet",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r = result(&tmp.path().join("ppo"));
    assert_eq!(r["stop_reached"], true, "{r}");
    assert_eq!(r["eval_episodes"], 100);

    let config = repo().join("configs/pendulum_ppo.toml");
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "pend",
            "--quiet",
            "--set",
            "max_env_step=4096",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r = result(&tmp.path().join("pend"));
    assert!(r["env_steps"].as_u64().unwrap() >= 4096);
    assert!(
        r["eval_reward_mean"].as_f64().unwrap() < 0.0,
        "Pendulum returns are negative: {r}"
    );
}

#[test]
fn sac_reaches_pendulum_s_stop_value_within_20k_env_steps_and_evaluates() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/pendulum_sac.toml");
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "sac",
            "--quiet",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let r = result(&tmp.path().join("sac"));
    assert_eq!(r["stop_reached"], true, "{r}");
    assert!(r["env_steps"].as_u64().unwrap() <= 20_000, "{r}");
    assert!(r["eval_reward_mean"].as_f64().unwrap() >= -200.0, "{r}");
    let best = tmp.path().join("sac/ckpt/best.safetensors");
    let out = drill(
        &[
            "eval",
            best.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--episodes",
            "10",
            "--json",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let eval: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(eval["eval_episodes"], 10);
    assert!(
        eval["eval_reward_mean"].as_f64().unwrap() >= -400.0,
        "{eval}"
    );

    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "cartpole",
            "--set",
            "env.id=CartPole-v1",
        ],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("`policy.type`") && err.contains("SAC needs continuous actions"),
        "{err}"
    );
}

#[test]
fn bad_configs_fail_before_training_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/cartpole_dqn.toml");
    let c = config.to_str().unwrap();
    let out = drill(
        &[
            "train",
            c,
            "--set",
            "policy.learn.batchsize=3",
            "--exp-dir",
            "x",
        ],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(
            "unknown key `policy.learn.batchsize` (did you mean `policy.learn.batch_size`?)"
        ),
        "{}",
        stderr(&out)
    );
    assert!(
        !tmp.path().join("x").exists(),
        "nothing written for a rejected config"
    );
    let out = drill(&["train", c, "--set", "env.id=CartPole-v9"], tmp.path());
    assert!(
        stderr(&out).contains("bad value for `env.id`: unknown environment id \"CartPole-v9\""),
        "{}",
        stderr(&out)
    );
    let out = drill(
        &["train", c, "--set", "policy.model.obs_shape=5"],
        tmp.path(),
    );
    assert!(
        stderr(&out).contains("bad value for `policy.model.obs_shape`: is 5 but CartPole-v0 has 4"),
        "{}",
        stderr(&out)
    );
    let out = drill(&["train", c, "--set", "env.id=Pendulum-v1"], tmp.path());
    assert!(
        stderr(&out).contains("DQN needs discrete actions"),
        "{}",
        stderr(&out)
    );
    let out = drill(&["train", c, "--set", "policy.cuda=true"], tmp.path());
    if !cfg!(feature = "cuda") && !cfg!(feature = "gpu") {
        assert!(
            stderr(&out).contains("bad value for `policy.cuda`")
                && stderr(&out).contains("--features gpu"),
            "{}",
            stderr(&out)
        );
    }
    let out = drill(&["train", "missing.toml"], tmp.path());
    assert!(
        stderr(&out).contains("cannot read config missing.toml"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_diverging_loss_stops_with_the_iteration_and_keeps_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/cartpole_dqn.toml");
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "nan",
            "--quiet",
            "--set",
            "policy.learn.learning_rate=1e30",
        ],
        tmp.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("non-finite loss") && err.contains("at train iteration"),
        "{err}"
    );
    let best = tmp.path().join("nan/ckpt/best.safetensors");
    assert!(
        best.is_file(),
        "the checkpoint from before the divergence stays"
    );
    assert!(!tmp.path().join("nan/ckpt/final.safetensors").exists());
}

/// `policy.cuda = true` in a `--features gpu` build trains on the Vulkan device (in CI,
/// Mesa's lavapipe): a short CartPole DQN run that updates and evaluates, logging the adapter.
/// (On lavapipe it reached the stop value, 198.4, in 1272 env steps and 31 s.)
#[cfg(feature = "gpu")]
#[test]
fn policy_cuda_trains_cartpole_on_the_vulkan_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/cartpole_dqn.toml");
    let out = drill(
        &[
            "train",
            config.to_str().unwrap(),
            "--exp-dir",
            "gpu",
            "--set",
            "policy.cuda=true",
            "--set",
            "max_env_step=1500",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(wgpu/Vulkan, adapter 0 of"),
        "{}",
        stderr(&out)
    );
    let r = result(&tmp.path().join("gpu"));
    // It stops at 1500 env steps or at the stop value, whichever comes first.
    assert!(
        r["env_steps"].as_u64().unwrap() >= 1500 || r["stop_reached"] == true,
        "{r}"
    );
    assert!(r["train_iters"].as_u64().unwrap() > 0, "{r}");
    assert!(r["eval_episodes"].as_u64().unwrap() > 0, "{r}");
}

#[test]
fn export_writes_the_online_network_under_di_engines_names_with_a_probe() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = repo()
        .join("configs/cartpole_dqn.toml")
        .display()
        .to_string();
    let out = drill(
        &[
            "train",
            &cfg,
            "--quiet",
            "--exp-dir",
            "ex",
            "--set",
            "max_env_step=500",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let out = drill(
        &[
            "export",
            "ex/ckpt/final.safetensors",
            "-o",
            "dqn.safetensors",
            "--probe",
            "8",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let ck = drill_exp::Checkpoint::load(&tmp.path().join("dqn.safetensors")).unwrap();
    let names: Vec<&str> = ck.tensors.keys().map(String::as_str).collect();
    assert!(names.contains(&"encoder.init.weight") && names.contains(&"head.V.1.0.bias"));
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with("target") && !n.contains("optim"))
    );
    let probe = drill_exp::Checkpoint::load(&tmp.path().join("dqn.probe.safetensors")).unwrap();
    assert_eq!(probe.tensors["obs"].0, [8, 4]);
    assert_eq!(probe.tensors["q"].0, [8, 2]);
    let out = drill(
        &[
            "export",
            "ex/ckpt/final.safetensors",
            "-o",
            "m.onnx",
            "--format",
            "onnx",
        ],
        tmp.path(),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("drill does not write ONNX"),
        "{}",
        stderr(&out)
    );
}

/// Threads follow the work: a small MLP trains on one by default, `--threads` overrides;
/// `policy.precision` takes f32 or bf16, and bf16 is refused on the GPU, naming the key.
#[test]
fn threads_follow_the_net_and_precision_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let config = repo().join("configs/cartpole_dqn.toml");
    let config = config.to_str().unwrap();
    let short = ["--set", "max_env_step=300", "--quiet"];
    let run = |extra: &[&str], dir: &str| {
        let mut args = vec!["train", config, "--exp-dir", dir];
        args.extend(short);
        args.extend(extra);
        let mut c = Command::new(env!("CARGO_BIN_EXE_drill"));
        c.args(&args)
            .current_dir(tmp.path())
            .env_remove("DRILL_THREADS");
        c.output().unwrap()
    };
    let out = run(&[], "one");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(rank 0 of 1, 1 thread)"),
        "{}",
        stderr(&out)
    );
    let out = run(&["--threads", "2"], "two");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(rank 0 of 1, 2 threads)"),
        "{}",
        stderr(&out)
    );
    let out = run(&["--set", "policy.precision=\"bf16\""], "bf16");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("bf16 products ("), "{}", stderr(&out));
    let out = run(&["--set", "policy.precision=\"fp8\""], "fp8");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("policy.precision"),
        "{}",
        stderr(&out)
    );
    let out = run(
        &[
            "--set",
            "policy.precision=\"bf16\"",
            "--set",
            "policy.cuda=true",
        ],
        "gpu",
    );
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("`policy.precision`: is \"bf16\""), "{e}");
    assert!(!tmp.path().join("gpu").exists() && !tmp.path().join("fp8").exists());
}

/// A reader that closed its end of the pipe (`drill env list | head -1`) ends the command
/// quietly with exit code 0; `bench comm` refuses a size under one element per rank.
#[test]
fn a_closed_pipe_ends_quietly_and_bench_comm_refuses_empty_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_drill"))
        .args(["env", "list"])
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "", "nothing on stderr");

    let out = drill(&["bench", "comm", "--sizes", "1K,1"], tmp.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("--sizes: 1 bytes is under one f32 element per rank (4 bytes"),
        "{}",
        stderr(&out)
    );
    let out = drill(&["bench", "comm", "--sizes", "99999999999999G"], tmp.path());
    assert!(stderr(&out).contains("is not a size"), "{}", stderr(&out));
}

/// `bench learner --case nature-cnn-products` ends with the update's accounting: the Adam
/// step alone, and a floor that is the products' time alone plus that step, with the share of
/// the measured FMA peak that the update's work in that time would be. (Consistency, not
/// speed: the rows are timed at different moments, so no bound on the share itself.)
#[test]
fn the_products_bench_adds_the_adam_step_to_the_products_alone_for_the_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let args = "--threads 1 bench learner --case nature-cnn-products --iters 1 --json";
    let out = drill(&args.split(' ').collect::<Vec<_>>(), tmp.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let row = |case: &str| {
        let r = rows.iter().find(|r| r["case"] == case);
        r.unwrap_or_else(|| panic!("no {case} row in {stdout}"))
    };
    // The number just before `unit` after `after` in `note`.
    let number = |note: &str, after: &str, unit: &str| -> f64 {
        let rest = &note[note
            .find(after)
            .unwrap_or_else(|| panic!("{after}: {note}"))
            + after.len()..];
        rest[..rest.find(unit).unwrap()].trim().parse().unwrap()
    };
    let adam_us = row("adam-step")["median_us"].as_f64().unwrap();
    let floor = row("update-floor");
    let (floor_us, floor_note) = (
        floor["median_us"].as_f64().unwrap(),
        floor["note"].as_str().unwrap(),
    );
    let products_alone_ms = number(
        row("products")["note"].as_str().unwrap(),
        "alone (operands hot):",
        " ms",
    );
    assert!(adam_us > 0.0 && products_alone_ms > 0.0, "{stdout}");
    // The note gives the products to 0.1 ms.
    let parts_us = products_alone_ms * 1e3 + adam_us;
    assert!(
        (floor_us - parts_us).abs() <= 60.0,
        "{floor_us} vs {parts_us}: {stdout}"
    );
    let share = number(floor_note, "could reach", "%");
    let gflop = number(floor_note, "FMA peak (", "GFLOP");
    let peak = row("fma-peak")["median_GFLOP/s"].as_f64().unwrap();
    let want = 100.0 * gflop / (floor_us * 1e-6) / peak;
    // The note rounds the work to 0.01 GFLOP and the share to 0.1 %.
    assert!(
        share > 0.0 && (share - want).abs() <= 0.01 * want + 0.1,
        "{share} % vs {want} %: {floor_note}"
    );
}
