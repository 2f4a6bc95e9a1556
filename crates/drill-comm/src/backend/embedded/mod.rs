//! The embedded backend (the default; nothing to install): shared-memory rings between ranks
//! on one host, TCP between hosts, a full mesh of authenticated control connections as the
//! failure detector, and size-dependent algorithms ([`algo`]).

pub(crate) mod algo;
pub(crate) mod frame;
pub(crate) mod health;
pub(crate) mod link;
pub(crate) mod mesh;
pub(crate) mod shm;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::algo::View;
use self::link::{Link, Peer};
use self::mesh::{Cx, Mesh, Sink, recv_from, send_to};
use super::{Backend, OpCode};
use crate::auth::{self, Token};
use crate::dtype::{DType, ReduceOp};
use crate::error::{CommError, Result};
use crate::store::Store;

/// all_reduce sizes up to this many bytes use recursive doubling; larger ones the ring.
pub const SMALL_ALL_REDUCE: usize = 64 << 10;

/// How the embedded backend connects.
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// Use shared memory between ranks of one host (`DRILL_SHM=0` turns it off).
    pub shm: bool,
    /// Longest wait without progress.
    pub timeout: Duration,
    /// Silence after which a peer counts as unreachable ([`health`]).
    pub heartbeat: Duration,
}

/// One group on the embedded backend: a view of the process's mesh.
pub struct Embedded {
    mesh: Arc<Mutex<Mesh>>,
    ranks: Vec<usize>,
    rank: usize,
    id: u16,
    name: String,
    seq: u32,
    timeout: Duration,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.goodbye();
    }
}

/// This host's name (its UTS namespace's), for messages.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().replace(char::is_whitespace, "_"))
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unnamed".into())
}

fn host_id() -> String {
    use std::os::unix::fs::MetadataExt;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let shm = std::fs::metadata("/dev/shm")
        .map(|m| format!("{}:{}", m.dev(), m.ino()))
        .unwrap_or_default();
    format!("{}/{}", boot.trim(), shm)
}

impl Embedded {
    /// Rendezvous through `store`: publish our address, connect to every other rank
    /// (authenticated), set up shared memory with same-host ranks, start the failure detector.
    pub fn connect(
        rank: usize,
        world: usize,
        store: &Store,
        token: &Token,
        opts: &EmbeddedOptions,
    ) -> Result<Embedded> {
        let timeout = opts.timeout;
        let listener =
            TcpListener::bind("0.0.0.0:0").map_err(|e| CommError::io("bind a peer listener", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| CommError::io("listener address", e))?
            .port();
        let ip = match store.local_ip() {
            Some(ip) if !ip.is_unspecified() => ip.to_string(),
            _ => "127.0.0.1".into(),
        };
        let me_host = if opts.shm && shm::available() {
            host_id()
        } else {
            format!("no-shm-{rank}")
        };
        store.set(
            &format!("addr/{rank}"),
            format!("{ip}:{port} {me_host} {}", host_name()).as_bytes(),
        )?;
        let mut addrs = Vec::with_capacity(world);
        let mut places = Vec::with_capacity(world);
        for r in 0..world {
            let v = store
                .get_timeout(&format!("addr/{r}"), timeout)
                .map_err(|_| CommError::Store {
                    addr: format!("{store:?}"),
                    detail: format!("rank {r} did not join the rendezvous within {timeout:?}"),
                })?;
            let v = String::from_utf8(v)
                .map_err(|_| CommError::Env(format!("rank {r} published a bad address")))?;
            let mut fields = v.splitn(3, ' ');
            let (Some(a), Some(h), Some(name)) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(CommError::Env(format!("rank {r} published {v:?}")));
            };
            addrs.push((a.to_string(), h.to_string()));
            places.push(format!("host {name} ({a})"));
        }
        let same_host = |r: usize| addrs[r].1 == me_host && !me_host.starts_with("no-shm");

        // Higher ranks connect to lower ones; accept ours on a helper thread meanwhile.
        let expected: usize = (rank + 1..world)
            .map(|j| if same_host(j) { 1 } else { 2 })
            .sum();
        let deadline = Instant::now() + timeout;
        let accepted = std::thread::scope(|s| -> Result<_> {
            let acceptor =
                s.spawn(|| accept_peers(&listener, token, rank, world, expected, deadline));
            let mut outgoing = HashMap::new();
            for (i, (addr, _)) in addrs.iter().enumerate().take(rank) {
                let ctrl = dial(addr, token, &format!("{rank} {i} c"), deadline, i)?;
                let data = if same_host(i) {
                    None
                } else {
                    Some(dial(addr, token, &format!("{rank} {i} d"), deadline, i)?)
                };
                outgoing.insert(i, (ctrl, data));
            }
            let mut incoming = acceptor.join().expect("acceptor thread panicked")?;
            incoming.extend(outgoing);
            Ok(incoming)
        })?;
        drop(listener);

        // Shared memory: the lower rank of a same-host pair creates the segment.
        let cap = shm::ring_capacity();
        let mut conns = accepted;
        let mut segs = HashMap::new();
        for j in rank + 1..world {
            if same_host(j) {
                let path = shm::segment_path(rank, j);
                let seg = shm::Segment::create(&path, cap)?;
                let ctrl = &mut conns.get_mut(&j).expect("connected").0;
                let p = path.to_string_lossy().into_owned();
                ctrl.write_all(&(p.len() as u16).to_le_bytes())
                    .and_then(|_| ctrl.write_all(p.as_bytes()))
                    .map_err(|e| {
                        CommError::io(format!("send shared-memory name to rank {j}"), e)
                    })?;
                segs.insert(j, (seg, path));
            }
        }
        for i in 0..rank {
            if same_host(i) {
                let ctrl = &mut conns.get_mut(&i).expect("connected").0;
                ctrl.set_read_timeout(Some(timeout)).ok();
                let mut l = [0u8; 2];
                ctrl.read_exact(&mut l)
                    .map_err(|e| CommError::io(format!("shared-memory name from rank {i}"), e))?;
                let len = u16::from_le_bytes(l) as usize;
                if len > 256 {
                    return Err(CommError::Protocol {
                        op: "init".into(),
                        group: "world".into(),
                        rank: i,
                        detail: format!("shared-memory name of {len} bytes"),
                    });
                }
                let mut p = vec![0u8; len];
                ctrl.read_exact(&mut p)
                    .map_err(|e| CommError::io(format!("shared-memory name from rank {i}"), e))?;
                let p = String::from_utf8(p).map_err(|_| {
                    CommError::Env(format!("rank {i} sent a bad shared-memory name"))
                })?;
                if !p.starts_with("/dev/shm/drill-") || p.contains("..") {
                    return Err(CommError::Protocol {
                        op: "init".into(),
                        group: "world".into(),
                        rank: i,
                        detail: format!("shared-memory name {p:?}"),
                    });
                }
                let seg = shm::Segment::open(std::path::Path::new(&p), cap)?;
                ctrl.write_all(&[1]).map_err(|e| {
                    CommError::io(format!("acknowledge shared memory to rank {i}"), e)
                })?;
                ctrl.set_read_timeout(None).ok();
                segs.insert(i, (seg, p.into()));
            }
        }
        for (&j, (_, path)) in segs.iter().filter(|(j, _)| **j > rank) {
            let ctrl = &mut conns.get_mut(&j).expect("connected").0;
            ctrl.set_read_timeout(Some(timeout)).ok();
            let mut ack = [0u8; 1];
            let r = ctrl.read_exact(&mut ack);
            // Unlinked as soon as both sides mapped it: nothing is left in /dev/shm, even on a crash.
            let _ = std::fs::remove_file(path);
            r.map_err(|e| {
                CommError::io(format!("shared-memory acknowledgement from rank {j}"), e)
            })?;
            ctrl.set_read_timeout(None).ok();
        }

        let mut peers: Vec<Option<Peer>> = (0..world).map(|_| None).collect();
        for (j, (ctrl, data)) in conns {
            let link = match (data, segs.remove(&j)) {
                (Some(tcp), _) => Link::Tcp(tcp),
                (None, Some((seg, _))) => {
                    let (tx, rx) = if rank < j {
                        (seg.ring(0), seg.ring(1))
                    } else {
                        (seg.ring(1), seg.ring(0))
                    };
                    Link::Shm { tx, rx }
                }
                (None, None) => unreachable!("same-host peer without a segment"),
            };
            peers[j] = Some(Peer::new(link, ctrl));
        }
        let (shm_ranks, tcp_ranks): (Vec<usize>, Vec<usize>) = (0..world)
            .filter(|&j| j != rank)
            .partition(|&j| peers[j].as_ref().is_some_and(|p| p.link.is_shm()));
        tracing::info!(
            "rank {rank} on {}: shared memory with ranks {shm_ranks:?}, TCP with ranks {tcp_ranks:?}",
            places[rank]
        );
        let mesh = Mesh::new(rank, peers, &places, opts.heartbeat)?;
        store.barrier("connected", world, timeout)?;
        Ok(Embedded {
            mesh: Arc::new(Mutex::new(mesh)),
            ranks: (0..world).collect(),
            rank,
            id: 0,
            name: "world".into(),
            seq: 0,
            timeout,
        })
    }

    /// A world of one process (no connections).
    pub fn single(timeout: Duration) -> Result<Embedded> {
        Ok(Embedded {
            mesh: Arc::new(Mutex::new(Mesh::new(
                0,
                vec![None],
                &[],
                health::HEARTBEAT_TIMEOUT,
            )?)),
            ranks: vec![0],
            rank: 0,
            id: 0,
            name: "world".into(),
            seq: 0,
            timeout,
        })
    }

    /// How many peers are reached through shared memory (for reports and tests).
    pub fn shm_peers(&self) -> usize {
        let m = self.mesh.lock().unwrap_or_else(|p| p.into_inner());
        m.peers.iter().flatten().filter(|p| p.link.is_shm()).count()
    }

    /// A collective: numbered by the group's own counter.
    fn op<R>(&mut self, op: OpCode, f: impl FnOnce(&mut View, &Cx) -> Result<R>) -> Result<R> {
        let seq = self.seq;
        self.seq = self.seq.wrapping_add(1);
        self.on_mesh(op, seq, f)
    }

    /// Run `f` on the locked mesh for operation `op` numbered `seq` (the tag for send/recv),
    /// failing first if the job is already broken.
    fn on_mesh<R>(
        &self,
        op: OpCode,
        seq: u32,
        f: impl FnOnce(&mut View, &Cx) -> Result<R>,
    ) -> Result<R> {
        let cx = Cx {
            op,
            group: self.id,
            name: &self.name,
            seq,
            timeout: self.timeout,
        };
        let mut m = self.mesh.lock().unwrap_or_else(|p| p.into_inner());
        m.check(&cx)?;
        let mut view = View {
            mesh: &mut m,
            ranks: &self.ranks,
            rank: self.rank,
        };
        f(&mut view, &cx)
    }
}

fn dial(
    addr: &str,
    token: &Token,
    ident: &str,
    deadline: Instant,
    peer: usize,
) -> Result<TcpStream> {
    loop {
        let attempt = (|| -> Result<TcpStream> {
            let sa: std::net::SocketAddr = addr
                .parse()
                .map_err(|_| CommError::Env(format!("rank {peer} address {addr:?}")))?;
            let mut s = TcpStream::connect_timeout(&sa, Duration::from_secs(2))
                .map_err(|e| CommError::io(format!("connect to rank {peer} at {addr}"), e))?;
            s.set_nodelay(true).ok();
            auth::connect(&mut s, token, format!("drill-peer {ident}").as_bytes())?;
            Ok(s)
        })();
        match attempt {
            Ok(s) => return Ok(s),
            Err(e @ CommError::Auth { .. }) => return Err(e),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

type Conns = HashMap<usize, (TcpStream, Option<TcpStream>)>;

fn accept_peers(
    listener: &TcpListener,
    token: &Token,
    rank: usize,
    world: usize,
    expected: usize,
    deadline: Instant,
) -> Result<Conns> {
    let mut got: HashMap<usize, (Option<TcpStream>, Option<TcpStream>)> = HashMap::new();
    let mut n = 0;
    listener
        .set_nonblocking(true)
        .map_err(|e| CommError::io("listener", e))?;
    while n < expected {
        match listener.accept() {
            Ok((mut s, from)) => {
                s.set_nonblocking(false).ok();
                let ident = match auth::accept(&mut s, token) {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::warn!("rank {rank}: refused a connection from {from}: {e}");
                        continue;
                    }
                };
                let ident = String::from_utf8_lossy(&ident).into_owned();
                let parts: Vec<&str> = ident
                    .strip_prefix("drill-peer ")
                    .unwrap_or("")
                    .split(' ')
                    .collect();
                let parsed = match parts.as_slice() {
                    [f, t, k] => f
                        .parse::<usize>()
                        .ok()
                        .zip(t.parse::<usize>().ok())
                        .map(|(f, t)| (f, t, *k)),
                    _ => None,
                };
                match parsed {
                    Some((f, t, k))
                        if t == rank && f > rank && f < world && (k == "c" || k == "d") =>
                    {
                        let e = got.entry(f).or_default();
                        let slot = if k == "c" { &mut e.0 } else { &mut e.1 };
                        if slot.is_none() {
                            s.set_nodelay(true).ok();
                            *slot = Some(s);
                            n += 1;
                        }
                    }
                    _ => tracing::warn!(
                        "rank {rank}: dropped a connection from {from} with identity {ident:?}"
                    ),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (rank + 1..world)
                        .filter(|j| got.get(j).is_none_or(|e| e.0.is_none()))
                        .collect();
                    return Err(CommError::Env(format!(
                        "rank {rank}: ranks {missing:?} did not connect in time"
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(CommError::io("accept a peer", e)),
        }
    }
    Ok(got
        .into_iter()
        .map(|(k, (c, d))| (k, (c.expect("control connection"), d)))
        .collect())
}

impl Backend for Embedded {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.ranks.len()
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        self.op(OpCode::Broadcast, |v, cx| algo::broadcast(v, cx, buf, root))
    }

    fn all_reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.op(OpCode::AllReduce, |v, cx| {
            algo::all_reduce(v, cx, buf, dtype, op, SMALL_ALL_REDUCE)
        })
    }

    fn reduce(&mut self, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        self.op(OpCode::Reduce, |v, cx| {
            algo::reduce(v, cx, buf, dtype, op, root)
        })
    }

    fn all_gather(&mut self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        self.op(OpCode::AllGather, |v, cx| {
            algo::all_gather(v, cx, send, recv)
        })
    }

    fn gather(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.op(OpCode::Gather, |v, cx| {
            algo::gather(v, cx, send, recv, root)
        })
    }

    fn scatter(&mut self, send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.op(OpCode::Scatter, |v, cx| {
            algo::scatter(v, cx, send, recv, root)
        })
    }

    fn reduce_scatter(
        &mut self,
        send: &[u8],
        recv: &mut [u8],
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.op(OpCode::ReduceScatter, |v, cx| {
            algo::reduce_scatter(v, cx, send, recv, dtype, op)
        })
    }

    fn barrier(&mut self) -> Result<()> {
        self.op(OpCode::Barrier, algo::barrier)
    }

    fn send(&mut self, buf: &[u8], dst: usize, tag: u32) -> Result<()> {
        let g = self.ranks[dst];
        self.on_mesh(OpCode::P2p, tag, |v, cx| {
            v.mesh.run(cx, &mut [send_to(g, buf)], &mut [])
        })
    }

    fn recv(&mut self, buf: &mut [u8], src: usize, tag: u32) -> Result<()> {
        let g = self.ranks[src];
        self.on_mesh(OpCode::P2p, tag, |v, cx| {
            v.mesh
                .run(cx, &mut [], &mut [recv_from(g, Sink::Copy(buf))])
        })
    }

    fn new_group(
        &mut self,
        ranks: &[usize],
        id: u16,
        name: &str,
    ) -> Result<Option<Box<dyn Backend>>> {
        // Sub-groups share the process's connections; headers carry the group id, so their
        // messages can never be mistaken for another group's.
        let Some(pos) = ranks.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        Ok(Some(Box::new(Embedded {
            mesh: self.mesh.clone(),
            ranks: ranks.iter().map(|&r| self.ranks[r]).collect(),
            rank: pos,
            id,
            name: name.to_string(),
            seq: 0,
            timeout: self.timeout,
        })))
    }
}
