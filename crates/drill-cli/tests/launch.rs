//! `drill launch` end to end: env protocol, output, log files, restarts, failure summary,
//! signal forwarding, two launchers as two nodes, and `drill bench comm` under it.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn drill() -> Command {
    Command::new(env!("CARGO_BIN_EXE_drill"))
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn free_port() -> String {
    drill_comm::spawn::free_port().to_string()
}

#[test]
fn ranks_get_the_env_protocol_and_prefixed_output_and_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let out = drill()
        .args(["launch", "--standalone", "--nproc-per-node", "3", "--log-dir"])
        .arg(&logs)
        .args(["--", "sh", "-c", "echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $DRILL_RESTART_COUNT ${#DRILL_JOB_TOKEN} $OMP_NUM_THREADS; echo oops >&2"])
        .env_remove("OMP_NUM_THREADS")
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    for r in 0..3 {
        assert!(
            so.contains(&format!("[rank {r}] env {r} {r} 3 3 0 127.0.0.1 0 32 1")),
            "{so}"
        );
        assert!(se.contains(&format!("[rank {r}] oops")), "{se}");
        let f = std::fs::read_to_string(logs.join(format!("attempt_0/rank_{r}.stdout"))).unwrap();
        assert!(f.starts_with(&format!("env {r} ")), "{f}");
        let e = std::fs::read_to_string(logs.join(format!("attempt_0/rank_{r}.stderr"))).unwrap();
        assert_eq!(e, "oops\n");
    }
    assert!(
        se.contains("OMP_NUM_THREADS=1"),
        "the launcher says it sets OMP_NUM_THREADS: {se}"
    );
}

#[test]
fn a_failing_rank_stops_the_group_and_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = drill()
        .args([
            "launch",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--grace",
            "1",
            "--log-dir",
        ])
        .arg(tmp.path())
        .args([
            "--",
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then exit 3; fi; sleep 30",
        ])
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{so}\n{se}");
    assert!(
        se.contains("rank 1 (node 0, pid") && se.contains("exited with code 3"),
        "{se}"
    );
    assert!(
        se.contains("attempt_0/rank_1.stderr"),
        "names the log file: {se}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the sleeping rank was stopped"
    );
}

#[test]
fn the_group_restarts_with_an_incremented_restart_count() {
    let out = drill()
        .args(["launch", "--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--"])
        .args(["sh", "-c", "echo attempt $DRILL_RESTART_COUNT; if [ $DRILL_RESTART_COUNT -lt 2 ] && [ $RANK = 0 ]; then sleep 0.5; exit 1; fi"])
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    for a in 0..3 {
        assert!(so.contains(&format!("[rank 1] attempt {a}")), "{so}");
    }
    assert!(se.contains("succeeded after 2 restart(s)"), "{se}");
}

#[test]
fn sigterm_reaches_every_worker() {
    let child = drill()
        .args([
            "launch",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--grace",
            "5",
            "--",
        ])
        .args([
            "sh",
            "-c",
            "trap 'echo got-term; exit 0' TERM; echo ready; sleep 30 & wait",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    let (so, se) = text(&out);
    assert!(t.elapsed() < Duration::from_secs(4), "{so}\n{se}");
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{so}\n{se}");
    assert!(
        so.contains("[rank 0] got-term") && so.contains("[rank 1] got-term"),
        "{so}\n{se}"
    );
}

fn bench_comm_args() -> [&'static str; 9] {
    [
        env!("CARGO_BIN_EXE_drill"),
        "bench",
        "comm",
        "--ops",
        "all_reduce,broadcast,barrier",
        "--sizes",
        "4K,300K",
        "--iters",
        "3",
    ]
}

#[test]
fn two_launchers_form_one_job_static_and_dynamic() {
    for dynamic in [false, true] {
        let port = free_port();
        let nodes: Vec<_> = (0..2)
            .map(|node| {
                let mut c = drill();
                c.args(["launch", "--nnodes", "2", "--nproc-per-node", "2"]);
                if dynamic {
                    c.args([
                        "--rdzv-endpoint",
                        &format!("127.0.0.1:{port}"),
                        "--rdzv-id",
                        "job7",
                    ]);
                } else {
                    c.args([
                        "--node-rank",
                        &node.to_string(),
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        &port,
                    ]);
                }
                c.arg("--")
                    .args(bench_comm_args())
                    .env("DRILL_JOB_TOKEN", "shared-secret")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<Output> = nodes
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let all: String = outs
            .iter()
            .map(|o| format!("{}\n{}", text(o).0, text(o).1))
            .collect();
        assert!(
            outs.iter().all(|o| o.status.success()),
            "dynamic={dynamic}: {all}"
        );
        assert!(all.contains("backend embedded, 4 ranks"), "{all}");
        assert!(
            all.contains("all_reduce") && all.contains("barrier"),
            "{all}"
        );
    }
}

#[test]
fn multi_node_without_a_shared_token_is_refused() {
    let out = drill()
        .args(["launch", "--nnodes", "2", "--node-rank", "0", "--", "true"])
        .env_remove("DRILL_JOB_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out).1.contains("DRILL_JOB_TOKEN"), "{}", text(&out).1);
}

#[test]
fn bench_comm_runs_every_collective_at_any_world_size() {
    for n in ["1", "2", "3"] {
        let out = drill()
            .args(["launch", "--standalone", "--nproc-per-node", n, "--"])
            .args([env!("CARGO_BIN_EXE_drill"), "bench", "comm", "--ops", "all"])
            .args(["--sizes", "4K,96K", "--iters", "2"])
            .output()
            .unwrap();
        let (so, se) = text(&out);
        assert!(out.status.success(), "{n} ranks: {so}\n{se}");
        for op in drill_cli_ops(n != "1") {
            assert!(
                so.lines().any(|l| l.contains(&format!("] {op} "))),
                "{n} ranks: no {op} row:\n{so}"
            );
        }
    }
}

/// The collectives `--ops all` covers (the pairwise ones need two ranks).
fn drill_cli_ops(pairs: bool) -> Vec<&'static str> {
    let mut ops = vec![
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "gather",
        "scatter",
        "reduce_scatter",
        "barrier",
    ];
    if pairs {
        ops.extend(["send_recv", "tcp_stream"]);
    }
    ops
}
