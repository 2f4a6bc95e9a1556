//! torch.multiprocessing.spawn for Rust: start `nprocs` copies of a program as the ranks of a
//! fresh single-node job (env protocol of `drill launch`) and collect their outputs. Programs
//! and tests that start their own ranks use it.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::Token;
use crate::error::{CommError, Result};

/// A free TCP port (bound on every interface and released; fine for tests and single-node
/// jobs).
///
/// It is taken below the kernel's ephemeral range when there is room there: a port from
/// inside it (what binding port 0 gives) can be taken as the local end of any outgoing
/// connection in the time between this call and the bind that uses it, and on a busy machine
/// the job then fails to start.
pub fn free_port() -> u16 {
    use rand::Rng;
    let (lo, hi) = below_ephemeral_range();
    if hi > lo {
        let mut rng = rand::rng();
        for _ in 0..256 {
            let port = rng.random_range(lo..hi);
            if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(29500)
}

/// Ports `[lo, hi)` under the kernel's ephemeral range that `free_port` picks from (empty
/// where the range is unknown or starts too low to leave room).
fn below_ephemeral_range() -> (u16, u16) {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
    match start {
        Some(s) if s >= 12_000 => (10_000, s),
        _ => (0, 0),
    }
}

/// What one rank did.
#[derive(Debug)]
pub struct RankOutput {
    /// Its rank.
    pub rank: usize,
    /// How it ended (`None`: killed by us after the deadline or after another rank failed).
    pub status: Option<ExitStatus>,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
}

impl RankOutput {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Builder for a spawned job.
#[derive(Clone, Debug)]
pub struct Spawn {
    program: PathBuf,
    args: Vec<OsString>,
    nprocs: usize,
    envs: Vec<(String, String)>,
    per_rank_env: Vec<(usize, String, String)>,
    timeout: Duration,
    grace: Duration,
}

impl Spawn {
    /// Ranks running `program`.
    pub fn new(program: impl Into<PathBuf>, nprocs: usize) -> Spawn {
        Spawn {
            program: program.into(),
            args: Vec::new(),
            nprocs,
            envs: Vec::new(),
            per_rank_env: Vec::new(),
            timeout: Duration::from_secs(120),
            grace: Duration::from_secs(10),
        }
    }

    /// Ranks running the current executable (test binaries re-run themselves).
    pub fn current_exe(nprocs: usize) -> Spawn {
        Spawn::new(std::env::current_exe().expect("current executable"), nprocs)
    }

    /// Add arguments.
    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Spawn {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Set a variable for every rank.
    pub fn env(mut self, k: &str, v: impl ToString) -> Spawn {
        self.envs.push((k.into(), v.to_string()));
        self
    }

    /// Set a variable for one rank.
    pub fn rank_env(mut self, rank: usize, k: &str, v: impl ToString) -> Spawn {
        self.per_rank_env.push((rank, k.into(), v.to_string()));
        self
    }

    /// Kill everything still running after this long (default 120 s).
    pub fn timeout(mut self, t: Duration) -> Spawn {
        self.timeout = t;
        self
    }

    /// After a rank fails, how long the others get to end on their own (default 10 s).
    pub fn grace(mut self, t: Duration) -> Spawn {
        self.grace = t;
        self
    }

    /// Start the ranks and wait for all of them.
    pub fn run(&self) -> Result<Vec<RankOutput>> {
        let port = free_port();
        let token = Token::generate();
        let mut children: Vec<(Child, JoinHandle<String>, JoinHandle<String>)> = Vec::new();
        for rank in 0..self.nprocs {
            let mut cmd = Command::new(&self.program);
            cmd.args(&self.args)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", self.nprocs.to_string())
                .env("LOCAL_WORLD_SIZE", self.nprocs.to_string())
                .env("GROUP_RANK", "0")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("DRILL_JOB_TOKEN", &token)
                .env_remove("DRILL_AGENT_STORE")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in &self.envs {
                cmd.env(k, v);
            }
            for (_, k, v) in self.per_rank_env.iter().filter(|(r, ..)| *r == rank) {
                cmd.env(k, v);
            }
            let mut child = cmd.spawn().map_err(|e| {
                CommError::io(format!("spawn rank {rank}: {}", self.program.display()), e)
            })?;
            let out = drain(child.stdout.take());
            let err = drain(child.stderr.take());
            children.push((child, out, err));
        }
        let start = Instant::now();
        let mut status: Vec<Option<ExitStatus>> = vec![None; self.nprocs];
        let mut failed_at: Option<Instant> = None;
        loop {
            for (i, (c, ..)) in children.iter_mut().enumerate() {
                if status[i].is_none()
                    && let Ok(Some(s)) = c.try_wait()
                {
                    status[i] = Some(s);
                    if !s.success() && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                }
            }
            if status.iter().all(Option::is_some) {
                break;
            }
            let over = start.elapsed() > self.timeout
                || failed_at.is_some_and(|t| t.elapsed() > self.grace);
            if over {
                for (i, (c, ..)) in children.iter_mut().enumerate() {
                    if status[i].is_none() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(children
            .into_iter()
            .enumerate()
            .map(|(rank, (_, out, err))| RankOutput {
                rank,
                status: status[rank],
                stdout: out.join().unwrap_or_default(),
                stderr: err.join().unwrap_or_default(),
            })
            .collect())
    }
}

fn drain<R: Read + Send + 'static>(r: Option<R>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut r) = r {
            let mut b = Vec::new();
            let _ = r.read_to_end(&mut b);
            s = String::from_utf8_lossy(&b).into_owned();
        }
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_lie_below_the_ephemeral_range_and_can_be_bound() {
        let (lo, hi) = below_ephemeral_range();
        let ports: Vec<u16> = (0..32).map(|_| free_port()).collect();
        for &p in &ports {
            if hi > lo {
                assert!((lo..hi).contains(&p), "{p} not in {lo}..{hi}");
            }
            std::net::TcpListener::bind(("0.0.0.0", p)).unwrap();
        }
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 28, "{ports:?}");
    }
}
