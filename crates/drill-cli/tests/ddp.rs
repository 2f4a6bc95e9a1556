//! `drill train --nproc-per-node`: data-parallel training end to end on 127.0.0.1 — the DDP
//! config reaches its stop value with bit-identical parameters on every rank, a killed rank
//! fails the job fast naming it, and with `--max-restarts` the job resumes from its newest
//! checkpoint in the same folder.

use std::path::Path;
use std::process::Child;
use std::time::Duration;

mod common;
use common::{
    drill, kill_and_expect_failure, kill_and_expect_resume, repo, result, spawn_train, text,
};

#[test]
fn cartpole_dqn_ddp_reaches_its_stop_value_with_identical_parameters_on_both_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn_ddp.toml"))
        .args(["--nproc-per-node", "2", "--quiet", "--exp-dir"])
        .arg(&exp)
        // Check bit-identical parameters across ranks after every optimizer step.
        .args(["--set", "policy.ddp_check_every=1"])
        .output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    // Every line the launcher passes on carries its rank's prefix once (the result path, the
    // last line, once read `[rank 0] [rank 0] ...`).
    for line in log.lines().filter(|l| l.starts_with("[rank")) {
        assert_eq!(line.matches("[rank ").count(), 1, "{line}");
    }
    assert!(
        log.lines()
            .any(|l| l.starts_with("[rank 0] ") && l.ends_with("result.json")),
        "{log}"
    );
    let r = result(&exp);
    assert_eq!(r["stop_reached"], true, "{r}");
    assert_eq!(r["world_size"], 2);
    assert_eq!(r["restarts"], 0);
    for rank in 0..2 {
        let l = std::fs::read_to_string(exp.join(format!("logs/rank_{rank}.log"))).unwrap();
        assert!(l.contains(&format!("rank {rank} of 2")), "{l}");
    }
    // One folder, written by rank 0 only.
    assert!(!tmp.path().join("run_2").exists());
}

#[test]
fn a_multi_gpu_config_alone_runs_as_world_size_1_and_a_plain_config_refuses_nproc() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("alone");
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn_ddp.toml"))
        .args(["--quiet", "--set", "max_env_step=200", "--exp-dir"])
        .arg(&exp)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("world size 1"), "{}", text(&out));
    assert_eq!(result(&exp)["world_size"], 1);

    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn.toml"))
        .args(["--nproc-per-node", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("policy.multi_gpu"), "{}", text(&out));
}

#[test]
fn data_parallel_and_a_split_pipeline_refuse_each_other_naming_the_key() {
    let train = |config: &str, args: &[&str]| {
        drill()
            .arg("train")
            .arg(repo().join(config))
            .args(args)
            .output()
            .unwrap()
    };
    let out = train(
        "configs/cartpole_dqn_ddp.toml",
        &["--parallel-workers", "2"],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("policy.multi_gpu"), "{}", text(&out));
    assert!(text(&out).contains("--parallel-workers"), "{}", text(&out));

    let out = train(
        "configs/cartpole_dqn.toml",
        &["--nproc-per-node", "2", "--set", "task.workers=2"],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("task.workers"), "{}", text(&out));

    let out = train(
        "configs/cartpole_dqn.toml",
        &["--nproc-per-node", "2", "--parallel-workers", "2"],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("cannot be used with"), "{}", text(&out));
}

/// `drill train --nproc-per-node 2` on a run that cannot reach its stop value before
/// `max_env_step`, started in the background.
fn long_run(exp: &Path, extra: &[&str]) -> Child {
    let mut args = vec!["--nproc-per-node", "2"];
    args.extend(["--set", "env.stop_value=1000", "--set", "max_env_step=5000"]);
    args.extend(extra);
    spawn_train("configs/cartpole_dqn_ddp.toml", exp, &args)
}

#[test]
fn killing_a_rank_fails_the_job_fast_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let child = long_run(&exp, &[]);
    let (log, dt) = kill_and_expect_failure(child, 1, &exp, Duration::from_millis(300));
    assert!(dt < Duration::from_secs(5), "took {dt:?}: {log}");
    assert!(log.contains("signal 9") || log.contains("SIGKILL"), "{log}");
}

/// Rank 0 writes `result.json`; when rank 0 is the rank lost (here stopped with SIGSTOP, as a
/// frozen host would be), the rank that noticed writes it, naming rank 0.
#[test]
fn a_stopped_rank_0_is_named_in_result_json_by_the_rank_that_noticed() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let child = long_run(&exp, &[]);
    let pid = common::rank_pid(child.id(), 0, &exp);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let out = child.wait_with_output().unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    let r = result(&exp);
    let error = r["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("rank 1 of 2: "), "{r}");
    assert!(error.contains("rank 0 is gone"), "{r}");
    // The counters of the newest checkpoint (rank 0 was stopped soon after its first).
    assert!(r["env_steps"].is_u64() && r["interrupted"] == false, "{r}");
}

#[test]
fn with_max_restarts_a_killed_rank_is_restarted_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let child = long_run(&exp, &["--max-restarts", "1"]);
    let r = kill_and_expect_resume(child, 1, &exp, Duration::from_millis(800));
    assert_eq!(r["world_size"], 2);
    assert!(r["env_steps"].as_u64().unwrap() >= 5000, "{r}");
}
