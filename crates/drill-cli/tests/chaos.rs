//! The fault campaign: training jobs (DQN and PPO data-parallel on 2 ranks, a pipeline split
//! over 3 worker processes, a single process), each hit by one or two faults drawn at random,
//! at a random moment: kill -9 of a rank or of the launcher, SIGSTOP of a rank, SIGINT, the
//! disk filling up under the experiment folder (a tmpfs). With and without `--max-restarts 1`.
//! Then jobs across two hosts made of namespaces (`scripts/netns_hosts.sh`, 1 rank each): a
//! cut link (restored for a restart budget), packet loss, a frozen host, the store's host
//! killed. Then elastic jobs (`drill train --nnodes 2:3`) on three hosts: a host killed,
//! frozen (thawed 4 s later), cut off (restored 4 s later), or started late; the job must
//! reach its step limit without spending a restart (`--max-restarts 0`), the hosts that
//! stayed exit 0 and so does one that came back (rejoined, or found the job finished; if the
//! store's launcher had already exited, it must say it cannot rejoin), the counters of every
//! restart never go back.
//! Every drawn fault is injected (the pid it hits found, or the job's own) or counted as not
//! injected with the reason; none is dropped. Every job is checked against what its faults
//! must lead to:
//! - a single process killed (kill -9): `--resume` starts from the newest checkpoint and
//!   reaches the step limit; stopped (SIGSTOP, continued 1.5 s later): it reaches the limit;
//! - a lost rank (kill -9, SIGSTOP): a non-zero exit whose log names that rank by number
//!   (not the `[rank N]` prefixes nor the "rank R of W" every rank says); with
//!   `--max-restarts 1`, one such fault ends in a restart that reaches the step limit, a
//!   second one in "giving up after 1 restart(s)";
//! - a killed launcher: its status is SIGKILL and every rank is gone within 10 s;
//! - a full disk: exit 1, the log names it, and result.json's error is the full disk (the root
//!   cause, whichever rank writes it); a job that exits 0 never filled its disk: a violation;
//! - SIGINT: exit 130 (then `--resume` must start from the newest checkpoint, as its
//!   `run/resumed` mark says, and reach the step limit, within [`BOUND`]), or, before the
//!   handler is installed, death by SIGINT; any other ending is a violation;
//! - every job ends within [`BOUND`], failures within [`ERROR_BOUND`] of their fault
//!   ([`RENDEZVOUS_BOUND`] in the rendezvous);
//! - nothing is left behind: no process of the job, no `/dev/shm/drill-*` segment;
//! - every checkpoint on disk loads, metrics.jsonl's lines and TensorBoard's records parse, a
//!   restart starts from the newest checkpoint there was at the fault or a newer one, and no
//!   checkpoint is ahead of result.json.
//!
//! `CHAOS_JOBS` jobs on one host (default 12, what CI runs), `CHAOS_NET_JOBS` on two (default
//! 4) and `CHAOS_ELASTIC_JOBS` elastic ones on three (default 3) from seed `CHAOS_SEED`
//! (default 0); the table of
//! faults by kind and phase, outcomes, the longest time from a fault to the job's error and
//! every violation is printed (`--nocapture`). Needs root (the tmpfs): `cargo test --release -p
//! drill-cli --features netns --test chaos -- --nocapture --test-threads 1`.
//!
//! The checks proven: built with the planted bugs (`--features netns,plant`), one more test
//! plants each bug of `drill-plant` in turn into `CHAOS_PLANT_JOBS` one-host jobs (default 20,
//! seed `CHAOS_SEED`) and fails unless every bug makes the campaign report a violation.
#![cfg(feature = "netns")]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use drill_fuzz::Rng;

mod common;

use common::netns::Hosts;
use common::{Tmpfs, repo};

/// The longest a job may take, faults and all.
const BOUND: Duration = Duration::from_secs(90);
/// The longest a failing job may take to end after its fault.
const ERROR_BOUND: Duration = Duration::from_secs(15);
/// The same for a fault in the rendezvous, before any heartbeat runs: the rendezvous
/// timeout (60 s for the ranks and workers `drill train` starts) bounds it.
const RENDEZVOUS_BOUND: Duration = Duration::from_secs(70);
/// Less than the soonest a rank can call a silent peer lost (drill-comm's heartbeat timeout,
/// 3 s): a survivor that ends sooner after a network fault had all it needed before it.
const BEFORE_NOTICED: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    DqnDdp,
    PpoDdp,
    Split,
    Single,
}

impl Kind {
    fn args(self) -> Vec<&'static str> {
        match self {
            Kind::DqnDdp => vec![
                "configs/cartpole_dqn_ddp.toml",
                "--nproc-per-node",
                "2",
                "--set",
                "env.stop_value=1000",
                "--set",
                "max_env_step=5000",
            ],
            Kind::PpoDdp => vec![
                "configs/cartpole_ppo_ddp.toml",
                "--nproc-per-node",
                "2",
                "--set",
                "env.stop_value=100000",
                "--set",
                "max_env_step=300000",
            ],
            // Its one collector may leave: the learner then waits task.timeout for one to
            // join before it fails naming it, which must stay within ERROR_BOUND.
            Kind::Split => vec![
                "configs/cartpole_dqn_3roles.toml",
                "--set",
                "env.stop_value=1000",
                "--set",
                "max_env_step=5000",
                "--set",
                "task.timeout=6",
            ],
            Kind::Single => vec![
                "configs/cartpole_dqn.toml",
                "--threads",
                "1",
                "--set",
                "env.stop_value=1000",
                "--set",
                "max_env_step=5000",
            ],
        }
    }

    fn step_limit(self) -> u64 {
        match self {
            Kind::PpoDdp => 300_000,
            _ => 5000,
        }
    }

    fn processes(self) -> usize {
        match self {
            Kind::DqnDdp | Kind::PpoDdp => 2,
            Kind::Split => 3,
            Kind::Single => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillRank,
    KillLauncher,
    StopRank,
    Sigint,
    DiskFull,
}

/// One job's draw.
#[derive(Debug)]
struct Plan {
    kind: Kind,
    restarts: bool,
    /// Faults and when: after the start (the second of a restart job's two: after the first).
    faults: Vec<(Fault, Duration)>,
}

fn draw(rng: &mut Rng) -> Plan {
    let kind = *rng.pick(&[Kind::DqnDdp, Kind::PpoDdp, Kind::Split, Kind::Single]);
    let multi = kind != Kind::Single;
    let restarts = multi && rng.below(2) == 0;
    // A single process is killed or stopped as a rank is (it is its own rank); a stopped one
    // is continued 1.5 s later.
    let mut kinds = vec![
        Fault::Sigint,
        Fault::DiskFull,
        Fault::KillRank,
        Fault::StopRank,
    ];
    if multi {
        kinds.push(Fault::KillLauncher);
    }
    let first = *rng.pick(&kinds);
    // A third of the faults land in the first 300 ms (rendezvous, the first broadcast), the
    // rest while the job trains (collection, all-reduces, evaluations, checkpoints).
    let at = |rng: &mut Rng| {
        Duration::from_millis(if rng.below(3) == 0 {
            rng.below(300)
        } else {
            300 + rng.below(2200)
        } as u64)
    };
    let mut faults = vec![(first, at(rng))];
    // A restart job may be hit again after it restarted.
    if restarts && matches!(first, Fault::KillRank | Fault::StopRank) && rng.below(2) == 0 {
        let second = *rng.pick(&[Fault::KillRank, Fault::StopRank, Fault::Sigint]);
        faults.push((second, Duration::from_millis(1000) + at(rng)));
    }
    Plan {
        kind,
        restarts,
        faults,
    }
}

/// What one job did.
#[derive(Debug, Default)]
struct Report {
    outcome: String,
    /// (fault, phase) for each fault injected.
    injected: Vec<(Fault, &'static str)>,
    /// (fault, why) for each fault drawn but not injected (the job ended first, or the
    /// process it was to hit never appeared): counted, never dropped.
    missed: Vec<(Fault, &'static str)>,
    /// The rank each injected rank fault hit, in order.
    hit: Vec<usize>,
    /// The newest loadable checkpoint's (env steps, iterations) when the first fault hit.
    ckpt_at_fault: Option<(u64, u64)>,
    /// From the first fault to the job's end, when it failed.
    time_to_error: Option<Duration>,
    violations: Vec<String>,
}

/// Pids of the processes started for job `id` (they carry `DRILL_CHAOS=id`), with their env.
fn job_processes(id: &str) -> Vec<(i32, Vec<String>)> {
    let marker = format!("DRILL_CHAOS={id}");
    let mut out = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<String> = env
            .split(|&b| b == 0)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .collect();
        if vars.contains(&marker) {
            out.push((pid, vars));
        }
    }
    out
}

/// Wait up to 10 s for every process of job `id` to be gone; a violation if any is left.
fn expect_gone(id: &str, r: &mut Report) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !job_processes(id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = job_processes(id).len();
    if left > 0 {
        r.violations
            .push(format!("{left} processes left 10 s after the job ended"));
    }
}

/// Kill whatever of job `id` still runs (stopped processes included).
fn kill_job(id: &str) {
    for (pid, _) in job_processes(id) {
        signal(pid, libc::SIGCONT);
        signal(pid, libc::SIGKILL);
    }
}

/// An integer from the environment variable `key`, else `default`.
fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What a campaign counted: outcomes by (fault, phase), violations, the longest time from
/// a fault to its job's error, and when it began.
struct Tally {
    table: BTreeMap<(String, &'static str), BTreeMap<String, usize>>,
    violations: Vec<String>,
    longest: Duration,
    t0: Instant,
}

impl Tally {
    fn new() -> Self {
        Tally {
            table: BTreeMap::new(),
            violations: vec![],
            longest: Duration::ZERO,
            t0: Instant::now(),
        }
    }

    /// Note job `who`'s (drawn as `what`) time to error and violations, printing these.
    fn note(&mut self, who: &str, what: &str, r: &Report) {
        self.longest = self.longest.max(r.time_to_error.unwrap_or_default());
        for v in &r.violations {
            println!("  VIOLATION {who}: {v}");
            self.violations.push(format!("{who} ({what}): {v}"));
        }
    }

    /// Count one job's `outcome` under (`fault`, `phase`).
    fn count(&mut self, fault: String, phase: &'static str, outcome: &str) {
        *self
            .table
            .entry((fault, phase))
            .or_default()
            .entry(outcome.to_string())
            .or_default() += 1;
    }

    /// Print the table under a `what` column and the summary line, and fail on any violation.
    fn report(&self, title: &str, what: &str, jobs: usize, seed: u64) {
        println!("\n| {what} | phase | outcomes (jobs) |\n|---|---|---|");
        for ((fault, phase), outcomes) in &self.table {
            let o: Vec<String> = outcomes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            println!("| {fault} | {phase} | {} |", o.join("; "));
        }
        println!(
            "\n{title}: {jobs} jobs (seed {seed}) in {:.0} s, {} violations, longest fault-to-error {:.1?}",
            self.t0.elapsed().as_secs_f64(),
            self.violations.len(),
            self.longest
        );
        assert!(self.violations.is_empty(), "{}", self.violations.join("\n"));
    }
}

/// The pid of rank `rank` of job `id`'s newest attempt, at least attempt `attempt` (a second
/// fault must hit the restarted group, not the stopped rank of the first), waiting up to
/// `wait` for it to exist.
fn rank_pid(id: &str, rank: usize, attempt: u64, wait: Duration) -> Option<i32> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        let ranks: Vec<(i32, u64)> = job_processes(id)
            .into_iter()
            .filter(|(_, env)| env.iter().any(|v| *v == format!("RANK={rank}")))
            .map(|(pid, env)| {
                let restart = env
                    .iter()
                    .find_map(|v| v.strip_prefix("DRILL_RESTART_COUNT="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                (pid, restart)
            })
            .collect();
        if let Some(&(pid, _)) = ranks
            .iter()
            .filter(|(_, r)| *r >= attempt)
            .max_by_key(|(_, r)| *r)
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(pid, sig) };
}

fn shm_segments() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("drill-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Wait for `child` until `deadline`; `None` if it is still running.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn spawn(id: &str, kind: Kind, exp: &Path, extra: &[&str], log: &Path) -> Child {
    let args = kind.args();
    Command::new(env!("CARGO_BIN_EXE_drill"))
        .arg("train")
        .arg(repo().join(args[0]))
        .args(&args[1..])
        .args(["--quiet", "--exp-dir"])
        .arg(exp)
        .args(extra)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env("DRILL_CHAOS", id)
        .env("DRILL_PLANT", planted())
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(log).unwrap(),
        ))
        .spawn()
        .unwrap()
}

/// Counters of every checkpoint in `exp`: each must load.
fn checkpoints(exp: &Path, v: &mut Vec<String>) -> Vec<(String, u64, u64)> {
    let mut out = vec![];
    let Ok(dir) = std::fs::read_dir(exp.join("ckpt")) else {
        return out;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".safetensors") || name.starts_with('.') || name.starts_with("replay") {
            continue;
        }
        match drill_exp::Checkpoint::load(&e.path()) {
            Ok(ck) => match (ck.counter("env_steps"), ck.counter("train_iters")) {
                (Ok(s), Ok(i)) => out.push((name, s, i)),
                _ => v.push(format!("{name}: no counters")),
            },
            Err(err) => v.push(format!("{name} does not load: {err}")),
        }
    }
    out
}

/// Whether `log`'s failure lines (the launcher's, and the errors the ranks print) name rank
/// `r` as the one that failed: "rank R" not as the launcher's `[rank N] ` prefix (who printed
/// a line) nor as "rank R of W" (who is speaking, as every error begins). Lines that are not
/// about the failure (each rank's "rank R on HOST: shared memory with ..." at start) do not
/// count. A split run's survivors name a lost worker as "node R" (not the launcher's
/// "(node N, pid P)", which names the host, nor a speaker's "node N: ").
fn names_rank(log: &str, r: usize) -> bool {
    let needles = [format!("rank {r}"), format!("node {r}")];
    log.lines().any(|line| {
        let body = line
            .strip_prefix("[rank ")
            .and_then(|l| l.split_once("] "))
            .map_or(line, |(_, b)| b);
        let about_the_failure = body.starts_with("drill launch:")
            || body.starts_with("error:")
            || body.contains(" ERROR ");
        about_the_failure
            && needles.iter().any(|needle| {
                body.match_indices(needle.as_str()).any(|(i, _)| {
                    let after = &body[i + needle.len()..];
                    !after.starts_with(|c: char| c.is_ascii_digit())
                        && !after.starts_with(" of ")
                        && !after.starts_with(':')
                        && !body[..i].ends_with('(')
                })
            })
    })
}

/// The newest loadable checkpoint's (env steps, iterations) in `exp`, as a restart or resume
/// must choose it.
fn newest(exp: &Path) -> Option<(u64, u64)> {
    let ck = drill_exp::Checkpoint::newest_in(exp).ok()??;
    Some((
        ck.counter("env_steps").ok()?,
        ck.counter("train_iters").ok()?,
    ))
}

/// Every (env step, iteration) the run's `run/resumed` marks say a part of it started from,
/// in order; a violation for any line of metrics.jsonl that is not JSON (a torn last line,
/// left by a kill -9 mid-write, is allowed: the next append cuts it).
fn resume_marks(exp: &Path, v: &mut Vec<String>) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(exp.join("metrics.jsonl")).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    let mut marks = vec![];
    for (n, line) in complete.lines().enumerate() {
        let Ok(j) = serde_json::from_str::<serde_json::Value>(line) else {
            v.push(format!("metrics.jsonl:{}: not JSON: {line:?}", n + 1));
            continue;
        };
        if j["tag"] == drill_exp::RESUMED_ITER_TAG {
            marks.push((
                j["step"].as_u64().unwrap_or(u64::MAX),
                j["value"].as_f64().map_or(u64::MAX, |x| x as u64),
            ));
        }
    }
    // TensorBoard's files: each record's length and checksums must hold.
    if let Ok(d) = std::fs::read_dir(exp.join("tb")) {
        for e in d.flatten() {
            // A record cut short at the end (a kill -9 mid-write) is what TensorBoard skips.
            match drill_exp::read_scalars(&e.path()) {
                Err(err)
                    if !(err.to_string().ends_with("truncated record")
                        || err.to_string().ends_with("truncated record header")) =>
                {
                    v.push(format!("{} does not parse: {err}", e.path().display()))
                }
                _ => {}
            }
        }
    }
    marks
}

fn result(exp: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(exp.join("result.json")).ok()?).ok()
}

fn run_job(n: usize, plan: &Plan) -> Report {
    let id = format!("{}-{n}", std::process::id());
    let root = std::env::temp_dir().join(format!("drill-chaos-{id}"));
    std::fs::create_dir_all(&root).unwrap();
    let disk_full = plan.faults.iter().any(|f| f.0 == Fault::DiskFull);
    let _tmpfs = disk_full.then(|| {
        // Two checkpoints of the job's net fit, a third does not.
        let size = if plan.kind == Kind::PpoDdp { 500 } else { 1500 };
        Tmpfs::mount(&root, size)
    });
    let log_dir = std::env::temp_dir().join(format!("drill-chaos-logs-{id}"));
    std::fs::create_dir_all(&log_dir).unwrap();
    let exp = root.join("run");
    let shm_before = shm_segments();
    let mut r = Report::default();
    let mut extra: Vec<&str> = vec![];
    if plan.restarts {
        extra.extend(["--max-restarts", "1"]);
    }
    let start = Instant::now();
    let mut child = spawn(&id, plan.kind, &exp, &extra, &log_dir.join("job.log"));
    let mut first_fault: Option<Instant> = None;
    // The fault that ends the job: the second of a restart job's two, once it is injected.
    let mut last_fault: Option<Instant> = None;
    let mut status = None;
    for &(fault, at) in &plan.faults {
        if fault == Fault::DiskFull {
            r.injected.push((fault, "checkpoint write"));
            first_fault.get_or_insert(start);
            last_fault = Some(start);
            continue;
        }
        // The second fault of a restart job counts from the first.
        let when = first_fault.map_or(start, |f| f.max(start)) + at;
        status = wait_until(&mut child, when);
        if status.is_some() {
            r.missed.push((fault, "the job ended first"));
            continue;
        }
        let target = match fault {
            Fault::KillRank | Fault::StopRank if plan.kind == Kind::Single => {
                Some((child.id() as i32, None))
            }
            Fault::KillRank | Fault::StopRank => {
                // A second fault hits the restarted group (attempt 1), waiting for it.
                let rank = rng_rank(n + r.hit.len(), plan.kind.processes());
                let (attempt, wait) = if r.injected.is_empty() {
                    (0, Duration::from_secs(5))
                } else {
                    (1, Duration::from_secs(30))
                };
                rank_pid(&id, rank, attempt, wait).map(|pid| (pid, Some(rank)))
            }
            _ => Some((child.id() as i32, None)),
        };
        let Some((pid, rank)) = target else {
            r.missed.push((fault, "its rank's process never appeared"));
            continue;
        };
        let so_far = std::fs::read_to_string(log_dir.join("job.log")).unwrap_or_default();
        // The restarted group is in its rendezvous until one of its ranks says it trains.
        let restarted_part = so_far.rsplit("restarting the group").next().unwrap_or("");
        let phase = if !r.injected.is_empty() {
            if restarted_part.contains("INFO training ") {
                "after a restart (training)"
            } else {
                "after a restart (rendezvous)"
            }
        } else if !so_far.contains("INFO training ") {
            "startup (rendezvous)"
        } else if !so_far.contains("eval at env step") {
            "first broadcast, first evaluation"
        } else {
            "training"
        };
        if r.injected.is_empty() {
            r.ckpt_at_fault = newest(&exp);
        }
        r.hit.extend(rank);
        match fault {
            Fault::KillRank | Fault::KillLauncher => signal(pid, libc::SIGKILL),
            Fault::StopRank => signal(pid, libc::SIGSTOP),
            Fault::Sigint => signal(pid, libc::SIGINT),
            Fault::DiskFull => unreachable!(),
        }
        first_fault.get_or_insert_with(Instant::now);
        last_fault = Some(Instant::now());
        r.injected.push((fault, phase));
        if fault == Fault::StopRank && plan.kind == Kind::Single {
            std::thread::sleep(Duration::from_millis(1500));
            signal(pid, libc::SIGCONT);
        }
    }
    let status = status.or_else(|| wait_until(&mut child, start + BOUND));
    let ended = Instant::now();
    let log = std::fs::read_to_string(log_dir.join("job.log")).unwrap_or_default();
    let Some(status) = status else {
        r.violations
            .push(format!("hang: still running after {BOUND:?}"));
        r.outcome = "hang".into();
        kill_job(&id);
        let _ = child.wait();
        cleanup(&id, &root, &log_dir, &shm_before, &mut r);
        return r;
    };
    // Whatever the outcome, every process of the job is gone soon after (killed launchers'
    // ranks die with them).
    expect_gone(&id, &mut r);
    let code = status.code();
    let killed_by = {
        use std::os::unix::process::ExitStatusExt;
        status.signal()
    };
    let injected: Vec<Fault> = r.injected.iter().map(|f| f.0).collect();
    let named = |what: &str| log.contains(what);
    let limit = plan.kind.step_limit();
    let reached = |res: &serde_json::Value| {
        res["env_steps"].as_u64().unwrap_or(0) >= limit || res["stop_reached"] == true
    };
    let restarted = log.contains("restarting the group");
    let counters = checkpoints(&exp, &mut r.violations);
    // What the draw makes of the job: the rank faults it took (a restart job's budget is one).
    let rank_faults = r
        .injected
        .iter()
        .filter(|f| matches!(f.0, Fault::KillRank | Fault::StopRank))
        .count();
    let last_rank = r.hit.last().copied();
    r.outcome = if status.success() {
        match result(&exp) {
            Some(res) if reached(&res) => {
                if injected.contains(&Fault::DiskFull) {
                    r.violations
                        .push("exit 0 with the disk full: it never filled".into());
                }
                if plan.restarts && rank_faults > 1 {
                    r.violations.push(format!(
                        "exit 0 after {rank_faults} rank faults with --max-restarts 1"
                    ));
                }
                if restarted {
                    "restarted, reached the step limit".into()
                } else {
                    "reached the step limit".into()
                }
            }
            Some(res) => {
                r.violations
                    .push(format!("exit 0 short of the step limit: {res}"));
                "exit 0 early".into()
            }
            None => {
                r.violations.push("exit 0 without result.json".into());
                "exit 0 without result".into()
            }
        }
    } else if code == Some(130) {
        if !injected.contains(&Fault::Sigint) {
            r.violations.push("exit 130 without a SIGINT".into());
        }
        // Interrupted: `final` and result.json written; resuming reaches the step limit and
        // no counter goes backwards.
        let before = result(&exp);
        // A SIGINT that reaches a restarted group before its ranks train (between attempts,
        // or in the new attempt's rendezvous) stops it before any rank writes: result.json is
        // the failed attempt's, or absent. Only a group that trained owes an interrupted one.
        // A fault that ended the attempt before the interrupt could (a stopped rank named
        // while its peer waited) leaves result.json saying that fault.
        let said = before
            .as_ref()
            .is_some_and(|b| b["interrupted"] == true || b["error"].is_string());
        // Interrupted before anything was trained (no checkpoint yet): nothing to say.
        let trained = std::fs::read_dir(exp.join("ckpt")).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        });
        if !restarted && !said && trained {
            r.violations
                .push("exit 130 without result.json saying why".into());
        }
        resume_to_the_limit(&id, plan.kind, &exp, "interrupted", &mut r)
    } else if injected.contains(&Fault::KillLauncher) {
        if killed_by != Some(libc::SIGKILL) {
            r.violations.push(format!(
                "the killed launcher ended with {status}, not SIGKILL"
            ));
        }
        "launcher killed, every rank gone".into()
    } else if injected.contains(&Fault::DiskFull) {
        if code != Some(1) {
            r.violations.push(format!(
                "a full disk ended the job with {status}, not exit 1"
            ));
        }
        if !named("no space left on the device for") {
            r.violations
                .push(format!("a full disk not named: {}", tail(&log)));
        }
        // The root cause reaches result.json, whichever rank writes (a rank that noticed
        // rank 0 leave must not overwrite rank 0's full disk).
        match result(&exp) {
            Some(res)
                if res["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("no space")) => {}
            Some(res) => r
                .violations
                .push(format!("result.json does not say why: {res}")),
            None if named("cannot write") => {}
            None => r
                .violations
                .push("no result.json, and the log does not say it could not be written".into()),
        }
        "failed naming the full disk".into()
    } else if plan.kind == Kind::Single && injected.contains(&Fault::KillRank) {
        // kill -9 of a lone process: nothing to name it, but the folder must resume.
        if killed_by != Some(libc::SIGKILL) {
            r.violations.push(format!(
                "the killed process ended with {status}, not SIGKILL"
            ));
        }
        resume_to_the_limit(&id, plan.kind, &exp, "killed", &mut r)
    } else if plan.kind == Kind::Single && injected.contains(&Fault::StopRank) {
        r.violations.push(format!(
            "stopped and continued, it ended with {status}: {}",
            tail(&log)
        ));
        "stopped and continued, failed".into()
    } else if let Some(rank) = last_rank {
        if code.is_none() || code == Some(0) {
            r.violations
                .push(format!("a lost rank ended the job with {status}"));
        }
        if !names_rank(&log, rank) {
            r.violations.push(format!(
                "the failure does not name rank {rank}, the one hit: {}",
                tail(&log)
            ));
        }
        // A restart budget of one is used by the first rank fault and spent by the second.
        if plan.restarts && rank_faults == 1 {
            r.violations.push(format!(
                "one rank fault with --max-restarts 1 did not end in a restart that reached the step limit: {}",
                tail(&log)
            ));
        }
        if plan.restarts && rank_faults > 1 && !named("giving up after 1 restart(s)") {
            r.violations.push(format!(
                "the spent restart budget is not said: {}",
                tail(&log)
            ));
        }
        "failed naming the rank".into()
    } else if injected.contains(&Fault::Sigint) {
        // SIGINT before the handler is installed (startup) ends the job by the signal.
        if killed_by != Some(libc::SIGINT) {
            r.violations
                .push(format!("after a SIGINT the job ended with {status}"));
        }
        "interrupted during startup".into()
    } else {
        r.violations
            .push(format!("failed with no fault injected: {}", tail(&log)));
        "failed without a fault".into()
    };
    // Every job ends within a bound of the fault that ended it (the last injected): the
    // error bound for a failure (the rendezvous bound when a fault hit a rendezvous), the
    // same for a killed launcher's ranks to be gone (measured by expect_gone above), the
    // job's bound for a full disk.
    if !status.success()
        && code != Some(130)
        && let Some(f) = last_fault
    {
        let dt = ended.duration_since(f);
        r.time_to_error = Some(dt);
        let in_rendezvous = r.injected.iter().any(|f| f.1.contains("rendezvous"));
        let bound = if injected.contains(&Fault::DiskFull) {
            BOUND
        } else if in_rendezvous {
            RENDEZVOUS_BOUND
        } else {
            ERROR_BOUND
        };
        if dt > bound {
            r.violations
                .push(format!("took {dt:?} from the fault to the end"));
        }
    }
    // A restart started from the newest checkpoint there was when the fault hit, or a newer
    // one (the survivors may save after it), as its run/resumed mark says.
    // A second fault may stop the restarted group before its rank 0 chose a checkpoint (it
    // says which, or that there is none, on the line before it writes the mark): then there
    // is no mark to check.
    let marks = resume_marks(&exp, &mut r.violations);
    let chose =
        log.contains("restart 1: resuming from") || log.contains("restart 1: no checkpoint");
    if restarted && let Some(at) = r.ckpt_at_fault {
        match marks.first() {
            Some(m) if m.0 < at.0 || m.1 < at.1 => r.violations.push(format!(
                "the restart started from (env step, iteration) {m:?}, older than the checkpoint {at:?} there was"
            )),
            None if chose || status.success() => r.violations.push(format!(
                "restarted without a run/resumed mark (the checkpoint there was: {at:?})"
            )),
            _ => {}
        }
    }
    none_ahead(&exp, &counters, &mut r);
    cleanup(&id, &root, &log_dir, &shm_before, &mut r);
    r
}

/// Counters: no checkpoint of `exp` (its `counters`) ahead of the run's final result.
fn none_ahead(exp: &Path, counters: &[(String, u64, u64)], r: &mut Report) {
    let Some(res) = result(exp) else { return };
    let (steps, iters) = (
        res["env_steps"].as_u64().unwrap_or(0),
        res["train_iters"].as_u64().unwrap_or(0),
    );
    for (name, s, i) in counters {
        if *s > steps || *i > iters {
            r.violations.push(format!(
                "{name} ({s} env steps, {i} iters) is ahead of result.json ({steps}, {iters})"
            ));
        }
    }
}

/// The rank a job's fault hits (a function of the job number, so a seed repeats the campaign).
/// `drill train --resume` of job `id`'s folder `exp` after it stopped (`how`: interrupted,
/// killed): bounded like a job, it must start from the newest checkpoint there was, as its
/// `run/resumed` mark says, and reach the step limit with no counter going back. Returns the
/// outcome.
fn resume_to_the_limit(id: &str, kind: Kind, exp: &Path, how: &str, r: &mut Report) -> String {
    let reached = |res: &serde_json::Value| {
        res["env_steps"].as_u64().unwrap_or(0) >= kind.step_limit() || res["stop_reached"] == true
    };
    // Interrupted before the run created its folder: nothing to resume.
    let started = exp.join("config.toml").is_file();
    // The state the resume must start from.
    let from = newest(exp);
    let marks_before = resume_marks(exp, &mut vec![]).len();
    let mut resume = Command::new(env!("CARGO_BIN_EXE_drill"));
    resume
        .args(["train", "--quiet", "--resume"])
        .arg(exp)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env("DRILL_CHAOS", id)
        .env("DRILL_PLANT", planted())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if kind == Kind::DqnDdp || kind == Kind::PpoDdp {
        resume.args(["--nproc-per-node", "2"]);
    }
    let out = if started {
        // Bounded like the job: a resume that hangs is a violation, not a hung test.
        let mut c = resume.spawn().unwrap();
        let t = Instant::now();
        match wait_until(&mut c, t + BOUND) {
            Some(_) => Some(c.wait_with_output().unwrap()),
            None => {
                kill_job(id);
                let _ = c.kill();
                let _ = c.wait();
                None
            }
        }
    } else {
        None
    };
    let after = result(exp);
    match (out, after) {
        _ if !started => format!("{how} before the run started"),
        (None, _) => {
            r.violations
                .push(format!("the resume hung: still running after {BOUND:?}"));
            format!("{how}, resume hung")
        }
        (Some(out), Some(a)) if out.status.success() && reached(&a) => {
            // It started from the newest checkpoint there was, as its mark says, and
            // ended at or past it.
            let marks = resume_marks(exp, &mut r.violations);
            match (from, marks.get(marks_before)) {
                (Some(f), Some(m)) if *m != f => r.violations.push(format!(
                    "the resume started from (env step, iteration) {m:?}, the newest checkpoint is {f:?}"
                )),
                (Some(f), None) => r.violations.push(format!(
                    "the resume left no run/resumed mark (the newest checkpoint is {f:?})"
                )),
                _ => {}
            }
            if let Some(f) = from
                && (a["env_steps"].as_u64() < Some(f.0) || a["train_iters"].as_u64() < Some(f.1))
            {
                r.violations
                    .push(format!("counters went backwards: {f:?} then {a}"));
            }
            format!("{how}, resumed to the step limit")
        }
        (Some(out), _) => {
            r.violations.push(format!(
                "the resume did not reach the step limit ({}): {}",
                out.status,
                tail(&format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ))
            ));
            format!("{how}, resume failed")
        }
    }
}

fn rng_rank(n: usize, processes: usize) -> usize {
    (n * 7 + 3) % processes
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

fn cleanup(id: &str, root: &Path, logs: &Path, shm_before: &[String], r: &mut Report) {
    let new_shm: Vec<String> = shm_segments()
        .into_iter()
        .filter(|s| !shm_before.contains(s))
        .collect();
    if !new_shm.is_empty() {
        r.violations
            .push(format!("shared memory left in /dev/shm: {new_shm:?}"));
        for s in new_shm {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(s));
        }
    }
    kill_job(id);
    keep(id, &[root.join("run"), logs.to_path_buf()], r);
    let _ = std::fs::remove_dir_all(root.join("run"));
    let _ = std::fs::remove_dir_all(logs);
    if std::fs::read_dir(root).is_ok_and(|mut d| d.next().is_none()) {
        let _ = std::fs::remove_dir(root);
    }
}

/// With `CHAOS_KEEP=DIR`, a job with a violation leaves copies of `paths` (its log, its
/// experiment folder) in `DIR/ID/`, named in its first violation; without it nothing stays.
fn keep(id: &str, paths: &[std::path::PathBuf], r: &mut Report) {
    let Some(dir) = std::env::var_os("CHAOS_KEEP") else {
        return;
    };
    if r.violations.is_empty() {
        return;
    }
    let to = Path::new(&dir).join(id);
    let _ = std::fs::create_dir_all(&to);
    for p in paths {
        let _ = Command::new("cp").arg("-a").arg(p).arg(&to).status();
    }
    r.violations[0] += &format!(" (kept in {})", to.display());
}

/// The bugs planted in the jobs this test process starts (`DRILL_PLANT`; empty: none).
static PLANTED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn planted() -> String {
    PLANTED.lock().unwrap().clone()
}

#[test]
fn every_fault_ends_the_job_cleanly_and_keeps_the_promises() {
    let jobs: usize = env_or("CHAOS_JOBS", 12);
    let seed: u64 = env_or("CHAOS_SEED", 0);
    let tally = one_host_jobs(jobs, seed);
    tally.report("chaos", "fault", jobs, seed);
}

/// What happens to an APPO split run's collectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CollectorFault {
    /// kill -9 of one collector (whose learner keeps another).
    Kill,
    /// SIGSTOP of one collector (whose learner keeps another), never continued (a frozen
    /// process).
    Freeze,
    /// A collector joins (`drill train --join`).
    Join,
    /// Every collector of a learner killed, then one joins (and must feed that learner).
    KillAllThenJoin,
}

/// Where a collector job's roles run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// The learner and the evaluator on node 0, collectors on nodes 1 and 2.
    OneLearner,
    /// The evaluator on node 0, a data-parallel group of two learners on nodes 1 and 2
    /// (`policy.multi_gpu`), collectors on nodes 3 and 5 (learner 0's) and 4 (learner 1's).
    Group,
}

impl Layout {
    fn roles(self) -> &'static str {
        match self {
            Layout::OneLearner => {
                r#"task.roles={"node.0"=["learner","evaluator"],"node.[12]"=["collector"]}"#
            }
            Layout::Group => {
                r#"task.roles={"node.0"=["evaluator"],"node.[12]"=["learner"],"node.[345]"=["collector"]}"#
            }
        }
    }

    fn workers(self) -> usize {
        match self {
            Layout::OneLearner => 3,
            Layout::Group => 6,
        }
    }

    /// The collectors one of which may leave alone (their learner keeps the other).
    fn spare(self) -> [usize; 2] {
        match self {
            Layout::OneLearner => [1, 2],
            Layout::Group => [3, 5],
        }
    }

    /// The collectors of the learner that [`CollectorFault::KillAllThenJoin`] starves, and,
    /// where a joiner has learners to choose from, that learner's rank among them.
    fn starved(self) -> (&'static [usize], Option<usize>) {
        match self {
            Layout::OneLearner => (&[1, 2], None),
            Layout::Group => (&[4], Some(1)),
        }
    }

    fn phase(self) -> &'static str {
        match self {
            Layout::OneLearner => "training, one learner",
            Layout::Group => "training, a group of 2 learners",
        }
    }
}

/// `CHAOS_COLLECTOR_JOBS` APPO split runs (default 3) from seed `CHAOS_SEED`, one learner or
/// a group of two ([`Layout`]), each hit by one or two collector faults at random moments,
/// with no restart budget: the run must reach its step limit and exit 0 (only a learner's
/// loss ends it), its log must name every collector that left and every one that joined, a
/// joined collector must exit 0 with the run (after a learner lost all its collectors,
/// feeding that learner), the counters must hold whole rollouts only and no checkpoint be
/// ahead of result.json, and nothing may be left behind.
#[test]
fn collectors_come_and_go_and_the_learner_goes_on() {
    let jobs: usize = env_or("CHAOS_COLLECTOR_JOBS", 3);
    let seed: u64 = env_or("CHAOS_SEED", 0);
    let mut rng = Rng::new(seed ^ 0xc011);
    let mut tally = Tally::new();
    let faults = [
        CollectorFault::Kill,
        CollectorFault::Freeze,
        CollectorFault::Join,
        CollectorFault::KillAllThenJoin,
    ];
    for n in 0..jobs {
        let layout = *rng.pick(&[Layout::OneLearner, Layout::Group]);
        let mut drawn = vec![(*rng.pick(&faults), 300 + rng.below(1500) as u64)];
        if drawn[0].0 != CollectorFault::KillAllThenJoin && rng.below(2) == 0 {
            let second = *rng.pick(&faults[..3]);
            drawn.push((second, drawn[0].1 + 300 + rng.below(1200) as u64));
        }
        let r = collector_job(n, layout, &drawn);
        println!("collector job {n} ({layout:?}): {drawn:?} -> {}", r.outcome);
        for (f, _) in &drawn {
            tally.count(format!("{f:?}"), layout.phase(), &r.outcome);
        }
        tally.note(&format!("collector job {n}"), &format!("{drawn:?}"), &r);
    }
    tally.report("chaos collectors", "collector fault", jobs, seed);
}

/// One APPO split run of [`collectors_come_and_go_and_the_learner_goes_on`] laid out as
/// `layout`, with `faults` (each at its milliseconds after the start).
fn collector_job(n: usize, layout: Layout, faults: &[(CollectorFault, u64)]) -> Report {
    const STEPS: u64 = 400_000;
    let id = format!("{}-c{n}", std::process::id());
    let root = std::env::temp_dir().join(format!("drill-chaos-{id}"));
    let logs = std::env::temp_dir().join(format!("drill-chaos-logs-{id}"));
    std::fs::create_dir_all(&logs).unwrap();
    let exp = root.join("run");
    let shm_before = shm_segments();
    let mut r = Report::default();
    let port = drill_comm::spawn::free_port().to_string();
    let token = format!("chaos-{id}");
    let workers = layout.workers().to_string();
    let args = [
        "--parallel-workers",
        workers.as_str(),
        "--master-port",
        port.as_str(),
        "--max-restarts",
        "0",
        "--set",
        layout.roles(),
        "--set",
        if layout == Layout::Group {
            "policy.multi_gpu=true"
        } else {
            "policy.multi_gpu=false"
        },
        "--set",
        "env.stop_value=100000",
        "--set",
        "max_env_step=400000",
    ];
    let start_drill = |extra: &[&str], log: &Path| {
        Command::new(env!("CARGO_BIN_EXE_drill"))
            .arg("train")
            .arg(repo().join("configs/cartpole_appo.toml"))
            .args(extra)
            .args(args)
            .env("DRILL_CHAOS", &id)
            .env("DRILL_JOB_TOKEN", &token)
            .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(log).unwrap(),
            ))
            .spawn()
            .unwrap()
    };
    let start = Instant::now();
    let mut run = start_drill(
        &["--quiet", "--exp-dir", &exp.display().to_string()],
        &logs.join("job.log"),
    );
    let mut joined = vec![];
    let (mut left, mut status) = (vec![], None);
    for &(fault, at) in faults {
        status = wait_until(&mut run, start + Duration::from_millis(at));
        if status.is_some() {
            r.missed.push((CHAOS_MISSED, "the job ended first"));
            continue;
        }
        let kill = |rank: usize, sig: i32, left: &mut Vec<usize>| {
            if left.contains(&rank) {
                return;
            }
            if let Some(pid) = rank_pid(&id, rank, 0, Duration::from_secs(5)) {
                signal(pid, sig);
                left.push(rank);
            }
        };
        let victim = layout.spare()[(n + left.len()) % 2];
        // A learner's last collector is taken only with a join after it (the learner waits
        // `task.timeout` for one, then fails): KillAllThenJoin.
        if matches!(fault, CollectorFault::Kill | CollectorFault::Freeze) && !left.is_empty() {
            r.missed.push((CHAOS_MISSED, "it would leave no collector"));
            continue;
        }
        match fault {
            CollectorFault::Kill => kill(victim, libc::SIGKILL, &mut left),
            CollectorFault::Freeze => kill(victim, libc::SIGSTOP, &mut left),
            CollectorFault::Join | CollectorFault::KillAllThenJoin => {
                let mut starved = None;
                if fault == CollectorFault::KillAllThenJoin {
                    let (all, learner) = layout.starved();
                    for &c in all {
                        kill(c, libc::SIGKILL, &mut left);
                    }
                    starved = learner;
                    std::thread::sleep(Duration::from_millis(500));
                }
                let log = logs.join(format!("joined{}.log", joined.len()));
                joined.push((start_drill(&["--join"], &log), log, starved));
            }
        }
    }
    let status = status.or_else(|| wait_until(&mut run, start + BOUND));
    let log = std::fs::read_to_string(logs.join("job.log")).unwrap_or_default();
    r.outcome = match status {
        None => {
            r.violations
                .push(format!("hang: still running after {BOUND:?}"));
            "hang".into()
        }
        Some(s) if !s.success() => {
            r.violations.push(format!(
                "collectors coming and going ended the run with {s}: {}",
                tail(&log)
            ));
            "failed".into()
        }
        Some(_) => match result(&exp) {
            Some(res) if res["env_steps"].as_u64().unwrap_or(0) >= STEPS => {
                let steps = res["env_steps"].as_u64().unwrap_or(0);
                if !steps.is_multiple_of(256) {
                    r.violations
                        .push(format!("{steps} env steps: not whole rollouts of 256"));
                }
                "reached the step limit".into()
            }
            other => {
                r.violations
                    .push(format!("exit 0 short of the step limit: {other:?}"));
                "exit 0 early".into()
            }
        },
    };
    for rank in &left {
        if !log.contains(&format!("collector node {rank} left")) {
            r.violations.push(format!(
                "collector node {rank} was hit but no one said it left"
            ));
        }
    }
    for (k, (mut child, path, starved)) in joined.into_iter().enumerate() {
        let s = wait_until(&mut child, Instant::now() + Duration::from_secs(15));
        let its = std::fs::read_to_string(&path).unwrap_or_default();
        let node = layout.workers() + k;
        match s {
            Some(s) if s.success() => {
                if !log.contains(&format!("collector node {node} joined")) {
                    r.violations.push(format!(
                        "collector node {node} exited 0 but never joined: {}",
                        tail(&its)
                    ));
                }
                if let Some(learner) = starved
                    && !its.contains(&format!("feeds learner {learner} "))
                {
                    r.violations.push(format!(
                        "collector node {node} joined after learner {learner} lost its collectors but did not feed it: {}",
                        tail(&its)
                    ));
                }
            }
            // One that arrived as the run ended finds nothing to join, and says so.
            Some(_)
                if [
                    "no run to join",
                    "has no address",
                    "connect to node",
                    "the run ended",
                ]
                .iter()
                .any(|m| its.contains(m)) => {}
            other => r.violations.push(format!(
                "the joined collector {node} ended with {other:?}: {}",
                tail(&its)
            )),
        }
    }
    let counters = checkpoints(&exp, &mut r.violations);
    none_ahead(&exp, &counters, &mut r);
    kill_job(&id);
    expect_gone(&id, &mut r);
    cleanup(&id, &root, &logs, &shm_before, &mut r);
    r
}

/// A collector fault counted as not injected (the run had ended).
const CHAOS_MISSED: Fault = Fault::KillRank;

/// Every bug of drill-plant, planted alone into the same jobs, must make the campaign
/// report at least one violation.
#[cfg(feature = "plant")]
#[test]
fn every_planted_bug_is_caught() {
    let jobs: usize = env_or("CHAOS_PLANT_JOBS", 20);
    let seed: u64 = env_or("CHAOS_SEED", 1);
    let mut unseen = Vec::new();
    let mut rows = Vec::new();
    for bug in drill_plant::Bug::ALL {
        *PLANTED.lock().unwrap() = bug.name().into();
        let t = Instant::now();
        let tally = one_host_jobs(jobs, seed);
        PLANTED.lock().unwrap().clear();
        let first = tally.violations.first().cloned().unwrap_or_default();
        rows.push(format!(
            "| {} | {jobs} | {} | {:.0} s | {} |",
            bug.name(),
            tally.violations.len(),
            t.elapsed().as_secs_f64(),
            first
                .replace('|', "/")
                .chars()
                .take(160)
                .collect::<String>()
        ));
        if tally.violations.is_empty() {
            unseen.push(bug.name());
        }
    }
    println!(
        "\n| planted bug | jobs (seed {seed}) | violations | time | first |\n|---|---|---|---|---|"
    );
    for r in &rows {
        println!("{r}");
    }
    println!(
        "\nplanted bugs caught: {} of {}",
        drill_plant::Bug::ALL.len() - unseen.len(),
        drill_plant::Bug::ALL.len()
    );
    assert!(
        unseen.is_empty(),
        "planted bugs the campaign did not see: {unseen:?}"
    );
}

/// `jobs` one-host jobs drawn from `seed`, each run and checked.
fn one_host_jobs(jobs: usize, seed: u64) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::new();
    // `CHAOS_ONLY=N`: job N of the seed alone (to look at one again).
    let only: Option<usize> = std::env::var("CHAOS_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    for n in 0..jobs {
        let plan = draw(&mut rng);
        if only.is_some_and(|o| o != n) {
            continue;
        }
        let r = run_job(n, &plan);
        println!(
            "job {n}: {:?}{} {:?} -> {}{}",
            plan.kind,
            if plan.restarts { " (restarts 1)" } else { "" },
            (&r.injected, &r.missed),
            r.outcome,
            r.time_to_error
                .map_or(String::new(), |d| format!(", error after {d:.1?}"))
        );
        // Every drawn fault is counted: injected by phase, or not injected and why.
        let faults: Vec<(String, &'static str)> = r
            .injected
            .iter()
            .map(|(f, p)| (format!("{f:?}"), *p))
            .chain(
                r.missed
                    .iter()
                    .map(|(f, why)| (format!("{f:?} (not injected)"), *why)),
            )
            .collect();
        for (fault, phase) in faults {
            tally.count(fault, phase, &r.outcome);
        }
        tally.note(&format!("job {n}"), &format!("{plan:?}"), &r);
    }
    tally
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum NetFault {
    CutLink,
    PacketLoss,
    FreezeHost,
    KillStoreHost,
}

/// `drill launch` of DQN DDP on `host` of 2 (1 rank each), marked with `id`, output to `log`.
fn launch_on(
    hosts: &Hosts,
    host: usize,
    id: &str,
    port: u16,
    exp: &Path,
    restarts: bool,
    log: &Path,
) -> Child {
    let cfg = repo().join("configs/cartpole_dqn_ddp.toml");
    let mut c = hosts.on(host, env!("CARGO_BIN_EXE_drill"));
    c.args(["launch", "--nnodes", "2", "--nproc-per-node", "1"])
        .args([
            "--node-rank",
            &host.to_string(),
            "--master-addr",
            "10.77.0.1",
        ])
        .args(["--master-port", &port.to_string()]);
    if restarts {
        c.args(["--max-restarts", "1"]);
    }
    c.args(["--", env!("CARGO_BIN_EXE_drill"), "train"])
        .arg(&cfg)
        .args(["--quiet", "--exp-dir"])
        .arg(exp)
        .args([
            "--set",
            "env.stop_value=1000",
            "--set",
            "max_env_step=15000",
        ]);
    spawn_on_host(c, id, log)
}

/// Start `c` (a launcher on a namespace host) as part of job `id`, with the jobs' token, its
/// output to `log`.
fn spawn_on_host(mut c: Command, id: &str, log: &Path) -> Child {
    c.env("DRILL_CHAOS", id)
        .env("DRILL_JOB_TOKEN", "chaos")
        .stdout(Stdio::from(std::fs::File::create(log).unwrap()))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(log).unwrap(),
        ));
    c.spawn().unwrap()
}

/// One job on two hosts with one network fault: what it did, and the phase the fault hit
/// (or that it was not injected: the job ended first).
fn run_net_job(
    hosts: &Hosts,
    n: usize,
    fault: NetFault,
    at: Duration,
    restarts: bool,
) -> (Report, &'static str) {
    let id = format!("{}-net{n}", std::process::id());
    let dir = std::env::temp_dir().join(format!("drill-chaos-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let exp = dir.join("run");
    let port = 29600 + (n % 200) as u16;
    let logs = [dir.join("h0.log"), dir.join("h1.log")];
    let mut r = Report::default();
    if fault == NetFault::PacketLoss {
        hosts.link(0, "loss", &["2"]);
        hosts.link(1, "loss", &["2"]);
    }
    let start = Instant::now();
    let mut nodes: Vec<Child> = (0..2)
        .map(|h| launch_on(hosts, h, &id, port, &exp, restarts, &logs[h]))
        .collect();
    let mut ended: [Option<(ExitStatus, Instant)>; 2] = [None, None];
    let poll = |nodes: &mut Vec<Child>, ended: &mut [Option<(ExitStatus, Instant)>; 2]| {
        for (h, c) in nodes.iter_mut().enumerate() {
            if ended[h].is_none()
                && let Some(s) = c.try_wait().unwrap()
            {
                ended[h] = Some((s, Instant::now()));
            }
        }
    };
    while start.elapsed() < at && ended.iter().any(Option::is_none) {
        poll(&mut nodes, &mut ended);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (mut fault_at, mut phase) = (None, "not injected: the job ended first");
    // A fault that comes once the run has written its result is a fault after the job.
    let finished_first = exp.join("result.json").is_file();
    if ended.iter().all(Option::is_none) && !finished_first {
        let so_far = std::fs::read_to_string(&logs[0]).unwrap_or_default();
        phase = if fault == NetFault::PacketLoss {
            "the whole run"
        } else if so_far.contains("eval at env step") {
            "training"
        } else {
            "startup (rendezvous)"
        };
        match fault {
            NetFault::CutLink => hosts.link(1, "cut", &[]),
            NetFault::FreezeHost => hosts.link(1, "freeze", &[]),
            NetFault::KillStoreHost => signal(nodes[0].id() as i32, libc::SIGKILL),
            NetFault::PacketLoss => {}
        }
        fault_at = Some(Instant::now());
    }
    // Undo what would otherwise keep the job from ending: a restart budget gets its link back
    // after 4 s; a frozen host thaws once its peer has given up (or after 10 s).
    let mut undone = fault != NetFault::CutLink && fault != NetFault::FreezeHost;
    while ended.iter().any(Option::is_none) && start.elapsed() < BOUND {
        poll(&mut nodes, &mut ended);
        if !undone && let Some(f) = fault_at {
            let wait = match fault {
                NetFault::CutLink if restarts => Duration::from_secs(4),
                NetFault::CutLink => BOUND,
                _ => Duration::from_secs(10),
            };
            if f.elapsed() >= wait || (fault == NetFault::FreezeHost && ended[0].is_some()) {
                hosts.link(
                    1,
                    if fault == NetFault::CutLink {
                        "restore"
                    } else {
                        "thaw"
                    },
                    &[],
                );
                undone = true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !undone {
        hosts.link(
            1,
            if fault == NetFault::CutLink {
                "restore"
            } else {
                "thaw"
            },
            &[],
        );
    }
    if fault == NetFault::PacketLoss {
        hosts.link(0, "loss", &["off"]);
        hosts.link(1, "loss", &["off"]);
    }
    let text: Vec<String> = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    if ended.iter().any(Option::is_none) {
        r.violations
            .push(format!("hang: a launcher still runs after {BOUND:?}"));
        for c in nodes.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    expect_gone(&id, &mut r);
    let ok = |h: usize| ended[h].is_some_and(|(s, _)| s.success());
    let limit_reached = result(&exp).is_some_and(|res| {
        res["env_steps"].as_u64().unwrap_or(0) >= 15000 || res["stop_reached"] == true
    });
    let expect_success = fault_at.is_none()
        || fault == NetFault::PacketLoss
        || (fault == NetFault::CutLink && restarts);
    let survivors: &[usize] = match fault {
        NetFault::CutLink => &[0, 1],
        NetFault::FreezeHost => &[0],
        _ => &[1],
    };
    // A fault that lands after the peer's last message is a fault after the job: the
    // survivors finish, each sooner after the fault than a lost peer can be noticed
    // (a rank that gave up on its peer cannot have ended before the heartbeat timeout).
    let after_last_message = !expect_success
        && limit_reached
        && survivors.iter().all(|&h| {
            ended[h].is_some_and(|(s, t)| {
                s.success()
                    && fault_at.is_some_and(|f| t.saturating_duration_since(f) < BEFORE_NOTICED)
            })
        });
    r.outcome = if after_last_message {
        phase = "after the peer's last message";
        "reached the step limit".into()
    } else if expect_success {
        if !(ok(0) && ok(1) && limit_reached) {
            r.violations.push(format!(
                "expected the step limit: {} | {}",
                tail(&text[0]),
                tail(&text[1])
            ));
        }
        if fault == NetFault::CutLink {
            "restarted after the link came back, reached the step limit".into()
        } else {
            "reached the step limit".into()
        }
    } else {
        // The surviving side(s) fail naming the lost peer (in the rendezvous: the node that
        // never joined), within the bound.
        let in_rendezvous = phase.starts_with("startup");
        for &h in survivors {
            if ok(h) {
                r.violations.push(format!(
                    "host {h} succeeded despite the fault: {}",
                    tail(&text[h])
                ));
            } else if !(names_rank(&text[h], 1 - h)
                || (h == 1 && text[h].contains("store"))
                || (in_rendezvous && text[h].contains(&format!("missing: node {}", 1 - h))))
            {
                // Host h's one rank is rank h; it must name the other (host 1 may instead
                // name the store it reached on host 0).
                r.violations.push(format!(
                    "host {h} fails without naming rank {}: {}",
                    1 - h,
                    tail(&text[h])
                ));
            }
            if let (Some((_, t)), Some(f)) = (ended[h], fault_at) {
                let dt = t.saturating_duration_since(f);
                r.time_to_error = Some(r.time_to_error.unwrap_or_default().max(dt));
                let bound = if in_rendezvous {
                    RENDEZVOUS_BOUND
                } else {
                    ERROR_BOUND
                };
                if dt > bound {
                    r.violations
                        .push(format!("host {h} took {dt:?} from the fault to its end"));
                }
            }
        }
        "failed naming the lost peer".into()
    };
    let counters = checkpoints(&exp, &mut r.violations);
    if let Some(res) = result(&exp) {
        let steps = res["env_steps"].as_u64().unwrap_or(0);
        for (name, s, _) in &counters {
            if *s > steps {
                r.violations.push(format!(
                    "{name} ({s} env steps) is ahead of result.json ({steps})"
                ));
            }
        }
    }
    kill_job(&id);
    keep(&id, std::slice::from_ref(&dir), &mut r);
    let _ = std::fs::remove_dir_all(&dir);
    (r, phase)
}

#[test]
fn network_faults_on_two_hosts_end_the_job_cleanly() {
    let jobs: usize = env_or("CHAOS_NET_JOBS", 4);
    let seed: u64 = env_or("CHAOS_SEED", 0);
    let mut rng = Rng::new(seed ^ 0x6e6574);
    let hosts = Hosts::up(2, "x");
    let mut tally = Tally::new();
    for n in 0..jobs {
        let fault = *rng.pick(&[
            NetFault::CutLink,
            NetFault::PacketLoss,
            NetFault::FreezeHost,
            NetFault::KillStoreHost,
        ]);
        let restarts = fault == NetFault::CutLink && rng.below(2) == 0;
        let mut at = Duration::from_millis(300 + rng.below(3200) as u64);
        // `CHAOS_NET_AT=MS`: every fault at that moment (to aim at a phase of the run).
        if let Ok(ms) = std::env::var("CHAOS_NET_AT") {
            at = Duration::from_millis(ms.parse().expect("CHAOS_NET_AT: milliseconds"));
        }
        let (r, phase) = run_net_job(&hosts, n, fault, at, restarts);
        println!(
            "net job {n}: {fault:?}{} at {at:?} ({phase}) -> {}{}",
            if restarts { " (restarts 1)" } else { "" },
            r.outcome,
            r.time_to_error
                .map_or(String::new(), |d| format!(", error after {d:.1?}"))
        );
        tally.count(format!("{fault:?}"), phase, &r.outcome);
        tally.note(&format!("net job {n}"), &format!("{fault:?}"), &r);
    }
    // The hosts' namespaces go with them: none may be left.
    let set = hosts.set.clone();
    drop(hosts);
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&netns.stdout).into_owned();
    if left.contains(&set) {
        tally
            .violations
            .push(format!("namespaces left behind: {left}"));
    }
    tally.report("chaos (two hosts)", "network fault", jobs, seed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ElasticFault {
    KillHost,
    FreezeHost,
    CutLink,
    LateHost,
}

/// The step limit of an elastic job.
const ELASTIC_LIMIT: u64 = 15000;

/// One node (1 rank) of an elastic DQN DDP job (`drill train --nnodes 2:3`, the store on
/// host 0) on `host`, marked with `id`, output to `log`.
fn elastic_on(hosts: &Hosts, host: usize, id: &str, port: u16, exp: &Path, log: &Path) -> Child {
    let cfg = repo().join("configs/cartpole_dqn_ddp.toml");
    let mut c = hosts.on(host, env!("CARGO_BIN_EXE_drill"));
    c.arg("train")
        .arg(&cfg)
        .args(["--quiet", "--exp-dir"])
        .arg(exp)
        .args(["--nnodes", "2:3", "--rdzv-endpoint"])
        .arg(format!("10.77.0.1:{port}"))
        .args([
            "--rdzv-conf",
            "last_call_timeout=2,join_timeout=30,keep_alive_interval=0.5,keep_alive_max_attempt=8",
        ])
        .args(["--set", "env.stop_value=1000", "--set"])
        .arg(format!("max_env_step={ELASTIC_LIMIT}"));
    spawn_on_host(c, id, log)
}

/// One elastic job on three hosts with `fault` on host `k` (1 or 2) at `at`: what it did and
/// the phase the fault hit.
fn run_elastic_job(
    hosts: &Hosts,
    n: usize,
    fault: ElasticFault,
    k: usize,
    at: Duration,
) -> (Report, &'static str) {
    let id = format!("{}-el{n}", std::process::id());
    let dir = std::env::temp_dir().join(format!("drill-chaos-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let exp = dir.join("run");
    let port = 29400 + (n % 100) as u16;
    let logs: Vec<_> = (0..3).map(|h| dir.join(format!("h{h}.log"))).collect();
    let mut r = Report::default();
    let start = Instant::now();
    let late = fault == ElasticFault::LateHost;
    let mut nodes: Vec<Option<Child>> = (0..3)
        .map(|h| (!(late && h == k)).then(|| elastic_on(hosts, h, &id, port, &exp, &logs[h])))
        .collect();
    let mut ended: Vec<Option<ExitStatus>> = vec![None; 3];
    let poll = |nodes: &mut Vec<Option<Child>>, ended: &mut Vec<Option<ExitStatus>>| {
        for (h, c) in nodes.iter_mut().enumerate() {
            if ended[h].is_none()
                && let Some(c) = c
                && let Some(s) = c.try_wait().unwrap()
            {
                ended[h] = Some(s);
            }
        }
    };
    while start.elapsed() < at && ended[0].is_none() {
        poll(&mut nodes, &mut ended);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut phase = "not injected: the job ended first";
    let mut undo: Option<(Instant, &str)> = None;
    if ended[0].is_none() && !exp.join("result.json").is_file() {
        let so_far = std::fs::read_to_string(&logs[0]).unwrap_or_default();
        phase = if so_far.contains("eval at env step") {
            "training"
        } else {
            "startup (rendezvous)"
        };
        match fault {
            ElasticFault::KillHost => {
                if let Some(c) = &nodes[k] {
                    signal(c.id() as i32, libc::SIGKILL);
                }
            }
            ElasticFault::FreezeHost => {
                hosts.link(k, "freeze", &[]);
                undo = Some((Instant::now() + Duration::from_secs(4), "thaw"));
            }
            ElasticFault::CutLink => {
                hosts.link(k, "cut", &[]);
                undo = Some((Instant::now() + Duration::from_secs(4), "restore"));
            }
            ElasticFault::LateHost => {
                nodes[k] = Some(elastic_on(hosts, k, &id, port, &exp, &logs[k]));
            }
        }
    }
    while ended
        .iter()
        .zip(&nodes)
        .any(|(e, c)| e.is_none() && c.is_some())
        && start.elapsed() < BOUND
    {
        poll(&mut nodes, &mut ended);
        if let Some((when, how)) = undo
            && Instant::now() >= when
        {
            hosts.link(k, how, &[]);
            undo = None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some((_, how)) = undo {
        hosts.link(k, how, &[]);
    }
    let text: Vec<String> = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    if ended
        .iter()
        .zip(&nodes)
        .any(|(e, c)| e.is_none() && c.is_some())
    {
        r.violations
            .push(format!("hang: a launcher still runs after {BOUND:?}"));
        for c in nodes.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    expect_gone(&id, &mut r);
    let steps = result(&exp).map_or(0, |res| res["env_steps"].as_u64().unwrap_or(0));
    if steps < ELASTIC_LIMIT {
        r.violations.push(format!(
            "the job stopped at {steps} env steps, short of {ELASTIC_LIMIT}: {}",
            tail(&text[0])
        ));
    }
    let injected = !phase.starts_with("not injected");
    for h in 0..3 {
        let killed = fault == ElasticFault::KillHost && h == k && injected;
        match ended[h] {
            Some(s)
                if killed
                    && std::os::unix::process::ExitStatusExt::signal(&s) != Some(libc::SIGKILL) =>
            {
                r.violations
                    .push(format!("host {h} was killed, yet it ended with {s}"))
            }
            // A host back after the job ended finds the store gone and says so.
            Some(s) if h == k && !s.success() && text[h].contains("so this host cannot rejoin") => {
            }
            Some(s) if !killed && !s.success() => r
                .violations
                .push(format!("host {h} ended with {s}: {}", tail(&text[h]))),
            _ => {}
        }
    }
    // Counters never go back: each restart starts where a checkpoint was, in order.
    let marks = resume_marks(&exp, &mut r.violations);
    if marks.windows(2).any(|w| w[1].0 < w[0].0 || w[1].1 < w[0].1) {
        r.violations
            .push(format!("a restart went back: resume marks {marks:?}"));
    }
    for (name, s, _) in checkpoints(&exp, &mut r.violations) {
        if s > steps {
            r.violations.push(format!(
                "{name} ({s} env steps) is ahead of result.json ({steps})"
            ));
        }
    }
    r.outcome = match (fault, phase) {
        _ if !injected => "reached the step limit".into(),
        (ElasticFault::LateHost, _) => "took the late host, reached the step limit".into(),
        (ElasticFault::KillHost, _) => "went on without the host, reached the step limit".into(),
        _ if text[k].contains("cannot rejoin") => {
            "reached the step limit; the host came back after the store's launcher ended".into()
        }
        _ if text[k].contains("could rejoin it") => {
            "reached the step limit before the host came back".into()
        }
        _ => "took the host back, reached the step limit".into(),
    };
    kill_job(&id);
    keep(&id, std::slice::from_ref(&dir), &mut r);
    let _ = std::fs::remove_dir_all(&dir);
    (r, phase)
}

#[test]
fn elastic_jobs_on_three_hosts_lose_and_take_hosts_and_reach_the_limit() {
    let jobs: usize = env_or("CHAOS_ELASTIC_JOBS", 3);
    let seed: u64 = env_or("CHAOS_SEED", 0);
    let mut rng = Rng::new(seed ^ 0x656c6173);
    let hosts = Hosts::up(3, "z");
    let mut tally = Tally::new();
    for n in 0..jobs {
        let fault = *rng.pick(&[
            ElasticFault::KillHost,
            ElasticFault::FreezeHost,
            ElasticFault::CutLink,
            ElasticFault::LateHost,
        ]);
        // Never host 0: the store's host must stay (the docs say so).
        let k = 1 + rng.below(2);
        let at = Duration::from_millis(300 + rng.below(3500) as u64);
        let (r, phase) = run_elastic_job(&hosts, n, fault, k, at);
        println!(
            "elastic job {n}: {fault:?} on host {k} at {at:?} ({phase}) -> {}",
            r.outcome
        );
        tally.count(format!("{fault:?}"), phase, &r.outcome);
        tally.note(&format!("elastic job {n}"), &format!("{fault:?}"), &r);
    }
    drop(hosts);
    tally.report("chaos (elastic, three hosts)", "fault", jobs, seed);
}
