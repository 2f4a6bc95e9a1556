//! How the embedded backend's ranks find and reach each other: addresses through the store
//! ([`Directory`]), a full mesh of authenticated TCP control connections (plus a data
//! connection between hosts), and a shared-memory segment between ranks of one host.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::EmbeddedOptions;
use super::link::{Link, Peer};
use super::shm;
use crate::auth::{self, Token};
use crate::error::{CommError, Result};
use crate::store::Store;

/// Every rank's link to this one (`None` at this rank's own index) and every rank's place
/// ("host NAME (ADDR)", for messages).
pub(super) fn peers(
    rank: usize,
    world: usize,
    store: &Store,
    token: &Token,
    opts: &EmbeddedOptions,
) -> Result<(Vec<Option<Peer>>, Vec<String>)> {
    let ip = crate::net::peer_listen_ip(store)?;
    let listener = TcpListener::bind((ip, 0))
        .map_err(|e| CommError::io(format!("bind a peer listener on {ip}"), e))?;
    let port = listener
        .local_addr()
        .map_err(|e| CommError::io("listener address", e))?
        .port();
    let dir = Directory::exchange(rank, world, store, ip, port, opts)?;
    let mut conns = connect_all(&listener, &dir, token, rank, world, opts.timeout)?;
    drop(listener);
    let mut segs = share_memory(rank, world, &dir, &mut conns, opts.timeout)?;
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
    Ok((peers, dir.places))
}

/// Where every rank listens and which host it is on, as each published it in the store.
struct Directory {
    /// `IP:PORT` of each rank's listener.
    addrs: Vec<String>,
    /// Each rank's host identity ([`host_id`]), or `no-shm-RANK` when it shares no memory.
    hosts: Vec<String>,
    /// "host NAME (ADDR)" of each rank, for messages.
    places: Vec<String>,
    /// This rank's host identity.
    me_host: String,
}

impl Directory {
    /// Publish this rank's listener `port` and host, then read every rank's (waiting up to
    /// the timeout for each).
    fn exchange(
        rank: usize,
        world: usize,
        store: &Store,
        ip: std::net::IpAddr,
        port: u16,
        opts: &EmbeddedOptions,
    ) -> Result<Self> {
        let timeout = opts.timeout;
        let addr = std::net::SocketAddr::new(ip, port);
        let me_host = if opts.shm && shm::available() {
            host_id()
        } else {
            format!("no-shm-{rank}")
        };
        store.set(
            &format!("addr/{rank}"),
            format!("{addr} {me_host} {}", host_name()).as_bytes(),
        )?;
        let mut dir = Directory {
            addrs: Vec::with_capacity(world),
            hosts: Vec::with_capacity(world),
            places: Vec::with_capacity(world),
            me_host,
        };
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
            dir.addrs.push(a.to_string());
            dir.hosts.push(h.to_string());
            dir.places.push(format!("host {name} ({a})"));
        }
        Ok(dir)
    }

    /// Whether rank `r` shares memory with this one.
    fn same_host(&self, r: usize) -> bool {
        self.hosts[r] == self.me_host && !self.me_host.starts_with("no-shm")
    }
}

/// The control connection (and, to another host, the data connection) with every other rank:
/// higher ranks dial lower ones, while a helper thread accepts ours.
fn connect_all(
    listener: &TcpListener,
    dir: &Directory,
    token: &Token,
    rank: usize,
    world: usize,
    timeout: Duration,
) -> Result<Conns> {
    let expected: usize = (rank + 1..world)
        .map(|j| if dir.same_host(j) { 1 } else { 2 })
        .sum();
    let deadline = Instant::now() + timeout;
    std::thread::scope(|s| -> Result<_> {
        let acceptor = s.spawn(|| accept_peers(listener, token, rank, world, expected, deadline));
        let mut outgoing = HashMap::new();
        for (i, addr) in dir.addrs.iter().enumerate().take(rank) {
            let ctrl = dial(addr, token, &format!("{rank} {i} c"), deadline, i)?;
            let data = if dir.same_host(i) {
                None
            } else {
                Some(dial(addr, token, &format!("{rank} {i} d"), deadline, i)?)
            };
            outgoing.insert(i, (ctrl, data));
        }
        let mut incoming = acceptor.join().expect("acceptor thread panicked")?;
        incoming.extend(outgoing);
        Ok(incoming)
    })
}

/// A shared-memory segment with every same-host rank, over the control connections: the
/// lower rank of a pair creates it and sends its name, the higher one opens it and
/// acknowledges, and the creator unlinks it then, so nothing is left in `/dev/shm`, even
/// after a crash.
fn share_memory(
    rank: usize,
    world: usize,
    dir: &Directory,
    conns: &mut Conns,
    timeout: Duration,
) -> Result<HashMap<usize, (Arc<shm::Segment>, PathBuf)>> {
    let cap = shm::ring_capacity();
    let mut segs = HashMap::new();
    for j in (rank + 1..world).filter(|&j| dir.same_host(j)) {
        let path = shm::segment_path(rank, j);
        let seg = shm::Segment::create(&path, cap)?;
        let ctrl = &mut conns.get_mut(&j).expect("connected").0;
        let p = path.to_string_lossy().into_owned();
        ctrl.write_all(&(p.len() as u16).to_le_bytes())
            .and_then(|_| ctrl.write_all(p.as_bytes()))
            .map_err(|e| CommError::io(format!("send shared-memory name to rank {j}"), e))?;
        segs.insert(j, (seg, path));
    }
    for i in (0..rank).filter(|&i| dir.same_host(i)) {
        let ctrl = &mut conns.get_mut(&i).expect("connected").0;
        segs.insert(i, open_offered(ctrl, i, cap, timeout)?);
    }
    for (&j, (_, path)) in segs.iter().filter(|(j, _)| **j > rank) {
        let ctrl = &mut conns.get_mut(&j).expect("connected").0;
        ctrl.set_read_timeout(Some(timeout)).ok();
        let mut ack = [0u8; 1];
        let r = ctrl.read_exact(&mut ack);
        if !drill_plant::planted(drill_plant::Bug::LeakedShm) {
            let _ = std::fs::remove_file(path);
        }
        r.map_err(|e| CommError::io(format!("shared-memory acknowledgement from rank {j}"), e))?;
        ctrl.set_read_timeout(None).ok();
    }
    Ok(segs)
}

/// Open the segment lower rank `i` names on `ctrl` (checked to be one of drill's) and
/// acknowledge it.
fn open_offered(
    ctrl: &mut TcpStream,
    i: usize,
    cap: usize,
    timeout: Duration,
) -> Result<(Arc<shm::Segment>, PathBuf)> {
    let refused = |detail: String| CommError::Protocol {
        op: "init".into(),
        group: "world".into(),
        rank: i,
        detail,
    };
    ctrl.set_read_timeout(Some(timeout)).ok();
    let mut l = [0u8; 2];
    ctrl.read_exact(&mut l)
        .map_err(|e| CommError::io(format!("shared-memory name from rank {i}"), e))?;
    let len = u16::from_le_bytes(l) as usize;
    if len > 256 {
        return Err(refused(format!("shared-memory name of {len} bytes")));
    }
    let mut p = vec![0u8; len];
    ctrl.read_exact(&mut p)
        .map_err(|e| CommError::io(format!("shared-memory name from rank {i}"), e))?;
    let p = String::from_utf8(p)
        .map_err(|_| CommError::Env(format!("rank {i} sent a bad shared-memory name")))?;
    if !p.starts_with("/dev/shm/drill-") || p.contains("..") {
        return Err(refused(format!("shared-memory name {p:?}")));
    }
    let seg = shm::Segment::open(std::path::Path::new(&p), cap)?;
    ctrl.write_all(&[1])
        .map_err(|e| CommError::io(format!("acknowledge shared memory to rank {i}"), e))?;
    ctrl.set_read_timeout(None).ok();
    Ok((seg, p.into()))
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
            // Refused, reset or unanswered until the deadline: the peer is stopped, frozen,
            // unreachable or gone (a live one still in its rendezvous answers in time).
            Err(e) if Instant::now() >= deadline => {
                return Err(CommError::PeerLost {
                    op: "connect".into(),
                    group: "world".into(),
                    rank: peer,
                    detail: format!(
                        "no connection to it at {addr} by the rendezvous deadline: it is stopped, frozen, unreachable or gone; last: {e}"
                    ),
                });
            }
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
    if expected > 0 {
        crate::net::accept_all(
            listener,
            token,
            &format!("rank {rank}"),
            deadline,
            |s, ident, from| {
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
                Ok(n >= expected)
            },
            || None,
            |e| Some(CommError::io("accept a peer", e)),
        )
        .map_err(|e| match e {
            Some(e) => e,
            None => {
                let missing: Vec<usize> = (rank + 1..world)
                    .filter(|j| got.get(j).is_none_or(|e| e.0.is_none()))
                    .collect();
                CommError::Env(format!(
                    "rank {rank}: ranks {missing:?} did not connect in time"
                ))
            }
        })?;
    }
    Ok(got
        .into_iter()
        .map(|(k, (c, d))| (k, (c.expect("control connection"), d)))
        .collect())
}
