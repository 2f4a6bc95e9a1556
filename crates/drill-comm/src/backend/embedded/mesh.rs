//! The progress engine: moves every message of one operation over the peers' links without
//! blocking on one peer while another could progress, and turns stalls, closed links and the
//! failure detector's findings into errors naming the peer.

use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{AbortReason, Control, HEADER, Header};
use super::health::{Health, Watched, spawn_watch};
use super::link::{Link, Peer};
use crate::dtype::{DType, ReduceOp, reduce_bytes};
use crate::error::{CommError, Result};

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
    /// Wrap established connections and start the failure detector, which declares a peer
    /// silent for `heartbeat` unreachable; `places` says where each rank runs (for messages).
    pub fn new(
        rank: usize,
        peers: Vec<Option<Peer>>,
        places: &[String],
        heartbeat: Duration,
    ) -> Result<Mesh> {
        let health = Arc::new(Health::new(peers.len()));
        for p in peers.iter().flatten() {
            if let Link::Tcp(s) = &p.link {
                s.set_nonblocking(true)
                    .map_err(|e| CommError::io("set non-blocking", e))?;
                s.set_nodelay(true).ok();
            }
        }
        let watched: Vec<Watched> = peers
            .iter()
            .enumerate()
            .filter_map(|(r, p)| {
                Some(Watched {
                    rank: r,
                    place: places.get(r).cloned().unwrap_or_default(),
                    conn: p.as_ref()?.ctrl.try_clone().ok()?,
                })
            })
            .collect();
        if !watched.is_empty() {
            spawn_watch(watched, health.clone(), peers.len(), rank, heartbeat)?;
        }
        Ok(Mesh {
            rank,
            peers,
            health,
            scratch: Vec::new(),
        })
    }

    /// Fail fast if the job is already broken.
    #[inline]
    pub fn check(&self, cx: &Cx) -> Result<()> {
        match health_error(&self.health, cx) {
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
        // A peer that said goodbye did not die: it stopped on an error it reports itself. Its
        // data connection may close before the watcher has read the goodbye on the control
        // one: an error path, so it may wait a moment for it.
        let r = self.run_inner(cx, sends, recvs).map_err(|e| match e {
            CommError::PeerLost {
                op, group, rank, ..
            } if self.left_in_order(rank) => CommError::PeerLeft { op, group, rank },
            e => e,
        });
        if let Err(e) = &r {
            let reason = match e {
                CommError::Timeout { .. } => AbortReason::Timeout,
                CommError::Protocol { .. } => AbortReason::Protocol,
                _ if self.health.silent() => AbortReason::Silent,
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
        if let Some(e) = health_error(&self.health, cx) {
            return Err(e);
        }
        // A peer that left in order cannot send any more; its shared-memory data is all there.
        if self.health.left(waiting_on)
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

    /// Whether peer `rank` said goodbye, waiting up to [`GOODBYE_GRACE`] for the watcher to
    /// read it.
    fn left_in_order(&self, rank: usize) -> bool {
        let deadline = Instant::now() + GOODBYE_GRACE;
        loop {
            if self.health.left(rank) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Tell peers we leave in order (before the connections close).
    pub fn goodbye(&mut self) {
        self.health.stop();
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

/// The error for an operation of a broken job, if it is broken.
#[inline]
fn health_error(health: &Health, cx: &Cx) -> Option<CommError> {
    let (rank, detail) = health.broken()?;
    Some(if health.rejected() {
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

/// How long a lost peer's goodbye may trail its closed connection.
const GOODBYE_GRACE: Duration = Duration::from_millis(250);

fn lost(cx: &Cx, rank: usize, detail: String) -> CommError {
    CommError::PeerLost {
        op: cx.op.name().into(),
        group: cx.name.into(),
        rank,
        detail,
    }
}

fn io_lost(cx: &Cx, rank: usize, e: &io::Error) -> CommError {
    if e.kind() == io::ErrorKind::InvalidData {
        // The peer is there but what it wrote makes no sense (a corrupt shared-memory ring).
        return CommError::Protocol {
            op: cx.op.name().into(),
            group: cx.name.into(),
            rank,
            detail: e.to_string(),
        };
    }
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
