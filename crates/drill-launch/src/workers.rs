//! One attempt: start this node's ranks, watch them, stop them all on the first failure.

use std::fmt;
use std::fs::File;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::output::{Stream, pump};
use crate::rendezvous::{Placement, Rendezvous};
use crate::{LaunchConfig, LaunchError};

/// The other nodes of an attempt, as the watch loop sees them.
pub(crate) trait Peers {
    /// Tell the other nodes this attempt failed (`what`).
    fn report_failure(&self, what: &str);
    /// Checked every 100 ms while the ranks run: why the other nodes end the attempt, if
    /// they do.
    fn poll(&mut self) -> Option<Stop>;
}

/// Why the other nodes end an attempt.
pub(crate) enum Stop {
    /// A rank elsewhere failed (the report).
    Failed(String),
    /// The membership changes (what changes): the ranks are asked to stop as on Ctrl-C,
    /// saving a checkpoint at their current step, and the group restarts from it.
    Change(String),
}

/// The static rendezvous's view of the other nodes during attempt `round`: their failures.
pub(crate) struct Attempt<'a> {
    /// The job's rendezvous.
    pub rdzv: &'a Rendezvous,
    /// The attempt.
    pub round: usize,
}

impl Peers for Attempt<'_> {
    fn report_failure(&self, what: &str) {
        self.rdzv.report_failure(self.round, what);
    }

    fn poll(&mut self) -> Option<Stop> {
        if self.rdzv.nnodes < 2 {
            return None;
        }
        self.rdzv.remote_failure(self.round).map(Stop::Failed)
    }
}

/// The failure that ended an attempt.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Global rank (`None` when another node reported it).
    pub rank: Option<usize>,
    /// Node index.
    pub node_rank: usize,
    /// Process id.
    pub pid: u32,
    /// Exit status (`None` for a remote report).
    pub status: Option<ExitStatus>,
    /// The rank's stderr log, if logging.
    pub log: Option<PathBuf>,
    /// Another node's report.
    pub remote: Option<String>,
}

impl Failure {
    /// Exit code to pass on.
    pub fn exit_code(&self) -> i32 {
        match self.status {
            Some(s) => s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)),
            None => 1,
        }
    }
}

/// How a process ended, in words.
fn describe(s: std::process::ExitStatus) -> String {
    match s.code() {
        Some(c) => format!("exited with code {c}"),
        None => format!("was killed by signal {}", s.signal().unwrap_or(0)),
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.remote {
            return write!(f, "another node failed: {r}");
        }
        let how = self.status.map_or("failed".into(), describe);
        if drill_plant::planted(drill_plant::Bug::ErrorNamesNoRank) {
            return write!(
                f,
                "a worker (node {}, pid {}) {how}",
                self.node_rank, self.pid
            );
        }
        write!(
            f,
            "rank {} (node {}, pid {}) {how}",
            self.rank.unwrap_or(0),
            self.node_rank,
            self.pid
        )?;
        match &self.log {
            Some(p) => write!(f, "; its stderr: {}", p.display()),
            None => write!(
                f,
                "; its output is above, prefixed [rank {}]",
                self.rank.unwrap_or(0)
            ),
        }
    }
}

/// How an attempt ended.
pub enum RoundEnd {
    /// All local ranks exited 0.
    Success,
    /// A rank (here or elsewhere) failed.
    Failed(Failure),
    /// The launcher was signalled (the signal; whether every rank exited 0 all the same).
    Interrupted(i32, bool),
    /// The membership changed and the ranks stopped (whether every rank exited 0: the run
    /// had finished).
    Changed(bool),
}

struct Worker {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
    /// A rank that may leave exited with an error or was killed: it left the run, which goes
    /// on (its `status` is the real one).
    left: bool,
    pumps: Vec<JoinHandle<()>>,
    log: Option<PathBuf>,
}

impl Worker {
    /// It exited, and not in a way that ends the attempt as failed: 0, or it left.
    fn done_ok(&self) -> bool {
        self.left || self.status.is_some_and(|s| s.success())
    }
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> LaunchError {
    move |source| LaunchError::Io { context, source }
}

/// The signals the launcher got: how many, and the last one (set from a signal handler).
#[derive(Default)]
pub struct Signals {
    count: AtomicUsize,
    last: AtomicUsize,
}

impl Signals {
    /// Note `sig` (async-signal-safe: two atomic stores).
    pub fn record(&self, sig: i32) {
        self.last.store(sig as usize, Ordering::SeqCst);
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn get(&self) -> (usize, i32) {
        let count = self.count.load(Ordering::SeqCst);
        (count, self.last.load(Ordering::SeqCst) as i32)
    }
}

/// A rank's exit status after it stopped on an interrupt (128 + SIGINT, as shells report).
const INTERRUPTED: i32 = 130;

/// Start, watch and end one attempt.
pub fn run_round(
    cfg: &LaunchConfig,
    p: &Placement,
    token: &str,
    restart: usize,
    peers: &mut dyn Peers,
    signals: &Signals,
) -> Result<RoundEnd, LaunchError> {
    let dir = match &cfg.log_dir {
        Some(d) => {
            let dir = d.join(format!("attempt_{restart}"));
            std::fs::create_dir_all(&dir)
                .map_err(io(format!("create log folder {}", dir.display())))?;
            Some(dir)
        }
        None => None,
    };
    let mut workers = Vec::with_capacity(cfg.nproc_per_node);
    for local in 0..cfg.nproc_per_node {
        match start_rank(cfg, p, token, restart, local, dir.as_ref()) {
            Ok(w) => workers.push(w),
            Err(e) => {
                stop_all(&mut workers, libc::SIGTERM, cfg.grace);
                return Err(e);
            }
        }
    }
    Ok(watch(cfg, p, peers, signals, workers))
}

/// Start local rank `local` with torchrun's environment, its output pumped to the terminal
/// with its `[rank N]` prefix (and to `dir`'s files when logging).
fn start_rank(
    cfg: &LaunchConfig,
    p: &Placement,
    token: &str,
    restart: usize,
    local: usize,
    dir: Option<&PathBuf>,
) -> Result<Worker, LaunchError> {
    let rank = p.rank_offset + local;
    let (fo, fe, log) = match dir {
        Some(d) => {
            let o = d.join(format!("rank_{rank}.stdout"));
            let e = d.join(format!("rank_{rank}.stderr"));
            let fo = File::create(&o).map_err(io(format!("create {}", o.display())))?;
            let fe = File::create(&e).map_err(io(format!("create {}", e.display())))?;
            (Some(fo), Some(fe), Some(e))
        }
        None => (None, None, None),
    };
    let mut cmd = Command::new(&cfg.program);
    cmd.args(&cfg.args)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", local.to_string())
        .env("WORLD_SIZE", p.world_size.to_string())
        .env("LOCAL_WORLD_SIZE", cfg.nproc_per_node.to_string())
        .env("GROUP_RANK", p.node_rank.to_string())
        .env("NODE_RANK", p.node_rank.to_string())
        .env("MASTER_ADDR", &p.master_addr)
        .env("MASTER_PORT", p.master_port.to_string())
        .env("DRILL_RESTART_COUNT", restart.to_string())
        .env("TORCHELASTIC_RESTART_COUNT", restart.to_string())
        .env("DRILL_MAX_RESTARTS", cfg.max_restarts.to_string())
        .env("TORCHELASTIC_MAX_RESTARTS", cfg.max_restarts.to_string())
        .env("DRILL_RUN_ID", format!("{}-{restart}", cfg.rdzv_id))
        .env("DRILL_JOB_TOKEN", token)
        .env("DRILL_AGENT_STORE", "1")
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .envs(
            cfg.bind
                .map(|ip| (drill_comm::net::BIND_VAR, ip.to_string())),
        )
        .envs(
            cfg.elastic
                .as_ref()
                .map(|e| ("DRILL_ELASTIC", format!("{}:{}", e.min_nodes, e.max_nodes))),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        cmd.env("OMP_NUM_THREADS", "1");
    }
    // Each worker leads its own process group, so signals reach the programs it starts
    // too, and dies with the launcher, even if that is SIGKILLed: no orphans. A launcher
    // killed between the fork and the prctl sends no signal: the child sees its parent
    // changed and does not start.
    let launcher = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only makes three
    // async-signal-safe system calls (setpgid, prctl, getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != launcher {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(io(format!("start rank {rank}: {}", cfg.program)))?;
    let prefix = format!("[rank {rank}] ");
    let pumps = vec![
        pump(
            child.stdout.take().expect("piped"),
            prefix.clone(),
            Stream::Out,
            fo,
        ),
        pump(child.stderr.take().expect("piped"), prefix, Stream::Err, fe),
    ];
    Ok(Worker {
        rank,
        child,
        status: None,
        left: false,
        pumps,
        log,
    })
}

/// How long ranks asked to stop for a membership change may take (a step and a checkpoint)
/// before they are stopped with SIGTERM.
const CHANGE_STOP: Duration = Duration::from_secs(60);

/// Watch the started ranks until the attempt ends: all exited 0, one failed (here or, with
/// several nodes, elsewhere), the membership changed, or the launcher was signalled.
fn watch(
    cfg: &LaunchConfig,
    p: &Placement,
    peers: &mut dyn Peers,
    signals: &Signals,
    mut workers: Vec<Worker>,
) -> RoundEnd {
    let tick = cfg
        .monitor_interval
        .clamp(Duration::from_millis(5), Duration::from_secs(5))
        .min(Duration::from_millis(20));
    let mut last_remote_check = Instant::now();
    // The first signal is passed on and the ranks finish their step, save and exit (drill
    // train's interrupt); the launcher waits for them. A second one stops them at once.
    let mut interrupt: Option<i32> = None;
    // Set when the ranks were asked to stop for a membership change: until when they may take.
    let mut changing: Option<Instant> = None;
    // When every rank that may not leave had exited 0.
    let mut required_done: Option<Instant> = None;
    let mut seen = 0;
    loop {
        let (count, sig) = signals.get();
        if count > seen {
            seen = count;
            if interrupt.is_some() {
                eprintln!(
                    "drill launch: got {} again; stopping every rank now",
                    signal_name(sig)
                );
                return end_with(
                    &mut workers,
                    Some((sig, cfg.grace)),
                    RoundEnd::Interrupted(sig, false),
                );
            }
            eprintln!(
                "drill launch: got {}; passing it to every rank (drill train stops after its current step and saves; send it again to stop at once)",
                signal_name(sig)
            );
            if changing.is_none() {
                signal_all(&mut workers, sig);
            }
            interrupt = Some(sig);
        }
        let (failure, stopped_elsewhere) = reap(&mut workers, p, &cfg.optional);
        if let Some(until) = changing {
            if workers.iter().all(|w| w.status.is_some()) {
                let finished = workers.iter().all(Worker::done_ok);
                let end = match interrupt {
                    Some(sig) => RoundEnd::Interrupted(sig, finished),
                    None => RoundEnd::Changed(finished),
                };
                return end_with(&mut workers, None, end);
            }
            if Instant::now() >= until {
                eprintln!(
                    "drill launch: ranks still running {CHANGE_STOP:?} after they were asked to stop; stopping them"
                );
                return end_with(
                    &mut workers,
                    Some((libc::SIGTERM, cfg.grace)),
                    RoundEnd::Changed(false),
                );
            }
        } else if interrupt.is_none() && stopped_elsewhere.is_some() {
            // A rank stopped as on an interrupt the launcher did not get: a membership
            // change the other nodes saw first, or a signal on another node.
            match peers.poll() {
                Some(Stop::Change(what)) => changing = Some(begin_change(&mut workers, &what)),
                _ => {
                    eprintln!(
                        "drill launch: rank {} stopped on an interrupt; waiting for the others",
                        stopped_elsewhere.unwrap_or(0)
                    );
                    interrupt = Some(libc::SIGINT);
                }
            }
        } else if let Some(sig) = interrupt {
            if let Some(end) = end_of_interrupt(&mut workers, sig, cfg.grace) {
                return end;
            }
        } else if let Some(f) = failure {
            peers.report_failure(&f.to_string());
            return end_with(
                &mut workers,
                Some((libc::SIGTERM, cfg.grace)),
                RoundEnd::Failed(f),
            );
        } else if workers.iter().all(|w| w.status.is_some()) {
            return end_with(&mut workers, None, RoundEnd::Success);
        } else if let Some(end) =
            optional_left(&mut workers, &cfg.optional, &mut required_done, cfg.grace)
        {
            return end;
        } else if last_remote_check.elapsed() >= Duration::from_millis(100) {
            last_remote_check = Instant::now();
            match peers.poll() {
                Some(Stop::Failed(r)) => {
                    let f = Failure {
                        rank: None,
                        node_rank: p.node_rank,
                        pid: 0,
                        status: None,
                        log: None,
                        remote: Some(r),
                    };
                    return end_with(
                        &mut workers,
                        Some((libc::SIGTERM, cfg.grace)),
                        RoundEnd::Failed(f),
                    );
                }
                Some(Stop::Change(what)) => changing = Some(begin_change(&mut workers, &what)),
                None => {}
            }
        }
        std::thread::sleep(tick);
    }
}

/// Every rank here that may not leave exited 0 and only optional ones run: they had `grace`
/// to follow (a finished run's collectors exit on their own), then they are stopped (one that
/// is frozen never would) and the attempt succeeded.
fn optional_left(
    workers: &mut [Worker],
    optional: &[usize],
    done_at: &mut Option<Instant>,
    grace: Duration,
) -> Option<RoundEnd> {
    // A node that runs only such ranks has nothing to go by: they end with the run.
    let mut required = workers.iter().filter(|w| !optional.contains(&w.rank));
    let required_done = required.clone().next().is_some() && required.all(Worker::done_ok);
    if optional.is_empty() || !required_done {
        return None;
    }
    let since = *done_at.get_or_insert_with(Instant::now);
    if since.elapsed() < grace {
        return None;
    }
    let running: Vec<usize> = workers
        .iter()
        .filter(|w| w.status.is_none())
        .map(|w| w.rank)
        .collect();
    eprintln!("drill launch: the run ended; stopping ranks {running:?}, which may leave");
    Some(end_with(
        workers,
        Some((libc::SIGKILL, Duration::ZERO)),
        RoundEnd::Success,
    ))
}

/// Ask every rank to stop at its current step (SIGINT: drill train saves a checkpoint and
/// exits) because `what` changes the membership; the deadline for them to do it.
fn begin_change(workers: &mut [Worker], what: &str) -> Instant {
    eprintln!(
        "drill launch: {what}: asking every rank to save and stop, then the group restarts from that checkpoint"
    );
    signal_all(workers, libc::SIGINT);
    Instant::now() + CHANGE_STOP
}

/// Note the exits since the last look: the failure among them that ends the attempt, and a
/// rank that stopped as on an interrupt (exit 130), if any. A rank killed by a signal is the
/// cause; ranks that exited with an error in the same pass are usually reporting it (their
/// peer is gone), so the signal wins.
fn reap(
    workers: &mut [Worker],
    p: &Placement,
    optional: &[usize],
) -> (Option<Failure>, Option<usize>) {
    let mut failure: Option<Failure> = None;
    let mut interrupted = None;
    for w in workers.iter_mut().filter(|w| w.status.is_none()) {
        let Ok(Some(s)) = w.child.try_wait() else {
            continue;
        };
        w.status = Some(s);
        if !s.success() && optional.contains(&w.rank) && s.code() != Some(INTERRUPTED) {
            eprintln!(
                "drill launch: rank {} {}; it may leave, the others go on",
                w.rank,
                describe(s)
            );
            w.left = true;
            continue;
        }
        if s.code() == Some(INTERRUPTED) {
            interrupted.get_or_insert(w.rank);
        }
        let killed = s.signal().is_some();
        let better = match &failure {
            None => true,
            Some(f) => killed && f.status.is_some_and(|fs| fs.signal().is_none()),
        };
        if !s.success() && better {
            failure = Some(Failure {
                rank: Some(w.rank),
                node_rank: p.node_rank,
                pid: w.child.id(),
                status: Some(s),
                log: w.log.clone(),
                remote: None,
            });
        }
    }
    (failure, interrupted)
}

/// While interrupted, exits are the ranks stopping as asked: the attempt ends when all have.
/// A rank that ended otherwise (killed by the signal before its handler was installed,
/// failed) leaves the others unable to agree on their last step: they are stopped.
fn end_of_interrupt(workers: &mut [Worker], sig: i32, grace: Duration) -> Option<RoundEnd> {
    if workers.iter().all(|w| w.status.is_some()) {
        let finished = workers.iter().all(Worker::done_ok);
        return Some(end_with(
            workers,
            None,
            RoundEnd::Interrupted(sig, finished),
        ));
    }
    let (rank, status) = workers
        .iter()
        .filter(|w| !w.left)
        .filter_map(|w| w.status.map(|s| (w.rank, s)))
        .find(|(_, s)| !s.success() && s.code() != Some(INTERRUPTED))?;
    eprintln!(
        "drill launch: rank {rank} {} instead of stopping with the others; stopping every rank",
        describe(status)
    );
    Some(end_with(
        workers,
        Some((libc::SIGTERM, grace)),
        RoundEnd::Interrupted(sig, false),
    ))
}

/// End the attempt as `end`: first stop the live ranks with `stop`'s signal and grace, if
/// given, then wait for every rank's output.
fn end_with(workers: &mut [Worker], stop: Option<(i32, Duration)>, end: RoundEnd) -> RoundEnd {
    if let Some((sig, grace)) = stop {
        stop_all(workers, sig, grace);
    }
    join_pumps(workers);
    end
}

/// `SIGINT` for 2, and so on.
fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        s => format!("signal {s}"),
    }
}

/// Send `sig` to every live worker.
fn signal_all(workers: &mut [Worker], sig: i32) {
    for w in workers.iter_mut() {
        if w.status.is_none() && matches!(w.child.try_wait(), Ok(None)) {
            // SAFETY: kill(2) touches no memory of this process; the group is the worker's own.
            unsafe { libc::kill(-(w.child.id() as i32), sig) };
        }
    }
}

/// Send `sig` to every live worker, wait up to `grace`, then SIGKILL what is left.
fn stop_all(workers: &mut [Worker], sig: i32, grace: Duration) {
    signal_all(workers, sig);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline
        && workers
            .iter_mut()
            .any(|w| matches!(w.child.try_wait(), Ok(None)))
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    for w in workers.iter_mut() {
        if matches!(w.child.try_wait(), Ok(None)) {
            // SAFETY: kill(2) touches no memory of this process; the group is the worker's own.
            unsafe { libc::kill(-(w.child.id() as i32), libc::SIGKILL) };
        }
        if let Ok(s) = w.child.wait() {
            w.status.get_or_insert(s);
        }
    }
}

/// Kill what the workers left behind in their process groups, then wait for their output.
fn join_pumps(workers: &mut [Worker]) {
    for w in workers.iter() {
        // SAFETY: kill(2) touches no memory of this process; the group is the worker's own.
        unsafe { libc::kill(-(w.child.id() as i32), libc::SIGKILL) };
    }
    for w in workers.iter_mut() {
        for p in w.pumps.drain(..) {
            let _ = p.join();
        }
    }
}
