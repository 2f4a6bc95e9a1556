//! Multi-node training across hosts made of Linux namespaces (`scripts/netns_hosts.sh`: own
//! network, /dev/shm and hostname each, joined by a bridge): DDP to the stop value with shared
//! memory inside a host and TCP between hosts; a cut link or a frozen host (every process
//! stopped) named within 5 s with the launchers gone within 10 s; a cut link restored, the
//! group restarted (`--max-restarts 1`) from its newest checkpoint and trained to the stop
//! value; a host 10 s late joining through `--rdzv-endpoint`; training to the stop value while
//! each host drops 1 % of its packets (nftables; the kernel here has no netem for delay); an
//! elastic job (`drill train --nnodes 2:3`) of three hosts losing one and reaching the stop
//! value on two, and one that a late host joins, loses a frozen host and takes it back when it
//! thaws; `freeze` and `thaw` on a host whose processes come and go. Needs root and nftables;
//! `cargo test --release -p drill-cli --features netns --test multinode`. Every test removes
//! the hosts it made, also when it fails.
#![cfg(feature = "netns")]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

mod common;

use common::netns::Hosts;
use common::result;

/// Tests that keep both cores busy run alone ([`busy`]); the others, whose checks time how
/// fast a fault is named, run beside each other only ([`light`]).
static CORES: RwLock<()> = RwLock::new(());

fn light() -> RwLockReadGuard<'static, ()> {
    CORES.read().unwrap_or_else(|p| p.into_inner())
}

fn busy() -> RwLockWriteGuard<'static, ()> {
    CORES.write().unwrap_or_else(|p| p.into_inner())
}

impl Hosts {
    /// `drill launch` on `host` (node rank `host`, the store on host 0) with `args`.
    fn launch(&self, host: usize, nodes: usize, nproc: usize, args: &[&str], dir: &Path) -> Node {
        let rank = host.to_string();
        let rendezvous = ["--node-rank", &rank, "--master-addr", "10.77.0.1"];
        self.launch_with(host, nodes, nproc, &rendezvous, args, dir)
    }

    /// `drill launch` on `host` with `rendezvous` options, then `args`.
    fn launch_with(
        &self,
        host: usize,
        nodes: usize,
        nproc: usize,
        rendezvous: &[&str],
        args: &[&str],
        dir: &Path,
    ) -> Node {
        let mut c = self.on(host, env!("CARGO_BIN_EXE_drill"));
        c.arg("launch")
            .args(["--nnodes", &nodes.to_string()])
            .args(["--nproc-per-node", &nproc.to_string()])
            .args(["--master-port", "29517"])
            .args(rendezvous)
            .args(args)
            .current_dir(dir)
            .env("DRILL_JOB_TOKEN", "netns-test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Node::start(c)
    }
}

/// A running launcher whose output lines are collected with the time they arrived.
struct Node {
    child: Child,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Node {
    fn start(mut c: Command) -> Node {
        let mut child = c.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for pipe in [out, err] {
            let lines = lines.clone();
            readers.push(std::thread::spawn(move || {
                for l in BufReader::new(pipe).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push((Instant::now(), l));
                }
            }));
        }
        Node {
            child,
            lines,
            readers,
        }
    }

    /// The first line containing `what` and when it came.
    fn line(&self, what: &str) -> Option<(Instant, String)> {
        let lines = self.lines.lock().unwrap();
        lines.iter().find(|(_, l)| l.contains(what)).cloned()
    }

    /// Wait up to 60 s for a line containing `what` that came after a line containing
    /// `after`; when it came.
    fn expect_after(&self, after: &str, what: &str) -> Instant {
        let start = Instant::now();
        loop {
            {
                let lines = self.lines.lock().unwrap();
                if let Some(i) = lines.iter().position(|(_, l)| l.contains(after))
                    && let Some((t, _)) = lines[i..].iter().find(|(_, l)| l.contains(what))
                {
                    return *t;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no {what:?} after {after:?} in 60 s:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn text(&self) -> String {
        let lines = self.lines.lock().unwrap();
        lines.iter().map(|(_, l)| format!("{l}\n")).collect()
    }

    /// Wait up to `limit` for the launcher to exit: its status and when it exited.
    fn wait(&mut self, limit: Duration) -> Option<(std::process::ExitStatus, Instant)> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                let at = Instant::now();
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Some((s, at));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `drill train configs/cartpole_dqn_ddp.toml` into `dir/exp` under a launcher on each of the
/// 2 hosts: `nproc` ranks each, `launch` options first, `--set` overrides `sets`.
fn train(
    hosts: &Hosts,
    nproc: usize,
    launch: &[&str],
    dir: &Path,
    exp: &str,
    sets: &[&str],
) -> Vec<Node> {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/cartpole_dqn_ddp.toml");
    let cfg = cfg.display().to_string();
    let mut args: Vec<&str> = launch.to_vec();
    args.extend([
        "--",
        env!("CARGO_BIN_EXE_drill"),
        "train",
        &cfg,
        "--exp-dir",
        exp,
    ]);
    for s in sets {
        args.extend(["--set", s]);
    }
    (0..2)
        .map(|h| hosts.launch(h, 2, nproc, &args, dir))
        .collect()
}

/// Wait until every launcher printed its ranks' connection lines.
fn wait_connected(nodes: &[Node]) {
    let start = Instant::now();
    while nodes.iter().any(|n| n.line("TCP with ranks").is_none()) {
        let all: String = nodes.iter().map(Node::text).collect();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not start:\n{all}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait up to 120 s for every launcher, each of which must succeed.
fn all_succeed(nodes: &mut [Node]) {
    for (h, n) in nodes.iter_mut().enumerate() {
        let (status, _) = n
            .wait(Duration::from_secs(120))
            .unwrap_or_else(|| panic!("host {h} did not finish in 120 s:\n{}", n.text()));
        assert!(status.success(), "host {h}: {status}\n{}", n.text());
    }
}

#[test]
fn two_hosts_of_two_ranks_train_to_the_stop_value_over_shm_inside_and_tcp_between() {
    let _cores = light();
    let hosts = Hosts::up(2, "t");
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let mut nodes = train(&hosts, 2, &[], tmp.path(), "nn", &[]);
    all_succeed(&mut nodes);
    println!(
        "2 hosts x 2 ranks: stop value in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let set = &hosts.set;
    let all = format!("{}{}", nodes[0].text(), nodes[1].text());
    common::netns::assert_shm_inside_tcp_between(&all, set);
    let result = result(&tmp.path().join("nn"));
    assert_eq!(result["stop_reached"], true, "{result}");
}

#[test]
fn two_hosts_dropping_1_percent_of_their_packets_still_reach_the_stop_value() {
    let _cores = light();
    let hosts = Hosts::up(2, "p");
    hosts.link(0, "loss", &["1"]);
    hosts.link(1, "loss", &["1"]);
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let mut nodes = train(&hosts, 1, &[], tmp.path(), "loss", &[]);
    all_succeed(&mut nodes);
    println!(
        "2 hosts, 1 % loss each way: stop value in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let result = result(&tmp.path().join("loss"));
    assert_eq!(result["stop_reached"], true, "{result}");
}

/// Wait for `n` (on host `h`) to fail after `fault`: it must name rank `gone` on host
/// `host` as silent within 5 s and exit within 10 s. Prints both times.
fn assert_named_and_gone(n: &mut Node, h: usize, fault: Instant, gone: usize, host: &str) {
    let (status, exited) = n
        .wait(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("host {h} still runs 30 s after the fault:\n{}", n.text()));
    let text = n.text();
    assert!(!status.success(), "host {h}: {text}");
    let (named, line) = n
        .line("nothing heard from it")
        .unwrap_or_else(|| panic!("host {h} never named the silent rank:\n{text}"));
    assert!(
        line.contains(&format!("rank {gone} is gone")) && line.contains(&format!("on host {host}")),
        "host {h}: {line}"
    );
    let (named, exited) = (named - fault, exited - fault);
    println!(
        "host {h}: named rank {gone} {named:?} after the fault, launcher exited after {exited:?}"
    );
    assert!(
        named < Duration::from_secs(5),
        "host {h}: named after {named:?}\n{text}"
    );
    assert!(
        exited < Duration::from_secs(10),
        "host {h}: exited after {exited:?}\n{text}"
    );
}

#[test]
fn a_cut_link_is_named_within_5_s_and_every_launcher_exits_within_10_s() {
    let _cores = light();
    let hosts = Hosts::up(2, "c");
    let tmp = tempfile::tempdir().unwrap();
    // A stop value that cannot be reached: the job runs until the cut.
    let sets = ["env.stop_value=1000000", "max_env_step=1000000000"];
    let mut nodes = train(&hosts, 1, &[], tmp.path(), "cut", &sets);
    wait_connected(&nodes);
    std::thread::sleep(Duration::from_secs(2));
    hosts.link(1, "cut", &[]);
    let cut = Instant::now();
    for (h, n) in nodes.iter_mut().enumerate() {
        let other = 1 - h;
        assert_named_and_gone(n, h, cut, other, &format!("{}-h{other}", hosts.set));
    }
}

#[test]
fn a_frozen_host_is_named_within_5_s_and_the_other_launcher_exits_within_10_s() {
    let _cores = light();
    let hosts = Hosts::up(2, "f");
    let tmp = tempfile::tempdir().unwrap();
    let sets = ["env.stop_value=1000000", "max_env_step=1000000000"];
    let mut nodes = train(&hosts, 1, &[], tmp.path(), "frozen", &sets);
    wait_connected(&nodes);
    std::thread::sleep(Duration::from_secs(2));
    // Every process of host 1 (launcher and rank) stops: a hung machine.
    hosts.link(1, "freeze", &[]);
    let frozen = Instant::now();
    let host1 = format!("{}-h1", hosts.set);
    assert_named_and_gone(&mut nodes[0], 0, frozen, 1, &host1);
    // Thawed, host 1 finds its peer gone and exits too.
    hosts.link(1, "thaw", &[]);
    let n = &mut nodes[1];
    let (status, _) = n
        .wait(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("host 1 still runs 30 s after the thaw:\n{}", n.text()));
    assert!(!status.success(), "{}", n.text());
}

/// Wait up to `within` for every process of `host` to satisfy `ok` (given its state letter).
fn until_every_process(
    hosts: &Hosts,
    host: usize,
    within: Duration,
    what: &str,
    ok: fn(char) -> bool,
) {
    let start = Instant::now();
    loop {
        let bad: Vec<_> = hosts
            .processes(host)
            .into_iter()
            .filter(|(_, s)| !ok(*s))
            .collect();
        if bad.is_empty() {
            return;
        }
        assert!(start.elapsed() < within, "{what}: {bad:?} after {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn freeze_stops_and_thaw_continues_every_process_of_a_host_whose_processes_come_and_go() {
    // The script's process scans would slow the fault-naming tests beside it.
    let _cores = busy();
    let hosts = Hosts::up(1, "k");
    // 20 loops, each starting a process that lives 1 s and waiting 0.1-0.9 s, again and
    // again: some processes exit while the script lists them, others start while it signals.
    let churn = "for j in $(seq 1 20); do (while :; do sleep 1 & sleep 0.$((j % 9 + 1)); done) & done; wait";
    let mut churn = hosts
        .on(0, "sh")
        .args(["-c", churn])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let stopped = |s: char| s == 'T' || s == 'Z';
    for round in 0..5 {
        hosts.link(0, "freeze", &[]);
        let frozen = format!("round {round}: running after freeze");
        // A process the script missed would run for up to 1 s.
        until_every_process(&hosts, 0, Duration::from_millis(500), &frozen, stopped);
        // None got away to start another.
        std::thread::sleep(Duration::from_millis(300));
        until_every_process(&hosts, 0, Duration::ZERO, &frozen, stopped);
        hosts.link(0, "thaw", &[]);
        let thawed = format!("round {round}: stopped after thaw");
        until_every_process(&hosts, 0, Duration::from_secs(2), &thawed, |s| s != 'T');
        std::thread::sleep(Duration::from_millis(100 * (round % 4)));
    }
    drop(hosts);
    let _ = churn.kill();
    let _ = churn.wait();
}

#[test]
fn a_job_whose_link_is_cut_and_restored_restarts_and_reaches_the_stop_value() {
    let _cores = light();
    let hosts = Hosts::up(2, "r");
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes = train(&hosts, 1, &["--max-restarts", "1"], tmp.path(), "rs", &[]);
    wait_connected(&nodes);
    hosts.link(1, "cut", &[]);
    // Restored once a launcher has seen the cut and restarts, however long noticing takes.
    let cut = Instant::now();
    while nodes
        .iter()
        .all(|n| n.line("restarting the group").is_none())
    {
        let all: String = nodes.iter().map(Node::text).collect();
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "nobody noticed the cut:\n{all}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let noticed = cut.elapsed();
    hosts.link(1, "restore", &[]);
    let restored = Instant::now();
    for (h, n) in nodes.iter_mut().enumerate() {
        let (status, _) = n
            .wait(Duration::from_secs(120))
            .unwrap_or_else(|| panic!("host {h} did not finish:\n{}", n.text()));
        let text = n.text();
        assert!(status.success(), "host {h}: {status}\n{text}");
        assert!(
            text.contains("restarting the group (attempt 1 of 1)"),
            "host {h}:\n{text}"
        );
    }
    println!(
        "cut for {:.1} s (until a restart began), stop value {:.1} s after the link came back",
        noticed.as_secs_f64(),
        restored.elapsed().as_secs_f64()
    );
    let result = result(&tmp.path().join("rs"));
    assert_eq!(result["stop_reached"], true, "{result}");
}

#[test]
fn a_host_that_starts_10_s_late_joins_through_the_rendezvous_endpoint() {
    let _cores = light();
    let hosts = Hosts::up(2, "l");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/cartpole_dqn_ddp.toml");
    let cfg = cfg.display().to_string();
    let args = [
        "--",
        env!("CARGO_BIN_EXE_drill"),
        "train",
        &cfg,
        "--exp-dir",
        "late",
    ];
    let rendezvous = ["--rdzv-endpoint", "10.77.0.1:29518", "--rdzv-id", "late"];
    let mut first = hosts.launch_with(0, 2, 1, &rendezvous, &args, tmp.path());
    std::thread::sleep(Duration::from_secs(10));
    let mut late = hosts.launch_with(1, 2, 1, &rendezvous, &args, tmp.path());
    for (h, n) in [&mut first, &mut late].into_iter().enumerate() {
        let (status, _) = n
            .wait(Duration::from_secs(120))
            .unwrap_or_else(|| panic!("host {h} did not finish:\n{}", n.text()));
        assert!(status.success(), "host {h}: {status}\n{}", n.text());
    }
    let result = result(&tmp.path().join("late"));
    assert_eq!(result["stop_reached"], true, "{result}");
}

/// A CartPole DQN slowed down (a wider net: about 20 s to the stop value on three hosts
/// here), so that a host can leave before it ends.
const WIDE: &str = "policy.model.encoder_hidden_size_list=[1024,1024,512]";
/// A stop value no run reaches: the job trains until it is interrupted.
const ENDLESS: &str = "env.stop_value=1000000";

/// One node of an elastic job (`drill train --nnodes 2:3`, the store on host 0) on `host`,
/// training CartPole DQN with `--set` overrides `sets`.
fn elastic(hosts: &Hosts, host: usize, dir: &Path, sets: &str) -> Node {
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/cartpole_dqn_ddp.toml");
    let mut c = hosts.on(host, env!("CARGO_BIN_EXE_drill"));
    c.arg("train")
        .arg(&cfg)
        .args(["--exp-dir", "el", "--quiet", "--nnodes", "2:3"])
        .args(["--rdzv-endpoint", "10.77.0.1:29519", "--rdzv-id", "el"])
        .args([
            "--rdzv-conf",
            "last_call_timeout=2,keep_alive_interval=0.5,keep_alive_max_attempt=8",
        ])
        .args(["--set", sets])
        .current_dir(dir)
        .env("DRILL_JOB_TOKEN", "netns-test")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Node::start(c)
}

/// Where training (re)starts on a node: its rank's "training dqn on" line after `round`.
const TRAINING: &str = "training dqn on";

#[test]
fn an_elastic_job_that_loses_a_host_trains_on_two_and_reaches_the_stop_value() {
    let _cores = busy();
    let hosts = Hosts::up(3, "e");
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> = (0..3)
        .map(|h| elastic(&hosts, h, tmp.path(), WIDE))
        .collect();
    for n in &nodes {
        n.expect_after("round 0: 3 node(s)", TRAINING);
    }
    std::thread::sleep(Duration::from_secs(1));
    // Host 2's launcher dies, and its rank with it: a lost machine.
    nodes[2].child.kill().unwrap();
    let lost = Instant::now();
    let mut again = Duration::ZERO;
    for n in &nodes[..2] {
        n.expect_after(
            &format!("round 1: host {}-h2", hosts.set),
            "left (no heartbeat since",
        );
        again = again.max(n.expect_after("round 1: 2 node(s)", TRAINING) - lost);
    }
    println!("host lost -> training on the other two: {again:?}");
    all_succeed(&mut nodes[..2]);
    let result = result(&tmp.path().join("el"));
    assert_eq!(result["stop_reached"], true, "{result}");
    assert_eq!(result["world_size"], 2, "{result}");
}

#[test]
fn an_elastic_job_takes_a_late_host_loses_a_frozen_one_and_takes_it_back() {
    let _cores = light();
    let hosts = Hosts::up(3, "j");
    let tmp = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> = (0..2)
        .map(|h| elastic(&hosts, h, tmp.path(), ENDLESS))
        .collect();
    for n in &nodes {
        n.expect_after("round 0: 2 node(s)", TRAINING);
    }
    let late = Instant::now();
    nodes.push(elastic(&hosts, 2, tmp.path(), ENDLESS));
    for n in &nodes {
        n.expect_after("round 1: 3 node(s)", TRAINING);
    }
    let joined = nodes[2].expect_after("round 1: 3 node(s)", TRAINING) - late;
    println!("late host started -> training with it: {joined:?}");
    // Host 1 stops (every process on it): the others go on without it...
    hosts.link(1, "freeze", &[]);
    for h in [0, 2] {
        nodes[h].expect_after(
            &format!("round 2: host {}-h1", hosts.set),
            "left (no heartbeat since",
        );
        nodes[h].expect_after("round 2: 2 node(s)", TRAINING);
    }
    // ...and when it runs again it finds its round over and joins the next.
    hosts.link(1, "thaw", &[]);
    for n in &nodes {
        n.expect_after("round 3: 3 node(s)", TRAINING);
    }
    // Trains with the three (an evaluation after the restart), then Ctrl-C ends the job.
    let resumed = "restart 3: resuming from";
    nodes[0].expect_after(resumed, "eval at env step");
    for n in &nodes {
        // SAFETY: kill(2) on a child this test started and has not waited for.
        unsafe { libc::kill(n.child.id() as i32, libc::SIGINT) };
    }
    for (h, n) in nodes.iter_mut().enumerate() {
        let (status, _) = n
            .wait(Duration::from_secs(60))
            .unwrap_or_else(|| panic!("host {h} did not stop:\n{}", n.text()));
        assert_eq!(status.code(), Some(130), "host {h}:\n{}", n.text());
    }
    let result = result(&tmp.path().join("el"));
    // Each round started from a checkpoint no older than the last (or, stopped before its
    // first one, from the start): counters never go back.
    let metrics = std::fs::read_to_string(tmp.path().join("el/metrics.jsonl")).unwrap();
    let marks: Vec<(u64, u64)> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|j| j["tag"] == drill_exp::RESUMED_ITER_TAG)
        .map(|j| {
            (
                j["step"].as_u64().unwrap(),
                j["value"].as_f64().unwrap() as u64,
            )
        })
        .collect();
    assert!(
        (1..=3).contains(&marks.len()),
        "a mark per restart: {marks:?}"
    );
    assert!(
        marks
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
        "counters went back: {marks:?}"
    );
    assert_eq!(result["interrupted"], true, "{result}");
    assert_eq!(result["world_size"], 3, "{result}");
    assert_eq!(result["restarts"], 3, "{result}");
}
