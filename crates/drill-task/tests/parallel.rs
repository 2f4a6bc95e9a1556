//! The Parallel runner with real processes on 127.0.0.1: star relays, mesh reaches everyone,
//! alone links only what `attach_to` names, and a killed peer fails the waiter instead of
//! hanging it. This binary is re-run as each worker; `DRILL_TEST_SCENARIO` says which.
//!
//! `cargo test --release -p drill-task --test parallel [FILTER]`; with `--features redis` also
//! the Redis scenarios (they start a `redis-server`, which must be installed).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use drill_task::parallel::{Mq, Parallel, Topology};
use drill_task::{OnlineRLContext, Task, TaskError};

const WAIT: Duration = Duration::from_secs(20);

fn main() {
    if let Ok(s) = std::env::var("DRILL_TEST_SCENARIO") {
        // A worker (or, for a scenario started by hand, the parent).
        if let Err(e) = scenario(&s).run::<OnlineRLContext>(|task| worker(&s, task)) {
            eprintln!("{s}: {e}");
            std::process::exit(1);
        }
        return;
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut failed = 0;
    let mut names = vec![
        "star_relays",
        "mesh_reaches_everyone",
        "alone_links_only_attached",
        "killed_peer_fails_the_waiter",
    ];
    if cfg!(feature = "redis") {
        names.extend([
            "redis_reaches_everyone",
            "redis_silent_peer_fails_the_waiter",
        ]);
    }
    let mut redis_server = None;
    for name in names {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        if name.starts_with("redis") && redis_server.is_none() {
            redis_server = Some(RedisServer::start());
        }
        let t = Instant::now();
        // SAFETY: single-threaded here; the workers inherit the variable.
        unsafe { std::env::set_var("DRILL_TEST_SCENARIO", name) };
        let out = dir(name);
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let result = scenario(name).run::<OnlineRLContext>(|_| unreachable!("parent"));
        let ok =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(name, result))).is_ok();
        println!(
            "test {name} ... {} ({:.1} s)",
            if ok { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        failed += usize::from(!ok);
    }
    drop(redis_server);
    if failed > 0 {
        std::process::exit(1);
    }
}

/// A throwaway `redis-server` on a free port; its URL in `DRILL_TEST_REDIS_URL`.
struct RedisServer(std::process::Child);

impl RedisServer {
    fn start() -> Self {
        let port = drill_comm::spawn::free_port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--requirepass", "drill-test-pw"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the Redis scenarios need redis-server (Debian: apt-get install redis-server)");
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t.elapsed() < WAIT, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: single-threaded here; the workers inherit the variable.
        unsafe { std::env::set_var("DRILL_TEST_REDIS_URL", format!("redis://127.0.0.1:{port}/")) };
        // The server refuses clients without the password: it must come from the environment.
        // SAFETY: as above.
        unsafe { std::env::set_var("DRILL_REDIS_PASSWORD", "drill-test-pw") };
        RedisServer(child)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where workers leave what the parent checks.
fn dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("drill-task-test-{}-{name}", std::process::id()))
}

fn out_dir() -> std::path::PathBuf {
    // Workers run with the parent's pid in DRILL_TEST_PARENT.
    let parent = std::env::var("DRILL_TEST_PARENT").unwrap();
    let name = std::env::var("DRILL_TEST_SCENARIO").unwrap();
    std::env::temp_dir().join(format!("drill-task-test-{parent}-{name}"))
}

fn scenario(name: &str) -> Parallel {
    if std::env::var_os("DRILL_TEST_PARENT").is_none() {
        // SAFETY: single-threaded; inherited by the workers.
        unsafe { std::env::set_var("DRILL_TEST_PARENT", std::process::id().to_string()) };
    }
    match name {
        "star_relays" => Parallel::runner(3).topology(Topology::Star),
        "mesh_reaches_everyone" => Parallel::runner(3).topology(Topology::Mesh),
        "alone_links_only_attached" => Parallel::runner(3)
            .topology(Topology::Alone)
            .attach_to(2, &[0])
            // Named from both sides: still one link.
            .attach_to(0, &[2]),
        "killed_peer_fails_the_waiter" => Parallel::runner(2).topology(Topology::Star),
        "redis_reaches_everyone" => Parallel::runner(3).mq(redis()),
        "redis_silent_peer_fails_the_waiter" => Parallel::runner(2).mq(redis()),
        other => panic!("unknown scenario {other}"),
    }
}

fn redis() -> Mq {
    Mq::Redis {
        url: std::env::var("DRILL_TEST_REDIS_URL").expect("started by the parent"),
    }
}

fn check(name: &str, result: Result<(), TaskError>) {
    let read = |f: &str| std::fs::read_to_string(dir(name).join(f)).unwrap_or_default();
    match name {
        "killed_peer_fails_the_waiter" => {
            let e = result.unwrap_err().to_string();
            assert!(e.contains("rank 0") && e.contains("signal 9"), "{e}");
            let lost = read("node1");
            assert!(lost.contains("node 0 is gone"), "{lost:?}");
        }
        "redis_silent_peer_fails_the_waiter" => {
            // Node 1 gave up on the stopped node 0; the launcher then ended the group.
            let e = result.unwrap_err().to_string();
            assert!(e.contains("rank 1"), "{e}");
            let lost = read("node1");
            assert!(lost.contains("node 0 sent no heartbeat"), "{lost:?}");
        }
        _ => {
            result.unwrap();
            for node in 0..3 {
                assert_eq!(read(&format!("node{node}")), "ok", "{name} node {node}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir(name));
}

/// Every `name` event from now on.
fn collect(
    h: &drill_task::TaskHandle,
    name: &str,
) -> Arc<std::sync::Mutex<Vec<drill_task::Event>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    h.on(name, move |e| s.lock().unwrap().push(e.clone()));
    seen
}

fn wait_until(cond: impl Fn() -> bool, what: &str) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < WAIT, "no {what} within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wait for an event nobody sends: the lost peer must end the wait within 5 s.
fn peer_lost_within_5s(h: &drill_task::TaskHandle) -> TaskError {
    let t = Instant::now();
    let e = h.wait_for("never", WAIT).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert!(matches!(e, TaskError::PeerLost { .. }), "{e}");
    e
}

fn worker(name: &str, task: &mut Task<'_, OnlineRLContext>) -> Result<(), TaskError> {
    let h = task.handle().clone();
    let me: usize = (0..4)
        .find(|n| h.match_labels(&[format!("node.{n}")]).unwrap())
        .unwrap();
    let done = |text: &str| std::fs::write(out_dir().join(format!("node{me}")), text).unwrap();
    match name {
        "star_relays" => {
            // Node 1 pings, node 2 hears it through node 0 and answers; node 0 hears both.
            let pings = collect(&h, "ping");
            let pongs = collect(&h, "pong");
            if me == 2 {
                let h2 = h.clone();
                h.once("ping", move |e| {
                    h2.emit("pong", &(e.decode::<u32>().unwrap() + 1)).unwrap();
                });
            }
            h.barrier()?;
            if me == 1 {
                h.emit("ping", &41u32)?;
            }
            wait_until(|| pongs.lock().unwrap().len() == 1, "pong");
            assert_eq!(pongs.lock().unwrap()[0].decode::<u32>()?, 42);
            assert_eq!(
                pings.lock().unwrap().len(),
                1,
                "node {me}: exactly one ping"
            );
            done("ok");
        }
        "mesh_reaches_everyone" | "redis_reaches_everyone" => {
            let seen = Arc::new(AtomicUsize::new(0));
            let s = seen.clone();
            h.on("hello", move |e| {
                let from: usize = e.decode().unwrap();
                s.fetch_add(1 << (8 * from), Ordering::SeqCst);
            });
            h.barrier()?;
            h.emit("hello", &me)?;
            let want: usize = (0..3)
                .filter(|&n| n != me)
                .map(|n| 1 << (8 * n))
                .sum::<usize>()
                + (1 << (8 * me));
            let t = Instant::now();
            while seen.load(Ordering::SeqCst) != want {
                assert!(
                    t.elapsed() < WAIT,
                    "node {me} saw {:x}",
                    seen.load(Ordering::SeqCst)
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            done("ok");
        }
        "alone_links_only_attached" => {
            let got = Arc::new(AtomicUsize::new(0));
            let g = got.clone();
            h.on("x", move |_| {
                g.fetch_add(1, Ordering::SeqCst);
            });
            h.barrier()?;
            if me == 0 {
                h.emit("x", &())?;
            }
            std::thread::sleep(Duration::from_millis(100));
            h.barrier()?;
            // Node 0 hears itself; node 2 is attached to it; node 1 has no link.
            let want = if me == 1 { 0 } else { 1 };
            assert_eq!(got.load(Ordering::SeqCst), want, "node {me}");
            done("ok");
        }
        "redis_silent_peer_fails_the_waiter" => {
            // Pub/sub cannot see a publisher die or hang: heartbeats must.
            h.barrier()?;
            if me == 0 {
                std::thread::sleep(Duration::from_millis(100));
                // SAFETY: stops this process, as a hang would (the launcher sees it alive).
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            let e = peer_lost_within_5s(&h);
            done(&e.to_string());
            return Err(e);
        }
        "killed_peer_fails_the_waiter" => {
            h.barrier()?;
            if me == 0 {
                std::thread::sleep(Duration::from_millis(100));
                // SAFETY: kills this process, as a crash would.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            // The launcher stops the group after node 0 dies; take the time to report.
            // SAFETY: ignoring SIGTERM in this test process only.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
            done(&peer_lost_within_5s(&h).to_string());
        }
        other => panic!("unknown scenario {other}"),
    }
    Ok(())
}
