//! The failure detector: a thread that sends a heartbeat on every peer's control connection
//! every [`HEARTBEAT_EVERY`], sleeps in poll() on them otherwise, and records the first crash
//! (EOF without goodbye), silence (no frame for the heartbeat timeout: a cut link, a stopped
//! process, a frozen host) or abort notice in [`Health`], which every operation of the process
//! checks. It runs on its own thread, so a long operation is never taken for a dead peer.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::frame::{AbortReason, Control, HEADER};
use crate::error::{CommError, Result};
use crate::store::HEARTBEAT_EVERY;

/// Silence after which a peer counts as unreachable, unless `DRILL_HEARTBEAT_TIMEOUT`
/// (seconds) says otherwise: drill's one silence bound ([`crate::store::HEARTBEAT_DEAD`]).
pub const HEARTBEAT_TIMEOUT: Duration = crate::store::HEARTBEAT_DEAD;

/// One watched peer: its global rank, where it runs (for messages) and its control connection.
pub struct Watched {
    /// Global rank.
    pub rank: usize,
    /// `host NAME (ADDRESS)`.
    pub place: String,
    /// Control connection (a clone of the mesh's).
    pub conn: TcpStream,
}

/// What the failure detector knows, shared by every group of the process.
pub struct Health {
    broken: AtomicBool,
    why: Mutex<Option<(usize, String)>>,
    /// The cause is a peer that rejected this rank's data (the culprit was this rank).
    rejected: AtomicBool,
    /// The cause is a peer that fell silent (no heartbeat).
    silent: AtomicBool,
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
            silent: AtomicBool::new(false),
            left: (0..world).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        }
    }

    /// Record that the job is broken because of `rank` (the first cause wins).
    pub fn set_broken(&self, rank: usize, detail: String) {
        self.record(rank, detail, None);
    }

    /// Record that the job is broken because `rank` fell silent (the first cause wins).
    pub fn set_silent(&self, rank: usize, detail: String) {
        self.record(rank, detail, Some(&self.silent));
    }

    /// Whether the cause is a peer that fell silent.
    #[inline]
    pub fn silent(&self) -> bool {
        self.silent.load(Ordering::Acquire)
    }

    /// Record that peer `by` gave up on this rank because its data did not match (the first
    /// cause wins): this rank's calls then fail with a protocol error naming `by`.
    pub fn set_rejected(&self, by: usize, detail: String) {
        self.record(by, detail, Some(&self.rejected));
    }

    /// Mark the job broken; if this is the first cause, keep `rank` and `detail` and raise
    /// `kind` (the flag saying what sort of cause it is).
    fn record(&self, rank: usize, detail: String, kind: Option<&AtomicBool>) {
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            *w = Some((rank, detail));
            if let Some(kind) = kind {
                kind.store(true, Ordering::Release);
            }
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

/// Start watching the control connections `conns` of rank `me`; a peer silent for `timeout`
/// is declared unreachable.
pub fn spawn_watch(
    conns: Vec<Watched>,
    health: Arc<Health>,
    world: usize,
    me: usize,
    timeout: Duration,
) -> Result<()> {
    std::thread::Builder::new()
        .name("drill-comm-watch".into())
        .spawn(move || watch(conns, health, world, me, timeout))
        .map(|_| ())
        .map_err(|e| CommError::io("spawn failure detector", e))
}

/// The failure detector's loop (see the module docs).
fn watch(mut conns: Vec<Watched>, health: Arc<Health>, world: usize, me: usize, timeout: Duration) {
    let mut bufs: Vec<([u8; HEADER], usize)> = vec![([0; HEADER], 0); conns.len()];
    let mut open = vec![true; conns.len()];
    let start = Instant::now();
    let mut heard = vec![start; conns.len()];
    let mut next_beat = start;
    let beat = Control::Heartbeat.encode();
    let mut places = vec![String::new(); world];
    for w in &conns {
        places[w.rank] = w.place.clone();
    }
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns.len());
    for w in &conns {
        let _ = w.conn.set_nonblocking(true);
    }
    while !health.stop.load(Ordering::Acquire) && open.iter().any(|&o| o) {
        let now = Instant::now();
        if now >= next_beat {
            next_beat = now + HEARTBEAT_EVERY;
            for (w, _) in conns.iter_mut().zip(&open).filter(|(_, o)| **o) {
                // A full send buffer means the peer has not read for a long while; its own
                // silence is what gets noticed, so a beat that does not fit is dropped.
                let _ = w.conn.write(&beat);
            }
        }
        fds.clear();
        fds.extend(conns.iter().zip(&open).map(|(w, &o)| libc::pollfd {
            fd: if o { w.conn.as_raw_fd() } else { -1 },
            events: libc::POLLIN,
            revents: 0,
        }));
        let wait = next_beat
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        // SAFETY: `fds` is a live, exclusively borrowed array of `fds.len()` pollfd structs.
        let rc = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis() as i32,
            )
        };
        let now = Instant::now();
        for (i, fd) in fds.iter().enumerate() {
            if rc <= 0 || fd.revents == 0 || !open[i] {
                continue;
            }
            let w = &mut conns[i];
            let rank = w.rank;
            let (buf, got) = &mut bufs[i];
            let closed = match w.conn.read(&mut buf[*got..]) {
                Ok(0) => true,
                Ok(n) => {
                    heard[i] = now;
                    *got += n;
                    if *got == HEADER {
                        *got = 0;
                        match Control::decode(buf, world) {
                            Ok(Control::Heartbeat) => {}
                            Ok(Control::Goodbye) => health.left[rank].store(true, Ordering::Release),
                            Ok(Control::Abort {
                                culprit,
                                reason: AbortReason::Protocol,
                            }) if culprit as usize == me => health.set_rejected(
                                rank,
                                "it rejected this rank's data: the ranks' calls differ (buffer sizes, dtypes, or the order of collectives)".into(),
                            ),
                            Ok(Control::Abort { culprit, reason }) if culprit as usize == me => {
                                health.set_broken(
                                    rank,
                                    format!("it gave up on this rank: {}", reason.describe()),
                                )
                            }
                            Ok(Control::Abort { culprit, reason }) => health.set_broken(
                                culprit as usize,
                                format!(
                                    "rank {rank} gave up on it: {}; it ran on {}",
                                    reason.describe(),
                                    places[culprit as usize]
                                ),
                            ),
                            Err(e) => {
                                open[i] = false;
                                health.set_broken(rank, format!("invalid control frame: {e}"));
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
                if !health.left[rank].load(Ordering::Acquire)
                    && !health.stop.load(Ordering::Acquire)
                {
                    health.set_broken(rank, format!("its connection closed without a goodbye, on {} (process crashed, was killed, or exited without shutting down its group)", w.place));
                }
            }
        }
        // After reading: a process resumed from a stop finds its peers' beats waiting.
        for (i, w) in conns.iter().enumerate() {
            let silent = now.saturating_duration_since(heard[i]);
            if open[i] && silent > timeout && !health.left[w.rank].load(Ordering::Acquire) {
                open[i] = false;
                health.set_silent(
                    w.rank,
                    format!(
                        "nothing heard from it for {:.1} s, on {}: the network link to it is cut, its process is stopped (SIGSTOP) or its host is frozen",
                        silent.as_secs_f64(),
                        w.place
                    ),
                );
            }
        }
    }
}
