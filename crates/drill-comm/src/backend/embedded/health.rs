//! The failure detector: a thread that sleeps in poll() on every peer's control connection
//! and records the first crash (EOF without goodbye) or abort notice in [`Health`], which every
//! operation of the process checks.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::frame::{AbortReason, Control, HEADER};
use crate::error::{CommError, Result};

/// What the failure detector knows, shared by every group of the process.
pub struct Health {
    broken: AtomicBool,
    why: Mutex<Option<(usize, String)>>,
    /// The cause is a peer that rejected this rank's data (the culprit was this rank).
    rejected: AtomicBool,
    left: Vec<AtomicBool>,
    stop: AtomicBool,
}

impl Health {
    /// Nothing broken yet, for a world of `world` ranks.
    pub fn new(world: usize) -> Health {
        Health {
            broken: AtomicBool::new(false),
            why: Mutex::new(None),
            rejected: AtomicBool::new(false),
            left: (0..world).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        }
    }

    /// Record that the job is broken because of `rank` (the first cause wins).
    pub fn set_broken(&self, rank: usize, detail: String) {
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            *w = Some((rank, detail));
        }
        self.broken.store(true, Ordering::Release);
    }

    /// Record that peer `by` gave up on this rank because its data did not match (the first
    /// cause wins): this rank's calls then fail with a protocol error naming `by`.
    pub fn set_rejected(&self, by: usize, detail: String) {
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            *w = Some((by, detail));
            self.rejected.store(true, Ordering::Release);
        }
        self.broken.store(true, Ordering::Release);
    }

    /// The cause, if the job is broken.
    #[inline]
    pub fn broken(&self) -> Option<(usize, String)> {
        if !self.broken.load(Ordering::Acquire) {
            return None;
        }
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the cause is a peer that rejected this rank's data.
    #[inline]
    pub fn rejected(&self) -> bool {
        self.rejected.load(Ordering::Acquire)
    }

    /// Whether peer `rank` said goodbye (left in order).
    #[inline]
    pub fn left(&self, rank: usize) -> bool {
        self.left[rank].load(Ordering::Acquire)
    }

    /// Stop the failure detector: this process leaves in order.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Start watching the control connections `conns` (global rank, stream) of rank `me`.
pub fn spawn_watch(
    conns: Vec<(usize, TcpStream)>,
    health: Arc<Health>,
    world: usize,
    me: usize,
) -> Result<()> {
    std::thread::Builder::new()
        .name("drill-comm-watch".into())
        .spawn(move || watch(conns, health, world, me))
        .map(|_| ())
        .map_err(|e| CommError::io("spawn failure detector", e))
}

/// The failure detector: sleeps in poll() on every control connection and records the first
/// crash (EOF without goodbye) or abort notice.
fn watch(mut conns: Vec<(usize, TcpStream)>, health: Arc<Health>, world: usize, me: usize) {
    let mut bufs: Vec<([u8; HEADER], usize)> = vec![([0; HEADER], 0); conns.len()];
    let mut open = vec![true; conns.len()];
    for (_, s) in &conns {
        let _ = s.set_nonblocking(true);
    }
    while !health.stop.load(Ordering::Acquire) && open.iter().any(|&o| o) {
        let mut fds: Vec<libc::pollfd> = conns
            .iter()
            .zip(&open)
            .map(|((_, s), &o)| libc::pollfd {
                fd: if o { s.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if rc <= 0 {
            continue;
        }
        for (i, fd) in fds.iter().enumerate() {
            if fd.revents == 0 || !open[i] {
                continue;
            }
            let (rank, s) = &mut conns[i];
            let (buf, got) = &mut bufs[i];
            let closed = match s.read(&mut buf[*got..]) {
                Ok(0) => true,
                Ok(n) => {
                    *got += n;
                    if *got == HEADER {
                        *got = 0;
                        match Control::decode(buf, world) {
                            Ok(Control::Goodbye) => {
                                health.left[*rank].store(true, Ordering::Release)
                            }
                            Ok(Control::Abort {
                                culprit,
                                reason: AbortReason::Protocol,
                            }) if culprit as usize == me => health.set_rejected(
                                *rank,
                                "it rejected this rank's data: the ranks' calls differ (buffer sizes, dtypes, or the order of collectives)".into(),
                            ),
                            Ok(Control::Abort { culprit, reason }) if culprit as usize == me => {
                                health.set_broken(
                                    *rank,
                                    format!("it gave up on this rank: {}", reason.describe()),
                                )
                            }
                            Ok(Control::Abort { culprit, reason }) => health.set_broken(
                                culprit as usize,
                                format!("rank {rank} gave up on it: {}", reason.describe()),
                            ),
                            Err(e) => {
                                open[i] = false;
                                health.set_broken(*rank, format!("invalid control frame: {e}"));
                            }
                        }
                    }
                    false
                }
                Err(e) => !matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ),
            };
            if closed {
                open[i] = false;
                if !health.left[*rank].load(Ordering::Acquire)
                    && !health.stop.load(Ordering::Acquire)
                {
                    health.set_broken(*rank, "its connection closed without a goodbye (process crashed, was killed, or exited without shutting down its group)".into());
                }
            }
        }
    }
}
