//! Where a job listens and who may connect: every listener of drill (the store, the
//! rendezvous, the ranks' mesh, a split run's router) binds the address [`listen_ip`] gives,
//! never every interface, and accepts through [`accept_all`], whose handshakes run side by
//! side so that idle or slow connections cannot hold up a rendezvous.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::auth::{self, Token};
use crate::error::{CommError, Result};

/// The environment variable that names the address to listen on (`drill launch --bind`).
pub const BIND_VAR: &str = "DRILL_BIND";

/// Most handshakes in flight at once on one listener; connections beyond it are closed
/// unanswered until one finishes.
pub const MAX_PENDING: usize = 64;

/// The local address this job's listeners bind, for a job whose store is at
/// `endpoint_host`: `DRILL_BIND` when set; loopback when the endpoint is a loopback address
/// (single-machine jobs); the endpoint's own address when it is one of this host's; else the
/// address of the interface this host reaches the endpoint through.
pub fn listen_ip(endpoint_host: &str) -> Result<IpAddr> {
    if let Some(ip) = bind_override()? {
        return Ok(ip);
    }
    let addrs: Vec<IpAddr> = (endpoint_host, 0)
        .to_socket_addrs()
        .map_err(|e| {
            CommError::Env(format!(
                "cannot resolve the job's endpoint host {endpoint_host:?}: {e}"
            ))
        })?
        .map(|a| a.ip())
        .collect();
    if let Some(ip) = addrs.iter().find(|ip| ip.is_loopback()) {
        return Ok(*ip);
    }
    // One of ours: binding it succeeds only on this host.
    if let Some(ip) = addrs
        .iter()
        .find(|ip| UdpSocket::bind(SocketAddr::new(**ip, 0)).is_ok())
    {
        return Ok(*ip);
    }
    // Another host's: the interface the route to it leaves through (connecting a UDP socket
    // sends nothing).
    for ip in &addrs {
        let any: IpAddr = match ip {
            IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
        };
        let local = UdpSocket::bind(SocketAddr::new(any, 0))
            .and_then(|s| s.connect(SocketAddr::new(*ip, 9)).map(|_| s))
            .and_then(|s| s.local_addr());
        if let Ok(a) = local {
            return Ok(a.ip());
        }
    }
    Err(CommError::Env(format!(
        "no interface of this host reaches the job's endpoint {endpoint_host:?} ({addrs:?}); \
         name one with {BIND_VAR}=ADDRESS (drill launch --bind)"
    )))
}

/// `DRILL_BIND`, parsed, when set and not empty.
pub fn bind_override() -> Result<Option<IpAddr>> {
    match std::env::var(BIND_VAR) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<IpAddr>()
            .map(Some)
            .map_err(|_| CommError::Env(format!("{BIND_VAR}={v:?} is not an IP address"))),
        _ => Ok(None),
    }
}

/// The address a rank's own listener binds (the embedded backend's mesh, a split run's
/// router): `DRILL_BIND` when set, else the local end of its connection to the store (the
/// interface the others reach it through), else loopback.
pub fn peer_listen_ip(store: &crate::store::Store) -> Result<IpAddr> {
    Ok(bind_override()?
        .or_else(|| store.local_ip().filter(|ip| !ip.is_unspecified()))
        .unwrap_or(Ipv4Addr::LOCALHOST.into()))
}

/// Whether `host` names this machine's loopback only (a job that cannot span hosts).
pub fn is_loopback(host: &str) -> bool {
    match (host, 0).to_socket_addrs() {
        Ok(mut a) => a.all(|a| a.ip().is_loopback()),
        Err(_) => false,
    }
}

/// The token of a job whose store is at `endpoint_host`: `DRILL_JOB_TOKEN`'s (`secret`).
/// Without one, a job on loopback (one machine: only its own users can reach the ports)
/// uses a fixed token; a job reachable from other hosts is refused, since a well-known
/// secret would let anyone who reaches the port join it.
pub fn job_token(secret: Option<&str>, endpoint_host: &str) -> Result<Token> {
    match secret {
        Some(t) if !t.is_empty() => Ok(Token::new(t)),
        _ if is_loopback(endpoint_host) => {
            static NOTE: Once = Once::new();
            NOTE.call_once(|| {
                tracing::debug!(
                    "DRILL_JOB_TOKEN is not set: a loopback-only job uses a fixed token"
                )
            });
            Ok(Token::new("drill-loopback-token"))
        }
        _ => Err(CommError::Env(format!(
            "DRILL_JOB_TOKEN is not set and the job's store is at {endpoint_host:?}, \
             reachable from other hosts: set the same secret for every rank, e.g. \
             `export DRILL_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')` \
             before srun or the ranks' commands (drill launch makes one for its ranks)"
        ))),
    }
}

/// Accept authenticated connections on `listener` until `keep` says it has all it wants
/// (`Ok(true)`) or `deadline` passes (then `timed_out()`'s error). Each handshake runs on a
/// thread of its own, at most [`MAX_PENDING`] at once and each bounded by
/// [`auth::HANDSHAKE_TIMEOUT`]; a refused one is logged with `who` and skipped, so a stranger
/// or an idle connection costs the job nothing. `keep` gets the stream, the identity the
/// connector proved and its address.
pub fn accept_all<E>(
    listener: &TcpListener,
    token: &Token,
    who: &str,
    deadline: Instant,
    mut keep: impl FnMut(TcpStream, Vec<u8>, SocketAddr) -> std::result::Result<bool, E>,
    timed_out: impl FnOnce() -> E,
    io_error: impl FnOnce(std::io::Error) -> E,
) -> std::result::Result<(), E> {
    if let Err(e) = listener.set_nonblocking(true) {
        return Err(io_error(e));
    }
    let pending = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<(TcpStream, SocketAddr, Result<Vec<u8>>)>();
    loop {
        let mut idle = true;
        match listener.accept() {
            Ok((stream, from)) => {
                idle = false;
                if pending.load(Ordering::Acquire) >= MAX_PENDING {
                    tracing::warn!("{who}: {MAX_PENDING} handshakes pending; closed {from}");
                } else if stream.set_nonblocking(false).is_ok() {
                    pending.fetch_add(1, Ordering::AcqRel);
                    let (tx, token, pending) = (tx.clone(), token.clone(), pending.clone());
                    // Not scoped: a connection that stalls its handshake must not hold up
                    // the return; the thread ends within the handshake's timeout.
                    let spawned = std::thread::Builder::new()
                        .name("drill-handshake".into())
                        .spawn(move || {
                            let mut stream = stream;
                            let r = auth::accept(&mut stream, &token);
                            pending.fetch_sub(1, Ordering::AcqRel);
                            let _ = tx.send((stream, from, r));
                        });
                    if spawned.is_err() {
                        tracing::warn!("{who}: no thread for a handshake; closed {from}");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(e)),
        }
        while let Ok((stream, from, r)) = rx.try_recv() {
            idle = false;
            match r {
                Ok(ident) => {
                    if keep(stream, ident, from)? {
                        return Ok(());
                    }
                }
                Err(e) => tracing::warn!("{who}: refused a connection from {from}: {e}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        if idle {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn loopback_endpoints_bind_loopback() {
        assert_eq!(
            listen_ip("127.0.0.1").unwrap(),
            IpAddr::from([127, 0, 0, 1])
        );
        assert!(listen_ip("localhost").unwrap().is_loopback());
        assert!(is_loopback("127.0.0.1") && !is_loopback("10.255.255.1"));
        // Another host's address: the interface towards it, never the wildcard.
        if let Ok(ip) = listen_ip("10.255.255.1") {
            assert!(!ip.is_unspecified(), "{ip}");
        }
        let e = listen_ip("no-such-host.invalid").unwrap_err().to_string();
        assert!(e.contains("no-such-host.invalid"), "{e}");
    }

    /// Idle connections (a slowloris) do not hold up a real one: with their handshakes run
    /// one after another, 12 idle connections would hold it for 12 x 5 s, past the 30 s bound.
    #[test]
    fn idle_connections_cannot_stall_the_accept_loop() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let token = Token::new("slow");
        let idle: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // A stranger that speaks garbage is refused, not fatal.
        let mut stranger = TcpStream::connect(addr).unwrap();
        stranger.write_all(&[0u8; 80]).unwrap();
        let t = token.clone();
        let client = std::thread::spawn(move || {
            // After the idle ones, so a sequential loop would meet them first.
            std::thread::sleep(Duration::from_millis(200));
            let mut s = TcpStream::connect(addr).unwrap();
            auth::connect(&mut s, &t, b"real").map(|_| s)
        });
        let mut got = Vec::new();
        accept_all(
            &l,
            &token,
            "test",
            Instant::now() + Duration::from_secs(30),
            |s, ident, _| {
                got.push((s, ident));
                Ok::<_, String>(true)
            },
            || "timed out".to_string(),
            |e| e.to_string(),
        )
        .unwrap();
        assert_eq!(got[0].1, b"real");
        // The idle connections are still open and were never kept.
        assert_eq!(idle.len(), 12);
        client.join().unwrap().unwrap();
    }

    #[test]
    fn the_deadline_ends_an_accept_loop_that_gets_nothing() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = accept_all(
            &l,
            &Token::new("x"),
            "test",
            Instant::now() + Duration::from_millis(50),
            |_, _, _| Ok::<_, String>(true),
            || "timed out".to_string(),
            |e| e.to_string(),
        );
        assert_eq!(r.unwrap_err(), "timed out");
    }
}
