//! [`Router`]: the event links between the processes of a Parallel run — authenticated TCP
//! connections (drill-comm's handshake), found through drill-comm's Store, one reader thread
//! per link. Star relays through node 0 so every worker hears every other.
//!
//! Every link carries a heartbeat every [`HEARTBEAT`]; a peer silent for [`LOST_AFTER`] (its
//! process stopped, its host frozen, the link cut) is lost, as a closed connection is, and
//! writes to it give up after the same time instead of blocking on a full socket. A lost peer
//! fails every wait of this process, unless it is one that may leave ([`Place::may_leave`]):
//! then its link is dropped and [`PEER_LEFT`] is emitted. After the rendezvous the listener
//! keeps taking peers that join ([`Router::join`]), announced with [`PEER_JOINED`].

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drill_comm::{Store, Token};

use crate::TaskError;
use crate::events::{Event, EventBus};

/// How the processes are connected (DI-engine's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Workers connect to node 0, which relays every event to every other worker.
    Star,
    /// Every process connects to every other.
    Mesh,
    /// Only the links named with `attach_to`.
    Alone,
}

impl Topology {
    /// Parse `star|mesh|alone`.
    pub fn parse(s: &str) -> Option<Topology> {
        match s {
            "star" => Some(Topology::Star),
            "mesh" => Some(Topology::Mesh),
            "alone" => Some(Topology::Alone),
            _ => None,
        }
    }
}

/// Largest event frame accepted from a peer.
const MAX_FRAME: usize = 256 << 20;
/// How often each link says this process is alive.
pub const HEARTBEAT: Duration = drill_comm::store::HEARTBEAT_EVERY;
/// Silence after which a peer is lost.
pub const LOST_AFTER: Duration = drill_comm::store::HEARTBEAT_DEAD;
/// The length field of a heartbeat frame (no body; events are at least 4 bytes long).
const HEARTBEAT_LEN: u32 = 1;
/// Emitted by a process that lost a peer that may leave: `(node, why)` (to every process, as a
/// star's others hear of it only from the hub).
pub const PEER_LEFT: &str = "peer_left";
/// Emitted by a process that a peer joined: its node id (`u32`).
pub const PEER_JOINED: &str = "peer_joined";
/// Emitted by a peer that joined once its pipeline listens (its task's barrier): its node id
/// (`u32`). What it should be sent to start with, it can receive from then on.
pub const PEER_READY: &str = "peer_ready";
/// What a joining peer says in its handshake, before its node id.
const JOIN_HELLO: &str = "join.";

/// What one frame on a link holds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// An event, from node `.0`.
    Event(usize, Event),
    /// The peer is alive.
    Heartbeat,
    /// The peer closes the link.
    Goodbye,
}

struct Link {
    peer: usize,
    out: Mutex<TcpStream>,
    /// Its loss is not a failure ([`Place::may_leave`], or a peer that joined).
    may_leave: bool,
    /// Lost; nothing more is sent on it.
    gone: AtomicBool,
}

/// The links of one process.
pub struct Router {
    node: usize,
    topology: Topology,
    links: std::sync::RwLock<Vec<Arc<Link>>>,
    closing: AtomicBool,
    bus: EventBus,
    /// The listener's address, while it takes peers that join.
    listening: Mutex<Option<std::net::SocketAddr>>,
    /// Joined a running job: a peer's goodbye means the run ended without it.
    joined: bool,
}

fn err(detail: String) -> TaskError {
    TaskError::Msg(format!("parallel: {detail}"))
}

/// Encode `event` from `origin`: u32 length of the rest, u16 origin, u16 name length, name,
/// payload. Length 0 is the goodbye.
pub(crate) fn frame(origin: usize, event: &Event) -> Vec<u8> {
    let rest = 4 + event.name.len() + event.payload.len();
    let mut f = Vec::with_capacity(4 + rest);
    f.extend_from_slice(&(rest as u32).to_le_bytes());
    f.extend_from_slice(&(origin as u16).to_le_bytes());
    f.extend_from_slice(&(event.name.len() as u16).to_le_bytes());
    f.extend_from_slice(event.name.as_bytes());
    f.extend_from_slice(&event.payload);
    f
}

/// Read one frame.
pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<Frame> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len == 0 {
        return Ok(Frame::Goodbye);
    }
    if len == HEARTBEAT_LEN {
        return Ok(Frame::Heartbeat);
    }
    let len = len as usize;
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    if !(4..=MAX_FRAME).contains(&len) {
        return Err(bad("frame length out of bounds"));
    }
    // Grown as the bytes arrive: a frame that claims 256 MiB and stops costs what it sent.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut body)?;
    if body.len() < len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let origin = u16::from_le_bytes([body[0], body[1]]) as usize;
    let name_len = u16::from_le_bytes([body[2], body[3]]) as usize;
    if 4 + name_len > len {
        return Err(bad("event name longer than the frame"));
    }
    let name = String::from_utf8(body[4..4 + name_len].to_vec())
        .map_err(|_| bad("event name is not UTF-8"))?;
    let payload = body[4 + name_len..].to_vec();
    Ok(Frame::Event(origin, Event { name, payload }))
}

/// Where one process sits in a Parallel run.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// This node.
    pub node: usize,
    /// Nodes in the run.
    pub n: usize,
    /// How they are linked.
    pub topology: Topology,
    /// `attach[i]`: the nodes node i dials under [`Topology::Alone`].
    pub attach: &'a [Vec<usize>],
    /// Nodes whose loss is not a failure (a split run's collectors): their links are dropped
    /// and [`PEER_LEFT`] is emitted instead.
    pub may_leave: &'a [usize],
}

impl Router {
    /// Link this process as `place` says, deliver incoming events into `bus` and send its
    /// emitted ones out. Addresses go through `store`; every link proves `token`.
    pub fn connect(
        place: Place<'_>,
        store: &Store,
        token: &Token,
        bus: &EventBus,
        timeout: Duration,
    ) -> Result<Arc<Router>, TaskError> {
        let Place {
            node,
            n,
            topology,
            attach,
            may_leave,
        } = place;
        // Links are undirected pairs; of each pair the higher node dials the lower.
        let linked = |i: usize, j: usize| match topology {
            Topology::Star => (i == 0) != (j == 0),
            Topology::Mesh => i != j,
            Topology::Alone => {
                let names = |a: usize, b: usize| attach.get(a).is_some_and(|l| l.contains(&b));
                i != j && (names(i, j) || names(j, i))
            }
        };
        if let Some((i, bad)) = attach
            .iter()
            .enumerate()
            .find_map(|(i, l)| l.iter().find(|&&p| p >= n || p == i).map(|&p| (i, p)))
        {
            return Err(err(format!(
                "attach_to: node {i} names node {bad}, which is not another node of this {n}-node run"
            )));
        }
        let mine: Vec<usize> = (0..node).filter(|&j| linked(node, j)).collect();
        let expect = (node + 1..n).filter(|&j| linked(node, j)).count();
        let ip = drill_comm::net::peer_listen_ip(store).map_err(|e| err(e.to_string()))?;
        let listener = TcpListener::bind((ip, 0)).map_err(|e| err(format!("bind {ip}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| err(e.to_string()))?;
        store
            .set(&format!("addr/{node}"), addr.to_string().as_bytes())
            .map_err(|e| err(e.to_string()))?;
        let mut streams: Vec<(usize, TcpStream)> = Vec::new();
        std::thread::scope(|s| -> Result<(), TaskError> {
            let dialer = s.spawn(|| -> Result<Vec<(usize, TcpStream)>, TaskError> {
                let mut out = Vec::new();
                for &peer in &mine {
                    let addr = store
                        .get_timeout(&format!("addr/{peer}"), timeout)
                        .map_err(|e| {
                            err(format!("node {peer} never published its address: {e}"))
                        })?;
                    let addr = String::from_utf8_lossy(&addr).into_owned();
                    let mut st = TcpStream::connect(&addr)
                        .map_err(|e| err(format!("connect to node {peer} at {addr}: {e}")))?;
                    drill_comm::auth::connect(&mut st, token, node.to_string().as_bytes())
                        .map_err(|e| {
                            // Its listener is up from the moment its address is published: no
                            // answer means it is stopped or frozen.
                            err(format!("{} at {addr}: {e}", nodes(&[peer])))
                        })?;
                    out.push((peer, st));
                }
                Ok(out)
            });
            // Accepted until the deadline: a peer that never dials (stopped, crashed before
            // it got here) fails the rendezvous instead of blocking it forever; strangers and
            // idle connections are dropped without holding up the others.
            let deadline = Instant::now() + timeout;
            if expect > 0 {
                let mut bad = None;
                drill_comm::net::accept_all(
                    &listener,
                    token,
                    &format!("node {node}"),
                    deadline,
                    |st, ident, from| {
                        match String::from_utf8_lossy(&ident).parse::<usize>() {
                            Ok(peer) => streams.push((peer, st)),
                            Err(_) => bad = Some(from),
                        }
                        Ok(streams.len() >= expect)
                    },
                    || None,
                    |e| Some(err(format!("accept: {e}"))),
                )
                .map_err(|e| {
                    e.unwrap_or_else(|| {
                        let missing: Vec<usize> = (node + 1..n)
                            .filter(|&j| linked(node, j) && streams.iter().all(|(p, _)| *p != j))
                            .collect();
                        err(format!(
                            "node {node}: {} did not connect within {timeout:?} (stopped, crashed or unreachable)",
                            nodes(&missing)
                        ))
                    })
                })?;
                if let Some(from) = bad {
                    tracing::warn!("node {node}: {from} sent a bad node id");
                }
            }
            streams.extend(dialer.join().map_err(|_| err("dialer panicked".into()))??);
            Ok(())
        })?;
        let router = Router::new(node, topology, bus, false);
        for (peer, st) in streams {
            router.add_link(peer, st, may_leave.contains(&peer))?;
        }
        router.take_joiners(listener, token.clone())?;
        router.start(bus)?;
        Ok(router)
    }

    /// A router with no link yet for `node`, delivering into `bus`; `joined`: it joins a
    /// running job.
    fn new(node: usize, topology: Topology, bus: &EventBus, joined: bool) -> Arc<Router> {
        Arc::new(Router {
            node,
            topology,
            links: std::sync::RwLock::new(Vec::new()),
            closing: AtomicBool::new(false),
            bus: bus.clone(),
            listening: Mutex::new(None),
            joined,
        })
    }

    /// Join the running job whose store is `store` as node `node`: dial `peers` (the hub
    /// under a star, the nodes it exchanges with otherwise), which take it as a peer that may
    /// leave; theirs are links whose loss fails this process.
    pub fn join(
        node: usize,
        peers: &[usize],
        store: &Store,
        token: &Token,
        bus: &EventBus,
        timeout: Duration,
    ) -> Result<Arc<Router>, TaskError> {
        let router = Router::new(node, Topology::Alone, bus, true);
        for &peer in peers {
            let addr = store
                .get_timeout(&format!("addr/{peer}"), timeout)
                .map_err(|e| err(format!("node {peer} of the job has no address: {e}")))?;
            let addr = String::from_utf8_lossy(&addr).into_owned();
            let mut st = TcpStream::connect(&addr)
                .map_err(|e| err(format!("connect to node {peer} at {addr}: {e}")))?;
            drill_comm::auth::connect(&mut st, token, format!("{JOIN_HELLO}{node}").as_bytes())
                .map_err(|e| err(format!("{} at {addr}: {e}", nodes(&[peer]))))?;
            router.add_link(peer, st, false)?;
        }
        router.start(bus)?;
        Ok(router)
    }

    /// Heartbeats on every link, and this process's emitted events out to its peers.
    fn start(self: &Arc<Self>, bus: &EventBus) -> Result<(), TaskError> {
        let beats = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("drill-task-heartbeat".into())
            .spawn(move || {
                while let Some(r) = beats.upgrade() {
                    if r.closing.load(Ordering::SeqCst) {
                        return;
                    }
                    r.beat();
                    drop(r);
                    std::thread::sleep(HEARTBEAT);
                }
            })
            .map_err(|e| err(format!("heartbeat thread: {e}")))?;
        let out = Arc::downgrade(self);
        bus.set_remote(move |e| {
            if let Some(r) = out.upgrade() {
                r.send(r.node, e, None);
            }
        });
        Ok(())
    }

    /// Keep a link to `peer` over `st` and read its frames on a thread of its own: events go
    /// into the bus (and on to the others from a star's hub); its loss fails the bus, or
    /// when it `may_leave` drops the link and emits [`PEER_LEFT`].
    fn add_link(
        self: &Arc<Self>,
        peer: usize,
        st: TcpStream,
        may_leave: bool,
    ) -> Result<(), TaskError> {
        st.set_nodelay(true).ok();
        st.set_read_timeout(Some(LOST_AFTER))
            .and_then(|_| st.set_write_timeout(Some(LOST_AFTER)))
            .map_err(|e| err(format!("link to node {peer}: {e}")))?;
        let link = Arc::new(Link {
            peer,
            out: Mutex::new(st.try_clone().map_err(|e| err(e.to_string()))?),
            may_leave,
            gone: AtomicBool::new(false),
        });
        self.links
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(link.clone());
        let router = self.clone();
        std::thread::Builder::new()
            .name(format!("drill-task-link-{peer}"))
            .spawn(move || {
                let mut r = BufReader::new(st);
                let why = loop {
                    match read_frame(&mut r) {
                        Ok(Frame::Event(origin, event)) => {
                            if router.topology == Topology::Star && router.node == 0 {
                                router.send(origin, &event, Some(peer));
                            }
                            router.bus.deliver(&event);
                        }
                        Ok(Frame::Heartbeat) => {}
                        Ok(Frame::Goodbye) => break None,
                        Err(e) if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {
                            break Some(format!(
                                "nothing heard from it for {LOST_AFTER:?}: its process is stopped, its host frozen or the link cut"
                            ));
                        }
                        Err(e) => break Some(format!("{e}; it crashed or was killed")),
                    }
                };
                if router.closing.load(Ordering::SeqCst) {
                    return;
                }
                if link.may_leave {
                    link.gone.store(true, Ordering::SeqCst);
                    let _ = r.get_ref().shutdown(std::net::Shutdown::Both);
                    let why = why.unwrap_or_else(|| "it said goodbye".into());
                    let _ = router.bus.emit(PEER_LEFT, &(peer as u32, why));
                } else if let Some(why) = why {
                    router.bus.fail(format!("{} is gone ({why})", nodes(&[peer])));
                } else if router.joined {
                    router
                        .bus
                        .fail(format!("{} closed its link: the run ended", nodes(&[peer])));
                }
            })
            .map_err(|e| err(format!("reader thread: {e}")))?;
        Ok(())
    }

    /// Take peers that join from now on, on `listener` (the one the rendezvous used): each
    /// proves `token` and names itself `join.N`; it may leave.
    fn take_joiners(
        self: &Arc<Self>,
        listener: TcpListener,
        token: Token,
    ) -> Result<(), TaskError> {
        listener
            .set_nonblocking(false)
            .map_err(|e| err(format!("listener: {e}")))?;
        let addr = listener.local_addr().map_err(|e| err(e.to_string()))?;
        *self.listening.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
        let router = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("drill-task-joiners".into())
            .spawn(move || {
                for st in listener.incoming() {
                    let Some(r) = router.upgrade() else { return };
                    if r.closing.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(mut st) = st else { continue };
                    let (r, token) = (r.clone(), token.clone());
                    // A handshake that stalls holds up no one else.
                    std::thread::spawn(move || {
                        let _ = st.set_read_timeout(Some(LOST_AFTER));
                        let Ok(hello) = drill_comm::auth::accept(&mut st, &token) else {
                            return;
                        };
                        let hello = String::from_utf8_lossy(&hello).into_owned();
                        let Some(peer) = hello
                            .strip_prefix(JOIN_HELLO)
                            .and_then(|n| n.parse::<usize>().ok())
                        else {
                            tracing::warn!("node {}: a connection named itself {hello:?}", r.node);
                            return;
                        };
                        if r.add_link(peer, st, true).is_ok() {
                            let _ = r.bus.emit(PEER_JOINED, &(peer as u32));
                        }
                    });
                }
            })
            .map_err(|e| err(format!("joiners thread: {e}")))?;
        Ok(())
    }

    /// Send `event` (from `origin`) on every live link except `skip`. A failed write means
    /// the peer is gone; its reader reports that.
    fn send(&self, origin: usize, event: &Event, skip: Option<usize>) {
        let f = frame(origin, event);
        let links = self.links.read().unwrap_or_else(|p| p.into_inner());
        for l in links.iter().filter(|l| Some(l.peer) != skip) {
            if l.gone.load(Ordering::SeqCst) {
                continue;
            }
            let mut out = l.out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(&f);
        }
    }

    /// A heartbeat on every link whose writer is free (one busy sending an event shows the
    /// process alive already).
    fn beat(&self) {
        let links = self.links.read().unwrap_or_else(|p| p.into_inner());
        for l in links.iter().filter(|l| !l.gone.load(Ordering::SeqCst)) {
            if let Ok(mut out) = l.out.try_lock() {
                let _ = out.write_all(&HEARTBEAT_LEN.to_le_bytes());
            }
        }
    }

    /// Nodes this process has a live link to.
    pub fn peers(&self) -> Vec<usize> {
        let links = self.links.read().unwrap_or_else(|p| p.into_inner());
        links
            .iter()
            .filter(|l| !l.gone.load(Ordering::SeqCst))
            .map(|l| l.peer)
            .collect()
    }

    /// Say goodbye on every link (peers then see a clean close, not a loss) and stop taking
    /// peers that join.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(addr) = self
            .listening
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            // Wakes the joiners' thread, which sees the router closing.
            let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
        }
        let links = self.links.read().unwrap_or_else(|p| p.into_inner());
        for l in links.iter() {
            let mut out = l.out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(&0u32.to_le_bytes());
            let _ = out.shutdown(std::net::Shutdown::Write);
        }
    }
}

/// How an error names the nodes it is about: "node 1", "nodes 1, 2" (the campaign's planted
/// bug says "a node").
fn nodes(ids: &[usize]) -> String {
    if drill_plant::planted(drill_plant::Bug::ErrorNamesNoRank) {
        return "a node".into();
    }
    let list: Vec<String> = ids.iter().map(usize::to_string).collect();
    let s = if ids.len() == 1 { "" } else { "s" };
    format!("node{s} {}", list.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_bytes_are_errors() {
        let e = Event {
            name: "learn_output".into(),
            payload: vec![1, 2, 3],
        };
        let f = frame(3, &e);
        assert_eq!(read_frame(&mut &f[..]).unwrap(), Frame::Event(3, e));
        assert_eq!(
            read_frame(&mut &[0u8, 0, 0, 0][..]).unwrap(),
            Frame::Goodbye
        );
        assert_eq!(
            read_frame(&mut &[1u8, 0, 0, 0][..]).unwrap(),
            Frame::Heartbeat
        );
        for bad in [
            &[255u8, 255, 255, 255][..],
            &[2, 0, 0, 0, 0, 0][..],
            &[6, 0, 0, 0, 0, 0, 9, 0, b'a', b'b'][..],
            &[5, 0, 0, 0][..],
        ] {
            assert!(read_frame(&mut &bad[..]).is_err(), "{bad:?}");
        }
    }
}
