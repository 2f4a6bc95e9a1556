//! `drill launch --nnodes MIN:MAX` on loopback: launchers as nodes, a shell script as the
//! ranks (it prints its world and round, and stops on SIGINT as drill train does): a node
//! joining a running job, one above MAX refused, a killed node leaving with the survivors
//! going on without spending the failure budget, a rank failing on a live node counted
//! against `--max-restarts`, and a job below MIN ending with the name of who left. The same
//! with training on namespace hosts: `tests/multinode.rs`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A rank: says its world and round, then waits for `DIR/done` (exit 0), `DIR/fail.$RANK`
/// (exit 3) or SIGINT (exit 130, as drill train after saving).
const RANK: &str = r#"trap 'echo "stop rank=$RANK round=$DRILL_RESTART_COUNT"; exit 130' INT
echo "start rank=$RANK world=$WORLD_SIZE round=$DRILL_RESTART_COUNT"
while :; do
  [ -f "$DIR/done" ] && exit 0
  [ -f "$DIR/fail.$RANK.$DRILL_RESTART_COUNT" ] && exit 3
  sleep 0.05
done"#;

/// A launcher, its output lines collected.
struct Node {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Node {
    /// `drill launch --nnodes RANGE` with `extra` flags, one rank of [`RANK`] in `dir`.
    fn start(port: u16, range: &str, extra: &[&str], dir: &Path) -> Node {
        let mut c = Command::new(env!("CARGO_BIN_EXE_drill"));
        c.args(["launch", "--nnodes", range, "--nproc-per-node", "1"])
            .args(["--rdzv-endpoint", &format!("127.0.0.1:{port}")])
            .args(["--rdzv-id", "el", "--grace", "1"])
            .args([
                "--rdzv-conf",
                "last_call_timeout=1,join_timeout=8,keep_alive_interval=0.5,keep_alive_max_attempt=10",
            ])
            .args(extra)
            .args(["--", "sh", "-c", RANK])
            .env("DIR", dir)
            .env("DRILL_JOB_TOKEN", "elastic-test")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        let readers = [out, err]
            .into_iter()
            .map(|pipe| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    for l in BufReader::new(pipe).lines().map_while(Result::ok) {
                        lines.lock().unwrap().push(l);
                    }
                })
            })
            .collect();
        Node {
            child,
            lines,
            readers,
        }
    }

    fn text(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Wait up to 30 s for a line containing every one of `what`.
    fn expect(&self, what: &[&str]) {
        let t = Instant::now();
        while !self
            .lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| what.iter().all(|w| l.contains(w)))
        {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no line with {what:?} in 30 s:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait up to 30 s for the launcher to exit; its exit code.
    fn exit(&mut self) -> Option<i32> {
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return s.code();
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "still running after 30 s:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn port() -> u16 {
    drill_comm::spawn::free_port()
}

/// The first node, hosting the store (it binds the endpoint's port before the others try).
fn first(p: u16, range: &str, extra: &[&str], dir: &Path) -> Node {
    let n = Node::start(p, range, extra, dir);
    std::thread::sleep(Duration::from_millis(300));
    n
}

fn done(dir: &Path) {
    std::fs::write(dir.join("done"), "").unwrap();
}

#[test]
fn a_late_node_joins_at_the_next_round_and_one_above_max_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let p = port();
    let a = first(p, "2:3", &[], tmp.path());
    let b = Node::start(p, "2:3", &[], tmp.path());
    for n in [&a, &b] {
        n.expect(&["round 0: 2 node(s)"]);
        n.expect(&["start rank=", "world=2 round=0"]);
    }
    let c = Node::start(p, "2:3", &[], tmp.path());
    // The running ranks are asked to stop (as drill train saves there), then all three meet.
    for n in [&a, &b] {
        n.expect(&["asks to join"]);
        n.expect(&["stop rank=", "round=0"]);
    }
    for n in [&a, &b, &c] {
        n.expect(&["round 1: 3 node(s)"]);
        n.expect(&["start rank=", "world=3 round=1"]);
    }
    // The old nodes keep their node ranks; the newcomer comes last.
    c.expect(&["this host is node 2"]);
    let mut d = Node::start(p, "2:3", &[], tmp.path());
    assert_eq!(d.exit(), Some(1));
    let refused = d.text();
    assert!(
        refused.contains("refused: job \"el\" already has 3 node(s)")
            && refused.contains("the most --nnodes 2:3 admits"),
        "{refused}"
    );
    a.expect(&["refused"]);
    done(tmp.path());
    for mut n in [a, b, c] {
        assert_eq!(n.exit(), Some(0), "{}", n.text());
        assert!(!n.text().contains("round 2"), "{}", n.text());
    }
}

#[test]
fn a_killed_node_leaves_and_the_others_go_on_without_spending_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let p = port();
    let a = first(p, "2:3", &[], tmp.path());
    let b = Node::start(p, "2:3", &[], tmp.path());
    let mut c = Node::start(p, "2:3", &[], tmp.path());
    for n in [&a, &b, &c] {
        n.expect(&["round 0: 3 node(s)"]);
        n.expect(&["world=3 round=0"]);
    }
    // The launcher and its rank die at once (the rank by PDEATHSIG): a host lost.
    c.child.kill().unwrap();
    let _ = c.child.wait();
    for n in [&a, &b] {
        n.expect(&["is gone: no heartbeat since"]);
        n.expect(&["round 1: host", "left (no heartbeat since"]);
        n.expect(&["round 1: 2 node(s)"]);
        n.expect(&["start rank=", "world=2 round=1"]);
    }
    done(tmp.path());
    for mut n in [a, b] {
        // --max-restarts is 0: the lost node did not count as a failure.
        assert_eq!(n.exit(), Some(0), "{}", n.text());
    }
}

#[test]
fn a_rank_failing_on_a_live_node_spends_a_restart_and_then_ends_the_job() {
    let tmp = tempfile::tempdir().unwrap();
    let p = port();
    let a = first(p, "1:2", &["--max-restarts", "1"], tmp.path());
    let b = Node::start(p, "1:2", &["--max-restarts", "1"], tmp.path());
    for n in [&a, &b] {
        n.expect(&["world=2 round=0"]);
    }
    std::fs::write(tmp.path().join("fail.1.0"), "").unwrap();
    for n in [&a, &b] {
        n.expect(&["round 1: 2 node(s)"]);
        n.expect(&["world=2 round=1"]);
    }
    std::fs::write(tmp.path().join("fail.1.1"), "").unwrap();
    let mut codes = vec![];
    for mut n in [a, b] {
        // The failing rank's node passes its code on; the other says another node failed.
        codes.push(n.exit());
        let t = n.text();
        assert!(
            t.contains("giving up after 2 failed round(s) (--max-restarts 1)"),
            "{t}"
        );
        assert!(t.contains("exited with code 3"), "{t}");
    }
    codes.sort();
    assert_eq!(codes, [Some(1), Some(3)]);
}

#[test]
fn below_min_the_job_ends_naming_who_left_and_when() {
    let tmp = tempfile::tempdir().unwrap();
    let p = port();
    let mut a = first(p, "2:3", &[], tmp.path());
    let mut b = Node::start(p, "2:3", &[], tmp.path());
    for n in [&a, &b] {
        n.expect(&["world=2 round=0"]);
    }
    b.child.kill().unwrap();
    let _ = b.child.wait();
    assert_eq!(a.exit(), Some(1));
    let t = a.text();
    assert!(
        t.contains("round 1: only 1 node(s)")
            && t.contains("of the 2 --nnodes 2:3 needs joined within 8s")
            && t.contains("left since round 0:")
            && t.contains("(no heartbeat since "),
        "{t}"
    );
}

#[test]
fn when_the_store_host_is_lost_the_others_end_naming_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let p = port();
    let mut a = first(p, "1:3", &[], tmp.path());
    let mut b = Node::start(p, "1:3", &[], tmp.path());
    b.expect(&["world=2 round=0"]);
    a.child.kill().unwrap();
    let _ = a.child.wait();
    let t = Instant::now();
    assert_eq!(b.exit(), Some(1));
    let text = b.text();
    assert!(
        text.contains(&format!(
            "the rendezvous store at 127.0.0.1:{p} has not answered since"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("127.0.0.1:{p}")), "{text}");
    // Within the silence allowed (5 s) and then the join timeout (8 s), with slack.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}
