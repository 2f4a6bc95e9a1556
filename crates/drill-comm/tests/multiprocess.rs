//! Multi-process tests: real ranks on 127.0.0.1, spawned by re-running this binary.
//!
//! `cargo test -p drill-comm --test multiprocess [FILTER]`. Each scenario runs as a parent
//! that spawns ranks (with `DRILL_TEST_CHILD=<scenario>`) and checks what they report.

use std::time::{Duration, Instant};

use drill_comm::spawn::{RankOutput, Spawn};
use drill_comm::{CommError, DType, Element, ProcessGroup, ReduceOp, bf16, f16};

fn main() {
    if let Ok(child) = std::env::var("DRILL_TEST_CHILD") {
        let r = std::panic::catch_unwind(|| run_child(&child));
        std::process::exit(if r.is_ok() { 0 } else { 1 });
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    #[allow(unused_mut)]
    let mut scenarios: Vec<(&str, fn())> = vec![
        ("collectives_shm", collectives_shm),
        ("collectives_tcp", collectives_tcp),
        ("dead_peer_fails_fast", dead_peer_fails_fast),
        ("hung_peer_times_out", hung_peer_times_out),
        (
            "a_peer_that_leaves_in_order_is_not_called_lost",
            peer_that_leaves_in_order,
        ),
        ("stopped_peer_is_named_fast", stopped_peer_is_named_fast),
        (
            "busy_peer_is_not_taken_for_dead",
            busy_peer_is_not_taken_for_dead,
        ),
        ("stranger_is_refused", stranger_is_refused),
        (
            "mismatched_calls_are_explained",
            mismatched_calls_are_explained,
        ),
        (
            "debug_collectives_names_both_calls_of_a_conditional_collective",
            debug_collectives_names_both_calls,
        ),
    ];
    #[cfg(feature = "mpi")]
    scenarios.push(("mpi_collectives", mpi_collectives));
    #[cfg(feature = "nccl")]
    scenarios.push(("nccl_backend", nccl_backend));
    let mut failed = 0;
    for (name, f) in &scenarios {
        if filter.as_deref().is_some_and(|flt| !name.contains(flt)) {
            continue;
        }
        let t = Instant::now();
        let ok = std::panic::catch_unwind(*f).is_ok();
        println!(
            "test {name} ... {} ({:.1} s)",
            if ok { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        failed += !ok as usize;
    }
    if failed > 0 {
        println!("{failed} multi-process scenario(s) failed");
        std::process::exit(1);
    }
}

fn spawn(child: &str, n: usize) -> Spawn {
    Spawn::current_exe(n)
        .env("DRILL_TEST_CHILD", child)
        .timeout(Duration::from_secs(120))
}

fn expect_all_ok(outs: &[RankOutput]) {
    for o in outs {
        assert!(
            o.success(),
            "rank {} failed ({:?}):\n{}\n{}",
            o.rank,
            o.status,
            o.stdout,
            o.stderr
        );
    }
}

fn collectives_shm() {
    for n in 1..=4 {
        let outs = spawn("collectives", n).run().unwrap();
        expect_all_ok(&outs);
        if n > 1 {
            assert!(
                outs[0].stdout.contains(&format!("shm_peers={}", n - 1)),
                "{}",
                outs[0].stdout
            );
        }
    }
}

fn collectives_tcp() {
    for n in [2, 3] {
        let outs = spawn("collectives", n).env("DRILL_SHM", "0").run().unwrap();
        expect_all_ok(&outs);
        assert!(outs[0].stdout.contains("shm_peers=0"), "{}", outs[0].stdout);
    }
}

fn dead_peer_fails_fast() {
    let outs = spawn("dead_peer", 3).run().unwrap();
    assert!(!outs[2].success(), "rank 2 was meant to die");
    for o in &outs[..2] {
        assert!(o.success(), "rank {}: {}\n{}", o.rank, o.stdout, o.stderr);
        assert!(
            o.stdout.contains("named rank 2"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
}

/// A rank that shuts its group down while another waits on it (it stopped on an error of its
/// own) is named as having left, not as lost: the waiter must not report it as the cause.
/// Over shared memory and over TCP.
fn peer_that_leaves_in_order() {
    for shm in ["1", "0"] {
        let outs = spawn("peer_left", 2).env("DRILL_SHM", shm).run().unwrap();
        for o in &outs {
            assert!(
                o.success(),
                "shm {shm} rank {}: {}\n{}",
                o.rank,
                o.stdout,
                o.stderr
            );
        }
        assert!(
            outs[1].stdout.contains("rank 0 left the group"),
            "shm {shm}: {}",
            outs[1].stdout
        );
    }
}

fn hung_peer_times_out() {
    let outs = spawn("hung_peer", 2)
        .env("DRILL_TIMEOUT", "1")
        .run()
        .unwrap();
    assert!(outs[0].success(), "{}\n{}", outs[0].stdout, outs[0].stderr);
    assert!(
        outs[0].stdout.contains("timed out") && outs[0].stdout.contains("rank 1"),
        "{}",
        outs[0].stdout
    );
}

/// A rank that is SIGSTOPped (as a frozen host or a cut link looks to its peers) is named
/// by every other rank within 5 s, with its host, through the heartbeats.
fn stopped_peer_is_named_fast() {
    let outs = spawn("stopped_peer", 3).run().unwrap();
    for o in &outs[..2] {
        assert!(o.success(), "rank {}: {}\n{}", o.rank, o.stdout, o.stderr);
        assert!(
            o.stdout.contains("named rank 2")
                && o.stdout.contains("nothing heard from it")
                && o.stdout.contains("on host "),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
        print!("  rank {}: {}", o.rank, o.stdout);
    }
}

/// A rank busy for longer than the heartbeat timeout (here 5 s against 3 s) is alive: the
/// others wait for it in a barrier and go on.
fn busy_peer_is_not_taken_for_dead() {
    expect_all_ok(&spawn("busy_peer", 2).run().unwrap());
}

fn stranger_is_refused() {
    expect_all_ok(&spawn("stranger", 2).run().unwrap());
}

fn mismatched_calls_are_explained() {
    let outs = spawn("mismatch_len", 2).run().unwrap();
    expect_all_ok(&outs);
    assert!(
        outs.iter()
            .any(|o| o.stdout.contains("buffer sizes differ")),
        "{outs:?}"
    );
    let outs = spawn("mismatch_op", 2).run().unwrap();
    expect_all_ok(&outs);
    assert!(
        outs.iter().any(|o| o.stdout.contains("different orders")),
        "{outs:?}"
    );
}

/// `DRILL_DEBUG_COLLECTIVES=1`: rank 0 runs an extra all_reduce before the barrier both run.
/// Every rank fails at once with both ranks' calls named (without the check, rank 0's
/// all_reduce would meet rank 1's barrier).
fn debug_collectives_names_both_calls() {
    let outs = spawn("conditional_collective", 2)
        .env("DRILL_DEBUG_COLLECTIVES", "1")
        .run()
        .unwrap();
    expect_all_ok(&outs);
    for o in &outs {
        assert!(
            o.stdout
                .contains("collectives out of step on group 'world'")
                && o.stdout.contains("rank 0: all_reduce(F32, 16 bytes, Sum)")
                && o.stdout.contains("rank 1: barrier()"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
}

/// The same checks on the MPI backend, under `mpirun -np 2` and `-np 4`.
#[cfg(feature = "mpi")]
fn mpi_collectives() {
    for n in [2, 4] {
        let out = std::process::Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                &n.to_string(),
            ])
            .args([
                "-x",
                "DRILL_TEST_CHILD=collectives",
                "-x",
                "DRILL_BACKEND=mpi",
            ])
            .arg(std::env::current_exe().unwrap())
            .env_remove("RANK")
            .output()
            .expect("mpirun (install openmpi-bin)");
        assert!(
            out.status.success(),
            "mpirun -np {n}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout)
                .matches("shm_peers=")
                .count(),
            n
        );
    }
}

/// With CUDA: the collective checks on NCCL, one rank per visible device (NCCL refuses two
/// ranks on one device). Without: joining must fail with an error naming what is missing.
#[cfg(feature = "nccl")]
fn nccl_backend() {
    match drill_comm::backend::nccl::available_devices() {
        Ok(devices) if devices > 0 => {
            for n in 1..=devices.min(4) {
                let outs = spawn("collectives", n)
                    .env("DRILL_BACKEND", "nccl")
                    .run()
                    .unwrap();
                expect_all_ok(&outs);
            }
            println!(
                "nccl: collectives checked on 1..={} devices",
                devices.min(4)
            );
        }
        other => {
            let outs = spawn("nccl_unavailable", 1)
                .env("DRILL_BACKEND", "nccl")
                .run()
                .unwrap();
            expect_all_ok(&outs);
            assert!(
                outs[0].stdout.contains("libcuda") || outs[0].stdout.contains("CUDA device"),
                "{}",
                outs[0].stdout
            );
            println!("nccl: no usable CUDA here ({other:?}); checked the error path only");
        }
    }
}

// ---------------------------------------------------------------- children

fn run_child(name: &str) {
    if name == "nccl_unavailable" {
        let e = ProcessGroup::from_env().map(|_| ()).unwrap_err();
        assert!(
            matches!(
                e,
                CommError::Backend {
                    backend: "nccl",
                    ..
                }
            ),
            "{e}"
        );
        println!("{e}");
        return;
    }
    let pg = ProcessGroup::from_env().expect("init");
    match name {
        "collectives" => collectives(&pg),
        "dead_peer" => {
            // Rank 2 may die while a slower rank is still inside this barrier: then the
            // barrier itself is the collective that must fail naming it.
            let t = Instant::now();
            let first = pg.barrier();
            if pg.rank() == 2 {
                // SAFETY: kill(2) touches no memory of this process.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            let mut buf = vec![1.0f32; 256];
            let err = match first {
                Err(e) => e,
                Ok(()) => loop {
                    if let Err(e) = pg.all_reduce(&mut buf, ReduceOp::Sum) {
                        break e;
                    }
                    assert!(
                        t.elapsed() < Duration::from_secs(5),
                        "no failure within 5 s"
                    );
                },
            };
            let dt = t.elapsed();
            assert!(dt < Duration::from_secs(5), "took {dt:?}");
            assert_eq!(err.peer(), Some(2), "{err}");
            // Later collectives fail at once too.
            let again = pg.barrier().unwrap_err();
            assert_eq!(again.peer(), Some(2), "{again}");
            println!("named rank 2 after {dt:?}: {err}");
        }
        "peer_left" => {
            pg.barrier().expect("first barrier");
            if pg.rank() == 0 {
                drop(pg);
                return;
            }
            let err = first_all_reduce_error(&pg);
            assert!(matches!(err, CommError::PeerLeft { rank: 0, .. }), "{err}");
            println!("{err}");
        }
        "stopped_peer" => {
            pg.barrier().expect("first barrier");
            if pg.rank() == 2 {
                // Resumed 8 s later (by a helper, since nothing in a stopped process runs),
                // so that it exits and the test ends; the helper outlives it, unwaited.
                let pid = std::process::id();
                #[allow(clippy::zombie_processes)]
                std::process::Command::new("sh")
                    .args(["-c", &format!("sleep 8; kill -CONT {pid}")])
                    .spawn()
                    .expect("start the helper that resumes rank 2");
                // SAFETY: kill(2) touches no memory of this process.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                return;
            }
            let t = Instant::now();
            let err = first_all_reduce_error(&pg);
            let dt = t.elapsed();
            assert_eq!(err.peer(), Some(2), "{err}");
            assert!(dt < Duration::from_secs(5), "took {dt:?}: {err}");
            assert!(err.to_string().contains("on host "), "{err}");
            println!("named rank 2 after {dt:?}: {err}");
        }
        "busy_peer" => {
            if pg.rank() == 1 {
                std::thread::sleep(Duration::from_secs(5));
            }
            let t = Instant::now();
            pg.barrier().expect("a busy peer is alive");
            println!("barrier after {:?}", t.elapsed());
        }
        "hung_peer" => {
            if pg.rank() == 1 {
                std::thread::sleep(Duration::from_secs(4));
                return;
            }
            let t = Instant::now();
            let e = pg.barrier().unwrap_err();
            assert!(matches!(e, CommError::Timeout { rank: 1, .. }), "{e}");
            assert!(t.elapsed() < Duration::from_secs(3));
            println!("{e}");
        }
        "stranger" => {
            if pg.rank() == 0 {
                use std::io::{Read, Write};
                let port: u16 = std::env::var("MASTER_PORT").unwrap().parse().unwrap();
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                let _ = s.write_all(&[0xffu8; 4096]);
                let mut sink = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
                let _ = s.read_to_end(&mut sink);
                let wrong = drill_comm::Store::connect(
                    "127.0.0.1",
                    port,
                    &drill_comm::Token::new("guess"),
                    Duration::from_secs(2),
                );
                assert!(matches!(wrong, Err(CommError::Auth { .. })), "{wrong:?}");
            }
            let mut v = vec![pg.rank() as i64 + 1; 10];
            pg.all_reduce(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v, vec![3i64; 10]);
        }
        "mismatch_len" => {
            let mut v = vec![1.0f32; 10 + 10 * pg.rank()];
            let e = pg.all_reduce(&mut v, ReduceOp::Sum).unwrap_err();
            assert!(matches!(e, CommError::Protocol { .. }), "{e}");
            println!("{e}");
        }
        "conditional_collective" => {
            // Matched calls pass the check.
            let mut v = vec![pg.rank() as f32; 4];
            pg.all_reduce(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v, [1.0; 4]);
            let r = if pg.rank() == 0 {
                pg.all_reduce(&mut v, ReduceOp::Sum)
            } else {
                Ok(())
            };
            let e = r.and_then(|_| pg.barrier()).unwrap_err();
            assert!(matches!(e, CommError::Desync { .. }), "{e}");
            println!("{e}");
        }
        "mismatch_op" => {
            let mut v = vec![1.0f32; 10];
            // The broadcast root may finish (its send is eager); the next call then fails.
            let r = if pg.rank() == 0 {
                pg.broadcast(&mut v, 0)
            } else {
                pg.all_reduce(&mut v, ReduceOp::Sum)
            };
            let e = r.and_then(|_| pg.barrier()).unwrap_err();
            println!("{e}");
        }
        other => panic!("unknown child scenario {other}"),
    }
}

/// Element `i` of rank `r`'s buffer: small integers, so sums, products and means are exact
/// in every dtype (bf16 included) and the reference does not depend on reduction order.
/// All-reduce until one fails (within 10 s) and return its error.
fn first_all_reduce_error(pg: &ProcessGroup) -> CommError {
    let t = Instant::now();
    let mut buf = vec![1.0f32; 256];
    loop {
        if let Err(e) = pg.all_reduce(&mut buf, ReduceOp::Sum) {
            return e;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no failure in 10 s");
    }
}

fn value<T: Element>(r: usize, i: usize) -> T {
    T::from_i64(((r + i) % 3 + 1) as i64)
}

fn reference<T: Element>(n: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let mut acc: Vec<T> = (0..len).map(|i| value(0, i)).collect();
    for r in 1..n {
        let x: Vec<T> = (0..len).map(|i| value(r, i)).collect();
        T::reduce(op.combining(), &mut acc, &x);
    }
    if op == ReduceOp::Avg {
        T::div(&mut acc, n);
    }
    acc
}

const SIZES: [usize; 6] = [0, 1, 7, 1000, 20_001, 100_003];

fn check_dtype<T: Element>(pg: &ProcessGroup) {
    let (n, r) = (pg.world_size(), pg.rank());
    let ctx = |op: &str, len: usize| format!("{op} {} len {len} rank {r}/{n}", T::DTYPE.name());
    for len in SIZES {
        let mine: Vec<T> = (0..len).map(|i| value(r, i)).collect();
        for op in ReduceOp::ALL {
            let mut b = mine.clone();
            pg.all_reduce(&mut b, op).unwrap();
            assert_eq!(
                b,
                reference::<T>(n, len, op),
                "{} {op:?}",
                ctx("all_reduce", len)
            );
            let root = 1 % n;
            let mut b = mine.clone();
            pg.reduce(&mut b, op, root).unwrap();
            if r == root {
                assert_eq!(
                    b,
                    reference::<T>(n, len, op),
                    "{} {op:?}",
                    ctx("reduce", len)
                );
            } else {
                assert_eq!(b, mine, "{}: non-root buffer changed", ctx("reduce", len));
            }
            let full: Vec<T> = (0..len * n).map(|i| value(r, i)).collect();
            let mut part = vec![T::zeroed(); len];
            pg.reduce_scatter(&full, &mut part, op).unwrap();
            let want = reference::<T>(n, len * n, op);
            assert_eq!(
                part,
                want[r * len..(r + 1) * len],
                "{} {op:?}",
                ctx("reduce_scatter", len)
            );
        }
        let root = n - 1;
        let mut b: Vec<T> = if r == root {
            mine.clone()
        } else {
            vec![T::zeroed(); len]
        };
        pg.broadcast(&mut b, root).unwrap();
        assert_eq!(
            b,
            (0..len).map(|i| value(root, i)).collect::<Vec<T>>(),
            "{}",
            ctx("broadcast", len)
        );
        let all: Vec<T> = (0..n)
            .flat_map(|q| (0..len).map(move |i| value::<T>(q, i)))
            .collect();
        let mut g = vec![T::zeroed(); len * n];
        pg.all_gather(&mine, &mut g).unwrap();
        assert_eq!(g, all, "{}", ctx("all_gather", len));
        let mut g = vec![T::zeroed(); len * n];
        pg.gather(&mine, (r == 0).then_some(&mut g[..]), 0).unwrap();
        if r == 0 {
            assert_eq!(g, all, "{}", ctx("gather", len));
        }
        let mut s = vec![T::zeroed(); len];
        pg.scatter((r == root).then_some(&all[..]), &mut s, root)
            .unwrap();
        assert_eq!(
            s,
            (0..len).map(|i| value(r, i)).collect::<Vec<T>>(),
            "{}",
            ctx("scatter", len)
        );
        if n > 1 {
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            let mut got = vec![T::zeroed(); len];
            if r % 2 == 0 {
                pg.send(&mine, next, 7).unwrap();
                pg.recv(&mut got, prev, 7).unwrap();
            } else {
                pg.recv(&mut got, prev, 7).unwrap();
                pg.send(&mine, next, 7).unwrap();
            }
            assert_eq!(
                got,
                (0..len).map(|i| value(prev, i)).collect::<Vec<T>>(),
                "{}",
                ctx("send/recv", len)
            );
        }
        pg.barrier().unwrap();
    }
}

#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug, Clone)]
struct Info {
    name: String,
    values: Vec<f64>,
    step: Option<u64>,
}

fn info(r: usize) -> Info {
    Info {
        name: format!("rank-{r}"),
        values: vec![r as f64; r * 3],
        step: r.is_multiple_of(2).then_some(r as u64),
    }
}

fn collectives(pg: &ProcessGroup) {
    let (n, r) = (pg.world_size(), pg.rank());
    check_dtype::<f32>(pg);
    check_dtype::<f64>(pg);
    check_dtype::<f16>(pg);
    check_dtype::<bf16>(pg);
    check_dtype::<i32>(pg);
    check_dtype::<i64>(pg);
    check_dtype::<u8>(pg);
    let _ = DType::ALL;

    // Objects of different sizes on every rank.
    let b = pg
        .broadcast_object((r == 0).then_some(&info(0)), 0)
        .unwrap();
    assert_eq!(b, info(0));
    assert_eq!(
        pg.all_gather_object(&info(r)).unwrap(),
        (0..n).map(info).collect::<Vec<_>>()
    );
    let g = pg.gather_object(&info(r), n - 1).unwrap();
    assert_eq!(
        g,
        (r == n - 1).then(|| (0..n).map(info).collect::<Vec<_>>())
    );
    let all: Vec<Info> = (0..n).map(info).collect();
    assert_eq!(
        pg.scatter_object((r == 0).then_some(&all[..]), 0).unwrap(),
        info(r)
    );

    // Async work: several in flight, a sync call behind them, results in order.
    let works: Vec<_> = (0..3)
        .map(|k| pg.all_reduce_async(vec![(r + k) as f32; 50_000], ReduceOp::Sum))
        .collect();
    let mut sync = vec![1i32; 3];
    pg.all_reduce(&mut sync, ReduceOp::Sum).unwrap();
    assert_eq!(sync, vec![n as i32; 3]);
    for (k, w) in works.into_iter().enumerate() {
        let want = (0..n).map(|q| (q + k) as f32).sum::<f32>();
        assert!(w.wait().unwrap().iter().all(|&x| x == want));
    }
    let ag = pg.all_gather_async(vec![r as i64; 3]).wait().unwrap();
    assert_eq!(ag, (0..n).flat_map(|q| [q as i64; 3]).collect::<Vec<_>>());
    pg.barrier_async().wait().unwrap();

    // Sub-groups: even ranks, then world again.
    let evens: Vec<usize> = (0..n).step_by(2).collect();
    let sub = pg.new_group(&evens).unwrap();
    assert_eq!(sub.is_some(), r % 2 == 0);
    if let Some(sub) = &sub {
        assert_eq!(sub.rank(), r / 2);
        let mut v = vec![r as i64; 5];
        sub.all_reduce(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, vec![evens.iter().sum::<usize>() as i64; 5]);
        let mut big = vec![1.0f32; 40_000];
        sub.all_reduce(&mut big, ReduceOp::Max).unwrap();
        sub.barrier().unwrap();
    }
    let mut w = vec![1u8; 9];
    pg.all_reduce(&mut w, ReduceOp::Sum).unwrap();
    assert_eq!(w, vec![n as u8; 9]);
    // Usage errors name the problem and do not break the group.
    let e = pg.broadcast(&mut [0f32; 1], n).unwrap_err().to_string();
    assert!(e.contains("not a rank"), "{e}");
    let e = pg
        .all_gather(&[0f32; 2], &mut [0f32; 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected"), "{e}");
    pg.barrier().unwrap();
    println!("shm_peers={}", shm_peers());
}

fn shm_peers() -> usize {
    // Reported through an env-independent probe: count /proc/self/maps entries of our segments.
    std::fs::read_to_string("/proc/self/maps")
        .map(|m| m.lines().filter(|l| l.contains("/dev/shm/drill-")).count())
        .unwrap_or(0)
}
