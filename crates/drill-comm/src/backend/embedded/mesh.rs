//! The connections of one process to every other rank, the progress engine that moves
//! messages over them without blocking, and the failure detector that watches them.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::frame::{AbortReason, Control, HEADER, Header};
use super::shm::Ring;
use crate::dtype::{DType, ReduceOp, reduce_bytes};
use crate::error::{CommError, Result};

/// Bytes of the staging buffer that received data is reduced from.
const STAGE: usize = 64 << 10;

/// How bytes travel to one peer.
pub enum Link {
    /// A TCP connection (non-blocking).
    Tcp(TcpStream),
    /// Two shared-memory rings.
    Shm {
        /// Ours to write.
        tx: Ring,
        /// Ours to read.
        rx: Ring,
    },
}

impl Link {
    #[inline]
    fn write_some(&mut self, hdr: &[u8], payload: &[u8]) -> io::Result<usize> {
        match self {
            Link::Shm { tx, .. } => {
                let n = tx.write_some(hdr);
                if n < hdr.len() {
                    return Ok(n);
                }
                Ok(n + tx.write_some(payload))
            }
            Link::Tcp(s) => match s.write_vectored(&[IoSlice::new(hdr), IoSlice::new(payload)]) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
                Err(e) => Err(e),
            },
        }
    }

    #[inline]
    fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Shm { rx, .. } => Ok(rx.read_some(buf)),
            Link::Tcp(s) => match s.read(buf) {
                Ok(0) if !buf.is_empty() => Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
                Err(e) => Err(e),
            },
        }
    }

    /// Whether this link goes through shared memory.
    pub fn is_shm(&self) -> bool {
        matches!(self, Link::Shm { .. })
    }
}

/// Another rank: its data link, control connection and reduction staging buffer.
pub struct Peer {
    /// How data travels.
    pub link: Link,
    /// Control connection (failure notices; its closing is how death is noticed).
    pub ctrl: TcpStream,
    stage: Vec<u64>,
}

impl Peer {
    /// A peer from its connections.
    pub fn new(link: Link, ctrl: TcpStream) -> Peer {
        Peer {
            link,
            ctrl,
            stage: vec![0u64; STAGE / 8],
        }
    }
}

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
    fn new(world: usize) -> Health {
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

    /// The error for an operation of a broken job, if it is broken.
    #[inline]
    fn error(&self, cx: &Cx) -> Option<CommError> {
        let (rank, detail) = self.broken()?;
        Some(if self.rejected.load(Ordering::Acquire) {
            CommError::Protocol {
                op: cx.op.name().into(),
                group: cx.name.into(),
                rank,
                detail,
            }
        } else {
            lost(cx, rank, detail)
        })
    }
}

/// Identifies the operation in progress, for headers and error messages.
pub struct Cx<'a> {
    /// Operation kind.
    pub op: super::super::OpCode,
    /// Group id.
    pub group: u16,
    /// Group name for messages.
    pub name: &'a str,
    /// Sequence number (or tag).
    pub seq: u32,
    /// Longest wait without progress.
    pub timeout: Duration,
}

/// Where a received payload goes.
pub enum Sink<'a> {
    /// Copied into the buffer.
    Copy(&'a mut [u8]),
    /// Combined into the buffer element-wise.
    Reduce(&'a mut [u8], DType, ReduceOp),
}

impl Sink<'_> {
    fn len(&self) -> usize {
        match self {
            Sink::Copy(b) | Sink::Reduce(b, ..) => b.len(),
        }
    }
}

/// An outgoing message in flight.
pub struct SendX<'a> {
    peer: usize,
    hdr: [u8; HEADER],
    payload: &'a [u8],
    pos: usize,
}

/// An incoming message in flight.
pub struct RecvX<'a> {
    peer: usize,
    sink: Sink<'a>,
    hdr: [u8; HEADER],
    hdr_got: usize,
    got: usize,
    fill: usize,
}

/// A message to `peer` (global rank).
pub fn send_to(peer: usize, payload: &[u8]) -> SendX<'_> {
    SendX {
        peer,
        hdr: [0; HEADER],
        payload,
        pos: 0,
    }
}

/// A message expected from `peer` (global rank).
pub fn recv_from(peer: usize, sink: Sink<'_>) -> RecvX<'_> {
    RecvX {
        peer,
        sink,
        hdr: [0; HEADER],
        hdr_got: 0,
        got: 0,
        fill: 0,
    }
}

/// Every connection of this process.
pub struct Mesh {
    /// This process's global rank.
    pub rank: usize,
    /// Connections indexed by global rank (`None` for ourselves).
    pub peers: Vec<Option<Peer>>,
    /// Failure detector state.
    pub health: Arc<Health>,
    /// Reusable scratch space for algorithms.
    pub scratch: Vec<u64>,
}

impl Mesh {
    /// Wrap established connections and start the failure detector.
    pub fn new(rank: usize, peers: Vec<Option<Peer>>) -> Result<Mesh> {
        let health = Arc::new(Health::new(peers.len()));
        for p in peers.iter().flatten() {
            if let Link::Tcp(s) = &p.link {
                s.set_nonblocking(true)
                    .map_err(|e| CommError::io("set non-blocking", e))?;
                s.set_nodelay(true).ok();
            }
        }
        let watched: Vec<(usize, TcpStream)> = peers
            .iter()
            .enumerate()
            .filter_map(|(r, p)| Some((r, p.as_ref()?.ctrl.try_clone().ok()?)))
            .collect();
        if !watched.is_empty() {
            let h = health.clone();
            let world = peers.len();
            std::thread::Builder::new()
                .name("drill-comm-watch".into())
                .spawn(move || watch(watched, h, world, rank))
                .map_err(|e| CommError::io("spawn failure detector", e))?;
        }
        Ok(Mesh {
            rank,
            peers,
            health,
            scratch: Vec::new(),
        })
    }

    /// Scratch of at least `bytes` bytes, 8-byte aligned.
    pub fn scratch(&mut self, bytes: usize) -> &mut [u8] {
        let words = bytes.div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        &mut bytemuck::cast_slice_mut(&mut self.scratch[..words])[..bytes]
    }

    /// Fail fast if the job is already broken.
    #[inline]
    pub fn check(&self, cx: &Cx) -> Result<()> {
        match self.health.error(cx) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Tell every peer we give up on `culprit`, and remember it.
    pub fn abort(&mut self, culprit: usize, reason: AbortReason, detail: &str) {
        self.health.set_broken(culprit, detail.to_string());
        let frame = Control::Abort {
            culprit: culprit as u32,
            reason,
        }
        .encode();
        for p in self.peers.iter_mut().flatten() {
            let _ = p.ctrl.write_all(&frame);
        }
    }

    /// Move every message to completion, never blocking on one peer while another could
    /// progress. Waits longer than `cx.timeout` without progress fail naming the peer.
    pub fn run(&mut self, cx: &Cx, sends: &mut [SendX], recvs: &mut [RecvX]) -> Result<()> {
        let r = self.run_inner(cx, sends, recvs);
        if let Err(e) = &r {
            let reason = match e {
                CommError::Timeout { .. } => AbortReason::Timeout,
                CommError::Protocol { .. } => AbortReason::Protocol,
                _ => AbortReason::Lost,
            };
            if let Some(rank) = e.peer() {
                self.abort(rank, reason, &e.to_string());
            }
        }
        r
    }

    fn run_inner(&mut self, cx: &Cx, sends: &mut [SendX], recvs: &mut [RecvX]) -> Result<()> {
        for s in sends.iter_mut() {
            s.hdr = Header {
                op: cx.op,
                group: cx.group,
                seq: cx.seq,
                len: s.payload.len() as u64,
            }
            .encode();
        }
        let mut idle: u32 = 0;
        let mut since = None::<Instant>;
        let mut left_seen = false;
        loop {
            let mut progressed = false;
            let mut done = true;
            for s in sends.iter_mut() {
                let total = HEADER + s.payload.len();
                if s.pos == total {
                    continue;
                }
                let peer = self.peers[s.peer].as_mut().expect("no link to self");
                let (h, p) = if s.pos < HEADER {
                    (&s.hdr[s.pos..], s.payload)
                } else {
                    (&[][..], &s.payload[s.pos - HEADER..])
                };
                let n = peer
                    .link
                    .write_some(h, p)
                    .map_err(|e| io_lost(cx, s.peer, &e))?;
                s.pos += n;
                progressed |= n > 0;
                done &= s.pos == total;
            }
            for r in recvs.iter_mut() {
                let total = r.sink.len();
                if r.hdr_got == HEADER && r.got == total {
                    continue;
                }
                let n =
                    progress_recv(cx, self.peers[r.peer].as_mut().expect("no link to self"), r)?;
                progressed |= n > 0;
                done &= r.hdr_got == HEADER && r.got == total;
            }
            if done {
                return Ok(());
            }
            if progressed {
                idle = 0;
                since = None;
                left_seen = false;
                continue;
            }
            idle += 1;
            if idle < 256 {
                std::hint::spin_loop();
                continue;
            }
            if idle < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            if idle.is_multiple_of(16) {
                self.check_waiting(cx, sends, recvs, &mut since, &mut left_seen)?;
            }
        }
    }

    fn check_waiting(
        &self,
        cx: &Cx,
        sends: &[SendX],
        recvs: &[RecvX],
        since: &mut Option<Instant>,
        left_seen: &mut bool,
    ) -> Result<()> {
        let waiting_on = recvs
            .iter()
            .find(|r| !(r.hdr_got == HEADER && r.got == r.sink.len()))
            .map(|r| r.peer)
            .or_else(|| {
                sends
                    .iter()
                    .find(|s| s.pos < HEADER + s.payload.len())
                    .map(|s| s.peer)
            })
            .unwrap_or(self.rank);
        if let Some(e) = self.health.error(cx) {
            return Err(e);
        }
        // A peer that left in order cannot send any more; its shared-memory data is all there.
        if self.health.left[waiting_on].load(Ordering::Acquire)
            && self.peers[waiting_on]
                .as_ref()
                .is_some_and(|p| p.link.is_shm())
        {
            // Its last messages may have landed after our last look: error only when a full
            // round of progress attempts after noticing found nothing.
            if std::mem::replace(left_seen, true) {
                return Err(lost(
                    cx,
                    waiting_on,
                    "it shut its process group down while this rank still waits on it".into(),
                ));
            }
            return Ok(());
        }
        let now = Instant::now();
        let start = *since.get_or_insert(now);
        if now - start > cx.timeout {
            return Err(CommError::Timeout {
                op: cx.op.name().into(),
                group: cx.name.into(),
                rank: waiting_on,
                timeout: cx.timeout,
            });
        }
        Ok(())
    }

    /// Tell peers we leave in order (before the connections close).
    pub fn goodbye(&mut self) {
        self.health.stop.store(true, Ordering::Release);
        let frame = Control::Goodbye.encode();
        for p in self.peers.iter_mut().flatten() {
            let _ = p.ctrl.write_all(&frame);
        }
    }
}

fn progress_recv(cx: &Cx, peer: &mut Peer, r: &mut RecvX) -> Result<usize> {
    let mut moved = 0;
    if r.hdr_got < HEADER {
        let n = peer
            .link
            .read_some(&mut r.hdr[r.hdr_got..])
            .map_err(|e| io_lost(cx, r.peer, &e))?;
        r.hdr_got += n;
        moved += n;
        if r.hdr_got < HEADER {
            return Ok(moved);
        }
        let expect = Header {
            op: cx.op,
            group: cx.group,
            seq: cx.seq,
            len: r.sink.len() as u64,
        };
        Header::check(&expect, &r.hdr).map_err(|detail| CommError::Protocol {
            op: cx.op.name().into(),
            group: cx.name.into(),
            rank: r.peer,
            detail,
        })?;
    }
    match &mut r.sink {
        Sink::Copy(buf) => {
            if r.got < buf.len() {
                let n = peer
                    .link
                    .read_some(&mut buf[r.got..])
                    .map_err(|e| io_lost(cx, r.peer, &e))?;
                r.got += n;
                moved += n;
            }
        }
        Sink::Reduce(acc, dtype, op) => {
            let esz = dtype.size();
            let stage: &mut [u8] = bytemuck::cast_slice_mut(&mut peer.stage);
            loop {
                let want = (acc.len() - r.got - r.fill).min(stage.len() - r.fill);
                if want == 0 {
                    break;
                }
                let n = peer
                    .link
                    .read_some(&mut stage[r.fill..r.fill + want])
                    .map_err(|e| io_lost(cx, r.peer, &e))?;
                if n == 0 {
                    break;
                }
                moved += n;
                r.fill += n;
                let whole = r.fill - r.fill % esz;
                reduce_bytes(*dtype, *op, &mut acc[r.got..r.got + whole], &stage[..whole]);
                r.got += whole;
                stage.copy_within(whole..r.fill, 0);
                r.fill -= whole;
            }
        }
    }
    Ok(moved)
}

fn lost(cx: &Cx, rank: usize, detail: String) -> CommError {
    CommError::PeerLost {
        op: cx.op.name().into(),
        group: cx.name.into(),
        rank,
        detail,
    }
}

fn io_lost(cx: &Cx, rank: usize, e: &io::Error) -> CommError {
    let detail = match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            "its connection closed (process exited or was killed)".to_string()
        }
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
            "its connection was reset (process exited or was killed)".to_string()
        }
        _ => format!("connection error: {e}"),
    };
    lost(cx, rank, detail)
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
