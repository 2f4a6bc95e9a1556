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
    let mut child = drill()
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
    // The signal goes once both workers say their trap is set, however slow they start.
    let (lines, seen) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line.clone());
            all += &line;
            all.push('\n');
        }
        all
    });
    let mut ready = 0;
    while ready < 2 {
        let line = seen
            .recv_timeout(Duration::from_secs(60))
            .expect("both workers say ready within 60 s");
        ready += usize::from(line.ends_with("] ready"));
    }
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let out = child.wait_with_output().unwrap();
    let so = reader.join().unwrap();
    let se = String::from_utf8_lossy(&out.stderr);
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

/// The listening TCP sockets (`IP:PORT`, from /proc/net/tcp and tcp6) held by `pids`.
fn listening(pids: &[i32]) -> Vec<String> {
    let mut inodes = std::collections::HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let t = target.to_string_lossy();
                if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                    inodes.insert(i.to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local address, state (0A: LISTEN), inode.
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let (ip, port) = f[1].split_once(':').unwrap();
                let port = u16::from_str_radix(port, 16).unwrap();
                let ip = if ip.len() == 8 {
                    let b = u32::from_str_radix(ip, 16).unwrap().to_le_bytes();
                    std::net::IpAddr::from(b).to_string()
                } else {
                    let mut b = [0u8; 16];
                    for (k, w) in b.chunks_mut(4).enumerate() {
                        let v = u32::from_str_radix(&ip[k * 8..k * 8 + 8], 16).unwrap();
                        w.copy_from_slice(&v.to_le_bytes());
                    }
                    std::net::IpAddr::from(b).to_string()
                };
                out.push(format!("{ip}:{port}"));
            }
        }
    }
    out
}

/// `pid` and every process below it.
fn family(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut k = 0;
    while k < all.len() {
        let parent = all[k];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the fields after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
            if ppid == Some(parent) && !all.contains(&p) {
                all.push(p);
            }
        }
        k += 1;
    }
    all
}

/// A job on one machine (the launcher's store, the ranks' connections) listens on loopback
/// only, from the rendezvous to the end: every listening socket of the launcher and its ranks,
/// sampled until the job ends.
#[test]
fn a_single_machine_job_listens_on_loopback_only() {
    let mut child = drill()
        .args(["launch", "--standalone", "--nproc-per-node", "2", "--"])
        .args([env!("CARGO_BIN_EXE_drill"), "bench", "comm", "--ops", "all"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(120), "the job hung");
        seen.extend(listening(&family(child.id() as i32)));
    }
    assert!(child.wait().unwrap().success());
    assert!(!seen.is_empty(), "no listening socket seen");
    let open: Vec<&String> = seen
        .iter()
        .filter(|a| !a.starts_with("127.0.0.1:"))
        .collect();
    assert!(
        open.is_empty(),
        "listening beyond loopback: {open:?} (all: {seen:?})"
    );
}

/// A rank started by hand (no launcher, so no generated token) whose store is reachable from
/// other hosts is refused before it connects anywhere, with the fix in one line.
#[test]
fn a_rank_across_hosts_without_a_token_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let out = drill()
        .args([
            "train",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../configs/cartpole_dqn_ddp.toml"
            ),
        ])
        .args(["--quiet", "--exp-dir"])
        .arg(tmp.path().join("run"))
        .envs([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")])
        .envs([("MASTER_ADDR", "10.255.255.1"), ("MASTER_PORT", "29500")])
        .env_remove("DRILL_JOB_TOKEN")
        .output()
        .unwrap();
    let err = text(&out).1;
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("DRILL_JOB_TOKEN is not set") && err.contains("export DRILL_JOB_TOKEN="),
        "{err}"
    );
}

#[test]
fn bench_ddp_times_pong_ppo_with_and_without_the_overlap_and_names_an_unknown_case() {
    let out = drill()
        .args(["launch", "--standalone", "--nproc-per-node", "2", "--"])
        .args([
            env!("CARGO_BIN_EXE_drill"),
            "bench",
            "ddp",
            "--case",
            "pong-ppo",
        ])
        .args(["--iters", "1"])
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert!(out.status.success(), "{so}\n{se}");
    for row in [
        "ppo-update-alone",
        "ppo-update-ddp ",
        "ppo-update-ddp-after",
        "overlap-hidden",
    ] {
        assert!(so.contains(&format!("[rank 0] {row}")), "{row}: {so}");
    }
    assert!(so.contains("1687719 params"), "{so}");
    let out = drill()
        .args(["launch", "--standalone", "--nproc-per-node", "1", "--"])
        .args([
            env!("CARGO_BIN_EXE_drill"),
            "bench",
            "ddp",
            "--case",
            "pong-sac",
        ])
        .output()
        .unwrap();
    let (so, se) = text(&out);
    assert!(
        se.contains("--case pong-sac: bench ddp knows `cartpole`, `pong` and `pong-ppo`"),
        "{so}\n{se}"
    );
}
