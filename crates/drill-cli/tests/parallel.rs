//! `drill train --parallel-workers N`: the pipeline split over processes (DI-engine's ditask)
//! end to end on 127.0.0.1 — the shipped layouts (DQN's two, APPO's) reach their stop values with the learner's
//! worker owning the experiment folder, bad role tables are refused before anything starts,
//! and a killed worker fails the run fast instead of hanging it.

use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;
use common::{
    drill, kill_and_expect_failure, kill_and_expect_resume, repo, result, spawn_train, text,
    wait_all_ok,
};

#[test]
fn the_two_shipped_layouts_reach_their_stop_values() {
    for (config, learner) in [
        ("configs/cartpole_dqn_dist.toml", 0),
        ("configs/cartpole_dqn_3roles.toml", 1),
        ("configs/cartpole_appo.toml", 1),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let exp = tmp.path().join("run");
        let out = drill()
            .arg("train")
            .arg(repo().join(config))
            .args(["--quiet", "--exp-dir"])
            .arg(&exp)
            .output()
            .unwrap();
        let log = text(&out);
        assert!(out.status.success(), "{config}: {log}");
        let r = result(&exp);
        assert_eq!(r["stop_reached"], true, "{config}: {r}");
        assert!(r["eval_reward_mean"].as_f64().unwrap() >= 195.0, "{r}");
        for ck in ["best", "latest", "final"] {
            assert!(exp.join(format!("ckpt/{ck}.safetensors")).is_file(), "{ck}");
        }
        assert!(
            log.contains(&format!("[rank {learner}]")) && log.contains("learner (→"),
            "{log}"
        );
        assert!(log.contains("evaluator (no experiment folder;"), "{log}");
    }
}

/// An LSTM policy split over processes: the collector's rollouts carry their initial and
/// bootstrap states to the learner, whose V-trace replays each sequence from them; on
/// CartPole without velocities (memory needed) the run reaches the stop value.
#[test]
fn an_lstm_appo_split_run_learns_cartpole_without_velocities() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_appo.toml"))
        .args([
            "--quiet",
            "--set",
            "env.id=\"CartPoleNoVel-v1\"",
            "--set",
            "policy.model.lstm_hidden_size=64",
            "--set",
            "policy.learn.learning_rate=0.002",
            "--set",
            "max_env_step=400000",
            "--exp-dir",
        ])
        .arg(&exp)
        .output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = result(&exp);
    assert_eq!(r["stop_reached"], true, "{r}");
    assert!(r["eval_reward_mean"].as_f64().unwrap() >= 475.0, "{r}");
}

#[test]
fn role_tables_and_policies_that_cannot_split_are_refused_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(repo().join("configs/cartpole_dqn_dist.toml")).unwrap();
    let two_learners = base.replace(r#""node.1" = ["evaluator"]"#, r#""node.1" = ["learner"]"#);
    let unknown = base.replace(r#"["evaluator"]"#, r#"["evaluater"]"#);
    for (text_in, expect) in [
        (
            two_learners.as_str(),
            "learner role must run on exactly one",
        ),
        (unknown.as_str(), "unknown role \"evaluater\""),
    ] {
        let path = tmp.path().join("c.toml");
        std::fs::write(&path, text_in).unwrap();
        let t = Instant::now();
        let out = drill()
            .arg("train")
            .arg(&path)
            .args(["--quiet", "--exp-dir"])
            .arg(tmp.path().join("x"))
            .output()
            .unwrap();
        let log = text(&out);
        assert!(!out.status.success(), "{log}");
        assert!(log.contains("task.roles") && log.contains(expect), "{log}");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(!tmp.path().join("x").exists(), "nothing was created");
    }
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_v1_ppo.toml"))
        .args(["--quiet", "--parallel-workers", "2", "--exp-dir"])
        .arg(tmp.path().join("p"))
        .args([
            "--set",
            r#"task.roles={"node.0"=["collector","learner"],"node.1"=["evaluator"]}"#,
        ])
        .output()
        .unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("policy.type") && log.contains("on-policy") && log.contains("\"appo\""),
        "{log}"
    );
    // Only APPO's learner trains as a data-parallel group of workers.
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn_dist.toml"))
        .args(["--quiet", "--set", "policy.multi_gpu=true", "--exp-dir"])
        .arg(tmp.path().join("d"))
        .output()
        .unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("`policy.multi_gpu`") && log.contains("only APPO's learner"),
        "{log}"
    );
    assert!(!tmp.path().join("d").exists(), "nothing was created");
}

#[test]
fn a_killed_worker_fails_the_run_fast_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let limits = [
        "--set",
        "env.stop_value=1000",
        "--set",
        "max_env_step=1000000",
    ];
    let child = spawn_train("configs/cartpole_dqn_3roles.toml", &exp, &limits);
    let (log, dt) = kill_and_expect_failure(child, 2, &exp, Duration::ZERO);
    assert!(dt < Duration::from_secs(10), "took {dt:?}: {log}");
}

#[test]
fn with_max_restarts_the_group_restarts_and_the_learner_resumes_in_the_same_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let args = ["--max-restarts", "1", "--set", "env.stop_value=1000"];
    let args = [&args[..], &["--set", "max_env_step=3000"]].concat();
    let child = spawn_train("configs/cartpole_dqn_3roles.toml", &exp, &args);
    let r = kill_and_expect_resume(child, 2, &exp, Duration::from_millis(300));
    assert!(r["env_steps"].as_u64().unwrap() >= 3000, "{r}");
}

#[test]
fn two_runners_with_node_ids_form_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    // Runners 0 and 1 of `config` on one fresh port, each with its experiment folder
    // `{name}{id}`.
    let runners = |config: &str, args: &[&str], name: &str| -> Vec<std::process::Child> {
        let port = drill_comm::spawn::free_port().to_string();
        [0, 1]
            .into_iter()
            .map(|id| {
                drill()
                    .arg("train")
                    .arg(repo().join(config))
                    .args(["--quiet", "--node-ids", &id.to_string()])
                    .args(["--master-port", &port])
                    .args(args)
                    .arg("--exp-dir")
                    .arg(tmp.path().join(format!("{name}{id}")))
                    .env("DRILL_JOB_TOKEN", "shared-secret")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect()
    };
    let outs = wait_all_ok(runners("configs/cartpole_dqn_dist.toml", &[], "run"));
    let r = result(&tmp.path().join("run0"));
    assert_eq!(r["stop_reached"], true, "{r}");
    assert!(
        !tmp.path().join("run1").exists(),
        "only the learner's runner has a folder"
    );
    assert!(text(&outs[1]).contains("evaluator"), "{}", text(&outs[1]));

    // A runner whose only worker is a collector (which may leave) keeps it until the run
    // ends, however long the learner's runner trains after its own workers started.
    let appo = [
        "--parallel-workers",
        "2",
        "--set",
        r#"task.roles={"node.0"=["learner","evaluator"],"node.1"=["collector"]}"#,
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=300000",
        "--set",
        "task.timeout=10",
    ];
    wait_all_ok(runners("configs/cartpole_appo.toml", &appo, "appo"));
    let r = result(&tmp.path().join("appo0"));
    assert!(r["env_steps"].as_u64().unwrap() >= 300_000, "{r}");
}

/// Through Redis pub/sub instead of direct links (`--features redis`; needs `redis-server`,
/// which `.ci/run` installs).
#[cfg(feature = "redis")]
#[test]
fn the_three_roles_reach_the_stop_value_through_redis() {
    // The server's password, given to the workers in `DRILL_REDIS_PASSWORD` only.
    const REDIS_PASSWORD: &str = "pw-only-in-the-environment";
    let port = drill_comm::spawn::free_port();
    let mut server = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--requirepass", REDIS_PASSWORD])
        .stdout(Stdio::null())
        .spawn()
        .expect("this test needs redis-server (Debian: apt-get install redis-server)");
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let url = format!("redis://127.0.0.1:{port}/");
    // The password in the URL is refused before anything starts, naming the flag.
    let with_password = format!("redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/");
    let refused = spawn_train(
        "configs/cartpole_dqn_3roles.toml",
        &tmp.path().join("refused"),
        &["--mq-type", "redis", "--redis-url", &with_password],
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("--redis-url carries a password")
            && text(&refused).contains("DRILL_REDIS_PASSWORD"),
        "{}",
        text(&refused)
    );
    // From the environment the workers inherit it: the server refuses any client without it.
    let args = ["--mq-type", "redis", "--redis-url", &url];
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn_3roles.toml"))
        .args(["--quiet", "--exp-dir"])
        .arg(&exp)
        .args(args)
        .env("DRILL_REDIS_PASSWORD", REDIS_PASSWORD)
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(result(&exp)["stop_reached"], true);
    let written = std::fs::read_to_string(exp.join("config.toml")).unwrap();
    assert!(!written.contains(REDIS_PASSWORD) && !text(&out).contains(REDIS_PASSWORD));
}

#[test]
fn under_slurm_each_task_is_a_worker_named_by_its_slurm_variables() {
    // What `srun -n 2 drill train CONFIG --platform slurm` gives each task, on one host.
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let port = drill_comm::spawn::free_port().to_string();
    let tasks: Vec<_> = [0, 1]
        .into_iter()
        .map(|rank| {
            let r = rank.to_string();
            drill()
                .arg("train")
                .arg(repo().join("configs/cartpole_dqn_dist.toml"))
                .args(["--quiet", "--platform", "slurm", "--exp-dir"])
                .arg(&exp)
                .envs([("SLURM_PROCID", r.as_str()), ("SLURM_LOCALID", r.as_str())])
                .envs([("SLURM_NTASKS", "2"), ("SLURM_NTASKS_PER_NODE", "2")])
                .envs([("SLURM_NODEID", "0"), ("SLURM_JOB_NODELIST", "localhost")])
                .envs([("MASTER_PORT", port.as_str()), ("DRILL_JOB_TOKEN", "s3")])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs = wait_all_ok(tasks);
    assert!(
        text(&outs[1]).contains("node.1]: evaluator"),
        "{}",
        text(&outs[1])
    );
    assert_eq!(result(&exp)["stop_reached"], true);

    // Without Slurm's variables the error says how to start it.
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn_dist.toml"))
        .args(["--quiet", "--platform", "slurm", "--exp-dir"])
        .arg(tmp.path().join("x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("srun -n 2"), "{}", text(&out));
}

#[test]
fn two_collectors_feed_one_learner() {
    let tmp = tempfile::tempdir().unwrap();
    let roles =
        r#"task.roles={"node.[03]"=["collector"],"node.1"=["learner"],"node.2"=["evaluator"]}"#;
    let args = ["--parallel-workers", "4", "--set", roles];
    for config in ["cartpole_dqn_3roles", "cartpole_appo"] {
        let exp = tmp.path().join(config);
        let out = spawn_train(&format!("configs/{config}.toml"), &exp, &args)
            .wait_with_output()
            .unwrap();
        let log = text(&out);
        assert!(out.status.success(), "{config}: {log}");
        assert!(log.contains("node.3]: collector"), "{log}");
        assert_eq!(result(&exp)["stop_reached"], true, "{config}");
    }

    // A learner that collects too cannot also take remote collectors' data.
    let mixed =
        r#"task.roles={"node.[02]"=["collector"],"node.0"=["learner"],"node.1"=["evaluator"]}"#;
    let out = spawn_train(
        "configs/cartpole_dqn_3roles.toml",
        &tmp.path().join("m"),
        &["--set", mixed],
    )
    .wait_with_output()
    .unwrap();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains("task.roles") && log.contains("collects too"),
        "{log}"
    );
}

/// Lines the child writes, gathered as they come (both streams).
fn gather(child: &mut std::process::Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    use std::io::{BufRead, BufReader};
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
    let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
    for stream in [out, err] {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
    }
    log
}

/// Wait until `log` holds `needle` (a minute at most).
fn wait_for(log: &std::sync::Mutex<String>, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !log.lock().unwrap().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} within a minute: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// APPO with two collectors: one killed mid-run leaves without stopping the learner, which
/// says so and trains on with the other, then the other; one started later with the run's
/// port and token joins, gets the learner's weights and feeds it; Ctrl-C at the learner ends
/// the run for all (the joined collector too) with `final` saved and counters of whole
/// rollouts only.
#[test]
fn collectors_leave_and_join_a_running_split_run() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let port = drill_comm::spawn::free_port().to_string();
    let roles = r#"task.roles={"node.0"=["learner","evaluator"],"node.[12]"=["collector"]}"#;
    let run_args = [
        "--master-port",
        &port,
        "--set",
        roles,
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=100000000",
    ];
    let mut run = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_appo.toml"))
        .arg("--exp-dir")
        .arg(&exp)
        .args(run_args)
        .env("DRILL_JOB_TOKEN", "appo-join-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = gather(&mut run);
    let (one, two) = (
        common::rank_pid(run.id(), 1, &exp),
        common::rank_pid(run.id(), 2, &exp),
    );
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(two, libc::SIGKILL) };
    wait_for(&log, "collector node 2 left");
    wait_for(&log, "the run goes on with 1 collector");
    wait_for(
        &log,
        "rank 2 was killed by signal 9; it may leave, the others go on",
    );
    // With none left the learner waits for one to join, which is sent its weights at once
    // (no other collector's rollout makes the learner send them).
    // SAFETY: as above.
    unsafe { libc::kill(one, libc::SIGKILL) };
    wait_for(&log, "the run goes on with 0 collectors");

    let mut joined = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_appo.toml"))
        .args(["--parallel-workers", "3", "--join"])
        .args(run_args)
        .env("DRILL_JOB_TOKEN", "appo-join-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let joined_log = gather(&mut joined);
    wait_for(&log, "collector node 3 joined the run");
    wait_for(&log, "collector node 3 sends its data too");
    let t = Instant::now();
    // SAFETY: as above.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let status = run.wait().unwrap();
    let joined_status = joined.wait().unwrap();
    let log = log.lock().unwrap().clone();
    // Nobody waits at the end for the collectors that left.
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "{:?}: {log}",
        t.elapsed()
    );
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(
        joined_status.success(),
        "the joined collector ends with the run: {}",
        joined_log.lock().unwrap()
    );
    let r = result(&exp);
    assert_eq!(r["interrupted"], true, "{r}");
    let steps = r["env_steps"].as_u64().unwrap();
    assert!(
        steps > 0 && steps.is_multiple_of(256),
        "whole rollouts only: {r}"
    );
    assert!(exp.join("ckpt/final.safetensors").is_file());
}

/// `configs/cartpole_appo_2learners.toml`: `policy.multi_gpu` with several learner workers,
/// one data-parallel group (`ddp_check_every
/// = 1`: any parameter drift between the learners fails the run), each learner trained on its
/// own collector's rollouts, the lead alone owning the folder. Every update averages one
/// rollout per learner, so the counters the learners agree on hold two rollouts (512 env
/// steps) per 8 iterations (4 epochs of 2 minibatches), plus at most the last step's, untrained.
#[test]
fn a_group_of_learners_trains_data_parallel_on_its_own_collectors() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let args = ["--set", "policy.ddp_check_every=1"];
    let out = spawn_train("configs/cartpole_appo_2learners.toml", &exp, &args)
        .wait_with_output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = result(&exp);
    assert_eq!(
        (&r["stop_reached"], &r["world_size"]),
        (&true.into(), &2.into()),
        "{r}"
    );
    for line in [
        "learner 0 of 2: one data-parallel group",
        "learner 1 of 2: one data-parallel group",
    ] {
        assert!(log.contains(line), "{line}: {log}");
    }
    assert_eq!(log.matches("learner (→").count(), 1, "{log}");
    // Each learner took one step of its own collector per update.
    let by = log
        .lines()
        .find_map(|l| l.split_once("collector steps received, by collector: "))
        .map(|(_, by)| by)
        .unwrap_or_else(|| panic!("no count of collector steps: {log}"));
    let count = |node: &str| -> u64 {
        let at = by.split(", ").find_map(|p| p.strip_prefix(node));
        at.and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    let (zero, one) = (count("node 0: "), count("node 1: "));
    assert!(zero > 10 && zero.abs_diff(one) <= 1, "{by}");
    let (steps, iters) = (
        r["env_steps"].as_u64().unwrap(),
        r["train_iters"].as_u64().unwrap(),
    );
    let last = steps.checked_sub(64 * iters);
    assert!(
        iters.is_multiple_of(8) && last.is_some_and(|l| l <= 512 && l.is_multiple_of(256)),
        "{steps} env steps for {iters} iterations: {r}"
    );
}

/// A group of two learners with three collectors (learner 0 fed by nodes 3 and 5, learner 1
/// by node 4): node 4 killed mid-run leaves learner 1 without collectors, which waits; one
/// started later takes node id 6, feeds learner 1 (the one with the fewest collectors) and
/// is sent its weights; Ctrl-C then ends the run for all, the learners agreeing
/// on the step, with `final` saved.
#[test]
fn a_group_of_learners_keeps_training_as_collectors_leave_and_join() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let port = drill_comm::spawn::free_port().to_string();
    let roles =
        r#"task.roles={"node.0"=["evaluator"],"node.[12]"=["learner"],"node.[345]"=["collector"]}"#;
    let run_args = [
        "--parallel-workers",
        "6",
        "--master-port",
        &port,
        "--set",
        roles,
        "--set",
        "policy.multi_gpu=true",
        "--set",
        "policy.ddp_check_every=1",
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=100000000",
    ];
    let spawn = |extra: &[&str]| {
        drill()
            .arg("train")
            .arg(repo().join("configs/cartpole_appo.toml"))
            .arg("--exp-dir")
            .arg(&exp)
            .args(run_args)
            .args(extra)
            .env("DRILL_JOB_TOKEN", "appo-group-join-test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut run = spawn(&[]);
    let log = gather(&mut run);
    // Learner 1 (node 2) loses its only collector (node 4); learner 0 keeps nodes 3 and 5.
    let four = common::rank_pid(run.id(), 4, &exp);
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(four, libc::SIGKILL) };
    wait_for(&log, "collector node 4 left");
    wait_for(&log, "the run goes on with 0 collectors");
    let mut joined = spawn(&["--join"]);
    let joined_log = gather(&mut joined);
    wait_for(&log, "[rank 1] ");
    wait_for(&log, "collector node 6 joined the run");
    wait_for(&log, "collector node 6 sends its data too");
    // SAFETY: as above.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let status = run.wait().unwrap();
    let joined_status = joined.wait().unwrap();
    let log = log.lock().unwrap().clone();
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(joined_status.success(), "{}", joined_log.lock().unwrap());
    let joins: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("node 6 joined"))
        .collect();
    assert!(
        joins.len() == 1 && joins[0].starts_with("[rank 2]"),
        "only learner 1 (node 2), the one without collectors, takes node 6: {joins:?}"
    );
    let chose = joined_log.lock().unwrap().clone();
    assert!(
        chose.contains("feeds learner 1 (node 2), which had 0 collectors"),
        "{chose}"
    );
    let r = result(&exp);
    assert_eq!(r["interrupted"], true, "{r}");
    assert!(r["env_steps"].as_u64().unwrap().is_multiple_of(256), "{r}");
    assert!(exp.join("ckpt/final.safetensors").is_file());
}

/// A learner of the group killed under `--max-restarts 1`: the group restarts in the same
/// folder and every learner starts from the lead's checkpoint (parameters and optimizer
/// state: with `ddp_check_every = 1` a learner that started from anything else would drift
/// and fail the run).
#[test]
fn a_restarted_group_of_learners_resumes_from_the_leads_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let args = ["--max-restarts", "1", "--set", "policy.ddp_check_every=1"];
    let limits = [
        "--set",
        "env.stop_value=1000",
        "--set",
        "max_env_step=40000",
    ];
    let child = spawn_train(
        "configs/cartpole_appo_2learners.toml",
        &exp,
        &[&args[..], &limits].concat(),
    );
    let r = kill_and_expect_resume(child, 3, &exp, Duration::from_millis(300));
    assert!(r["env_steps"].as_u64().unwrap() >= 40000, "{r}");
}

/// A learner of a group left without collectors (its only one killed, none joining within
/// `task.timeout`) fails the run, and its own error (no collector left, who left and why)
/// comes first: the other learners, the collectors and the evaluator wait for learners
/// longer than a learner waits for its collectors.
#[test]
fn a_group_learner_left_without_collectors_fails_the_run_naming_why() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let args = [
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=100000000",
        "--set",
        "task.timeout=3",
    ];
    let mut run = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_appo_2learners.toml"))
        .arg("--exp-dir")
        .arg(&exp)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = gather(&mut run);
    let one = common::rank_pid(run.id(), 1, &exp);
    let t = Instant::now();
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(one, libc::SIGKILL) };
    let status = run.wait().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(!status.success(), "{log}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "{:?}: {log}",
        t.elapsed()
    );
    let first = log
        .lines()
        .find(|l| l.contains("error"))
        .unwrap_or_default();
    assert!(
        first.starts_with("[rank 3]") && first.contains("no collector left (node 1:"),
        "{first}\n{log}"
    );
}

/// A remote evaluator waits for the weights of the next evaluation point however long the
/// `eval_freq` iterations take, longer than `task.timeout` here (a lost learner would end
/// the wait at once).
#[test]
fn a_remote_evaluator_waits_for_its_next_evaluation_point_beyond_the_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("run");
    let args = [
        "--set",
        "task.timeout=0.3",
        "--set",
        "policy.eval.evaluator.eval_freq=6000",
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=400000",
    ];
    let out = spawn_train("configs/cartpole_appo.toml", &exp, &args)
        .wait_with_output()
        .unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let r = result(&exp);
    assert!(r["env_steps"].as_u64().unwrap() >= 400000, "{r}");
    let evals = log.matches("INFO eval at").count();
    assert!(evals >= 2, "{evals} evaluations: {log}");
}
