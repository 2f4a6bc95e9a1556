//! Everyday use of `drill train`: the folder follows the seed, `--resume EXP_DIR` continues a
//! run in its folder to the same counters as one uninterrupted run, a start that fails (bad
//! resume path or checkpoint, bad key, absurd size, more memory than the machine has,
//! missing ROM, `--save-replay` without a replay buffer) leaves
//! nothing behind, and Ctrl-C (alone or under `--nproc-per-node`) stops after the
//! step with `final` and `result.json` written and the command that continues it said.

use std::path::Path;
use std::process::Output;

mod common;

use common::{drill, repo, result, text};

fn train(args: &[&str], cwd: &Path) -> Output {
    drill()
        .arg("train")
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn config(name: &str) -> String {
    repo().join("configs").join(name).display().to_string()
}

/// The names in `dir`.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_default_folder_follows_the_seed() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_v1_ppo.toml");
    let out = train(
        &[&cfg, "--seed", "1", "--quiet", "--set", "max_env_step=64"],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(entries(tmp.path()), ["cartpole_v1_ppo_seed1"]);
    let out = train(
        &[
            &cfg,
            "--quiet",
            "--set",
            "seed=2",
            "--set",
            "max_env_step=64",
        ],
        tmp.path(),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        entries(tmp.path()),
        ["cartpole_v1_ppo_seed1", "cartpole_v1_ppo_seed2"]
    );
}

#[test]
fn resuming_a_folder_reaches_the_counters_of_one_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_v1_ppo.toml");
    // A run into `exp` up to `limit` env steps (the stop value out of reach).
    let run = |exp: &str, limit: &str| {
        let steps = format!("max_env_step={limit}");
        let args = [&cfg[..], "--exp-dir", exp, "--quiet"];
        let sets = ["--set", "env.stop_value=1000", "--set", &steps];
        let out = train(&[&args[..], &sets].concat(), tmp.path());
        assert!(out.status.success(), "{}", text(&out));
    };
    run("one", "4096");
    run("two", "2048");
    let half = result(&tmp.path().join("two"));
    // The training time the final checkpoint carries, which the resume adds to.
    let final_ck = tmp.path().join("two/ckpt/final.safetensors");
    let ck = drill_exp::Checkpoint::load(&final_ck).unwrap();
    let before: f64 = ck.meta["train_seconds"].parse().unwrap();
    let out = train(
        &["--resume", "two", "--quiet", "--set", "max_env_step=4096"],
        tmp.path(),
    );
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("continuing two from two/ckpt/final.safetensors"),
        "{log}"
    );
    let (one, two) = (
        result(&tmp.path().join("one")),
        result(&tmp.path().join("two")),
    );
    assert!(half["env_steps"].as_u64() < two["env_steps"].as_u64());
    assert_eq!(one["env_steps"], two["env_steps"], "{one}\n{two}");
    assert_eq!(one["train_iters"], two["train_iters"], "{one}\n{two}");
    // A run's total time is its own; a continued run's adds what its checkpoint carried,
    // which is at most the time of the run that wrote it.
    let secs = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap();
    assert_eq!(secs(&one, "total_wall_seconds"), secs(&one, "wall_seconds"));
    assert!(
        before > 0.0 && before <= secs(&half, "wall_seconds"),
        "{before}\n{half}"
    );
    let total = secs(&two, "total_wall_seconds");
    let expected = before + secs(&two, "wall_seconds");
    assert!(
        (total - expected).abs() < 1e-3,
        "{total} vs {expected}\n{two}"
    );
    assert!(log.contains("s with the runs it continues"), "{log}");
    // The override is written down, the metrics of both parts kept, no other folder made.
    let written = std::fs::read_to_string(tmp.path().join("two/config.toml")).unwrap();
    assert!(written.contains("max_env_step = 4096"), "{written}");
    let metrics = std::fs::read_to_string(tmp.path().join("two/metrics.jsonl")).unwrap();
    let first = metrics.lines().next().unwrap();
    assert!(
        metrics.lines().count() > 1 && first.contains("\"step\""),
        "{metrics}"
    );
    // Where the second part begins is marked, with the training time before it.
    let marks: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v["tag"] == "run/resumed")
        .collect();
    assert_eq!(marks.len(), 1, "{metrics}");
    assert_eq!(marks[0]["step"], half["env_steps"], "{metrics}");
    assert_eq!(marks[0]["value"].as_f64(), Some(before), "{metrics}");
    assert_eq!(entries(tmp.path()), ["one", "two"]);
}

#[test]
fn a_start_that_fails_leaves_nothing_behind_and_says_why_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("pendulum_ppo.toml");
    let dqn = config("cartpole_dqn.toml");
    let cases: [(&[&str], &str); 9] = [
        (
            &[&cfg, "--resume", "/no/such/dir"],
            "--resume /no/such/dir: no such experiment folder or checkpoint file",
        ),
        (
            &[&cfg, "--resume", "junk.safetensors"],
            "not a safetensors file",
        ),
        (
            &["--resume", "."],
            "not an experiment folder (it has no config.toml)",
        ),
        (
            &[&cfg, "--set", "policy.learn.batchsize=3"],
            "unknown key `policy.learn.batchsize`",
        ),
        (&["no/such.toml"], "no/such.toml"),
        (
            &[&cfg, "--set", "env.collector_env_num=100000000"],
            "`env.collector_env_num`: must be 1..=65536, got 100000000",
        ),
        (
            &[
                &cfg,
                "--set",
                "policy.model.encoder_hidden_size_list=[65536, 65536, 65536]",
            ],
            "`policy.model.encoder_hidden_size_list`: needs about",
        ),
        (
            &[
                &dqn,
                "--set",
                "policy.other.replay_buffer.replay_buffer_size=10000000000",
            ],
            "`policy.other.replay_buffer.replay_buffer_size`: needs about 640.0 GB",
        ),
        (
            &[&cfg, "--save-replay"],
            "--save-replay: policy.type \"ppo\" keeps no replay buffer",
        ),
    ];
    std::fs::write(tmp.path().join("junk.safetensors"), b"not a checkpoint").unwrap();
    for (args, want) in cases {
        let out = train(args, tmp.path());
        let err = text(&out);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        let first = err.lines().find(|l| l.starts_with("error: ")).unwrap();
        let cause = first.rsplit(": ").next().unwrap();
        assert_eq!(
            first.matches(cause).count(),
            1,
            "{args:?}: the cause is said twice: {first}"
        );
        assert_eq!(entries(tmp.path()), ["junk.safetensors"], "{args:?}");
    }
    // A missing ROM: none where drill looks (no Python on PATH to point at ale-py's), or, in
    // a build without the `atari` feature, no Atari at all.
    let empty = tempfile::tempdir().unwrap();
    let out = drill()
        .args(["train", &config("pong_dqn.toml"), "--quiet"])
        .current_dir(tmp.path())
        .env("ALE_ROM_DIR", empty.path())
        .env_remove("DRILL_ROM_DIR")
        .env_remove("VIRTUAL_ENV")
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let err = text(&out);
    let want = if cfg!(feature = "atari") {
        "no ROM for PongNoFrameskip-v4: pong.bin is in none of"
    } else {
        "this drill was built without Atari"
    };
    assert!(!out.status.success() && err.contains(want), "{err}");
    assert_eq!(entries(tmp.path()), ["junk.safetensors"], "{err}");
}

/// Start `drill train ARGS` in `cwd` with piped output, wait until `exp` has its first
/// checkpoint (training is under way), send SIGINT to it and return its output.
fn interrupt(args: &[&str], cwd: &Path, exp: &str) -> (Output, std::time::Duration) {
    let child = drill()
        .arg("train")
        .args(args)
        .current_dir(cwd)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !cwd.join(exp).join("ckpt/best.safetensors").is_file() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let sent = std::time::Instant::now();
    let out = child.wait_with_output().unwrap();
    (out, sent.elapsed())
}

/// An interrupted run: exit 130, `final` and `result.json` written (`interrupted`), one line
/// saying where it stopped and how to continue (`flags` after the folder); continuing it
/// goes on from there. Returns the continued run's output.
fn check_interrupted(
    out: &Output,
    took: std::time::Duration,
    cwd: &Path,
    exp: &str,
    flags: &str,
) -> String {
    let log = text(out);
    assert_eq!(out.status.code(), Some(130), "{log}");
    assert!(
        took < std::time::Duration::from_secs(10),
        "took {took:?}\n{log}"
    );
    let r = result(&cwd.join(exp));
    assert_eq!(r["interrupted"], true, "{r}");
    assert!(cwd.join(exp).join("ckpt/final.safetensors").is_file());
    let line = format!(
        "env step {}, train iteration {}",
        r["env_steps"], r["train_iters"]
    );
    let said = log
        .lines()
        .find(|l| l.contains("interrupted at"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(said.contains(&line), "{said}");
    assert!(
        said.contains(&format!("continue with: drill train --resume {exp}{flags}")),
        "{said}"
    );
    let more = r["env_steps"].as_u64().unwrap() + 2048;
    let limit = format!("max_env_step={more}");
    let mut args = vec!["--resume", exp, "--quiet", "--set", &limit];
    args.extend(flags.split_whitespace());
    let out = train(&args, cwd);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let after = result(&cwd.join(exp));
    assert_eq!(after["interrupted"], false, "{after}");
    assert!(after["env_steps"].as_u64().unwrap() >= more, "{after}");
    log
}

/// The transition counts of the log's "replay buffer saved" (or "restored") lines, by
/// rank prefix.
fn replay_counts(log: &str, what: &str) -> Vec<(String, u64)> {
    let key = format!("replay buffer {what}: ");
    let mut counts: Vec<(String, u64)> = log
        .lines()
        .filter_map(|l| {
            let at = l.find(&key)?;
            let n = l[at + key.len()..]
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            let rank = l.strip_prefix('[').and_then(|r| r.split(']').next());
            Some((rank.unwrap_or("").to_string(), n))
        })
        .collect();
    counts.sort();
    counts
}

#[test]
fn save_replay_keeps_each_ranks_buffer_for_the_continued_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn_ddp.toml");
    let common = ["--nproc-per-node", "2", "--save-replay", "--quiet"];
    let sets = ["--set", "env.stop_value=1000", "--set"];
    let out = train(
        &[&[&cfg[..]][..], &common, &sets, &["max_env_step=2000"]].concat(),
        tmp.path(),
    );
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let saved = replay_counts(&log, "saved");
    assert_eq!(saved.len(), 2, "{log}");
    assert!(saved.iter().all(|(_, n)| *n >= 1000), "{saved:?}");
    let ckpt = tmp.path().join("cartpole_dqn_ddp_seed0/ckpt");
    for r in 0..2 {
        assert!(ckpt.join(format!("replay_rank{r}.safetensors")).is_file());
    }
    let out = train(
        &[
            &["--resume", "cartpole_dqn_ddp_seed0"][..],
            &common,
            &sets,
            &["max_env_step=4000"],
        ]
        .concat(),
        tmp.path(),
    );
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert_eq!(replay_counts(&log, "restored"), saved, "{log}");
    // Without the flag the files stay as they are: the next continuation's checkpoint is
    // newer than them, and it says so and starts from an empty buffer.
    let more = |limit: &str| {
        let limit = format!("max_env_step={limit}");
        let args = [
            "--resume",
            "cartpole_dqn_ddp_seed0",
            "--nproc-per-node",
            "2",
        ];
        let out = train(
            &[&args[..], &["--quiet", "--set", &limit]].concat(),
            tmp.path(),
        );
        let log = text(&out);
        assert!(out.status.success(), "{log}");
        log
    };
    let log = more("5000");
    assert_eq!(replay_counts(&log, "restored").len(), 2, "{log}");
    assert!(replay_counts(&log, "saved").is_empty(), "{log}");
    let log = more("6000");
    assert!(replay_counts(&log, "restored").is_empty(), "{log}");
    assert!(
        log.contains("was saved at train iteration") && log.contains("empty replay buffer"),
        "{log}"
    );
}

#[test]
fn ctrl_c_under_parallel_workers_saves_the_learner_and_continues_with_its_buffer() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("cartpole_dqn_dist.toml");
    let args = [
        &cfg[..],
        "--parallel-workers",
        "2",
        "--save-replay",
        "--quiet",
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=100000000",
    ];
    let (out, took) = interrupt(&args, tmp.path(), "cartpole_dqn_dist_seed0");
    let saved = replay_counts(&text(&out), "saved");
    assert_eq!(saved.len(), 1, "{}", text(&out));
    let log = check_interrupted(
        &out,
        took,
        tmp.path(),
        "cartpole_dqn_dist_seed0",
        " --parallel-workers 2 --save-replay",
    );
    assert_eq!(replay_counts(&log, "restored"), saved, "{log}");
}

#[test]
fn ctrl_c_stops_after_the_step_saves_and_says_how_to_continue() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("pendulum_ppo.toml");
    let args = [
        &cfg[..],
        "--quiet",
        "--set",
        "env.stop_value=1000",
        "--set",
        "max_env_step=100000000",
    ];
    let (out, took) = interrupt(&args, tmp.path(), "pendulum_ppo_seed0");
    check_interrupted(&out, took, tmp.path(), "pendulum_ppo_seed0", "");
}

/// Interrupted with its stdout's reader gone (`drill train ... | head -0`): the final line
/// cannot be printed, and the exit code is still 130, not a success.
#[test]
fn ctrl_c_with_stdout_closed_still_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let mut child = drill()
        .args([
            "train",
            &config("pendulum_ppo.toml"),
            "--quiet",
            "--exp-dir",
        ])
        .arg(&exp)
        .args([
            "--set",
            "env.stop_value=1000",
            "--set",
            "max_env_step=100000000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let start = std::time::Instant::now();
    while !exp.join("ckpt/best.safetensors").is_file() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert_eq!(result(&exp)["interrupted"], true);
}

#[test]
fn ctrl_c_stops_every_rank_at_the_same_step_and_the_launcher_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config("pendulum_ppo_ddp.toml");
    let args = [
        &cfg[..],
        "--nproc-per-node",
        "2",
        "--quiet",
        "--set",
        "env.stop_value=1000",
        "--set",
        "max_env_step=100000000",
    ];
    let (out, took) = interrupt(&args, tmp.path(), "pendulum_ppo_ddp_seed0");
    let log = text(&out);
    assert!(log.contains("drill launch: got SIGINT"), "{log}");
    check_interrupted(
        &out,
        took,
        tmp.path(),
        "pendulum_ppo_ddp_seed0",
        " --nproc-per-node 2",
    );
    assert_eq!(
        result(&tmp.path().join("pendulum_ppo_ddp_seed0"))["world_size"],
        2
    );
}

#[test]
fn plot_draws_a_png_of_the_expected_size_from_a_fixture_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = repo().join("crates/drill-cli/tests/fixtures/plot");
    let png = tmp.path().join("curve.png");
    let out = drill()
        .arg("plot")
        .args(["cp_seed0", "cp_seed1", "other", "--smooth", "2", "-o"])
        .arg(&png)
        .current_dir(&fixtures)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    // IHDR: width and height, big-endian, at bytes 16..24.
    let size = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!((size(16), size(20)), (1000, 560));
    let out = drill()
        .arg("plot")
        .args(["cp_seed0", "--x", "wall", "--tag", "losses/td_loss", "-o"])
        .arg(&png)
        .current_dir(&fixtures)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let out = drill()
        .arg("plot")
        .args(["cp_seed0", "--tag", "no/such", "-o"])
        .arg(&png)
        .current_dir(&fixtures)
        .output()
        .unwrap();
    assert!(
        text(&out).contains("has no `no/such` values"),
        "{}",
        text(&out)
    );
}

/// A run still writing its metrics (its last line cut short) plots; a broken line with more
/// after it is named.
#[test]
fn plot_reads_a_run_in_progress_and_names_a_broken_line() {
    let tmp = tempfile::tempdir().unwrap();
    let fixtures = repo().join("crates/drill-cli/tests/fixtures/plot/cp_seed0");
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    for f in std::fs::read_dir(&fixtures).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, run.join(f.file_name().unwrap())).unwrap();
    }
    let metrics = run.join("metrics.jsonl");
    let whole = std::fs::read_to_string(&metrics).unwrap();
    std::fs::write(&metrics, format!("{whole}{{\"tag\":\"eval/episo")).unwrap();
    let plot = || {
        drill()
            .args(["plot", "run", "-o", "curve.png"])
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let out = plot();
    assert!(out.status.success(), "{}", text(&out));
    let lines = whole.lines().count();
    std::fs::write(&metrics, format!("{whole}{{\"tag\":\"eval/episo\n{whole}")).unwrap();
    let out = plot();
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("metrics.jsonl:{}: not JSON", lines + 1)),
        "{}",
        text(&out)
    );
}
