//! Node-level rendezvous through the store: which node is which, how many ranks each brings,
//! and the failure flag that makes every node restart (or stop) together.

use std::time::{Duration, Instant};

use drill_comm::{Store, StoreServer, Token};

use crate::{LaunchConfig, LaunchError};

/// Where this node's ranks sit in one attempt of the job.
#[derive(Clone, Debug)]
pub struct Placement {
    /// This node's index.
    pub node_rank: usize,
    /// Global rank of this node's local rank 0.
    pub rank_offset: usize,
    /// Ranks in the job.
    pub world_size: usize,
    /// Store host for the workers.
    pub master_addr: String,
    /// Store port for the workers.
    pub master_port: u16,
}

/// The launcher's connection to the job's store (and the store itself on the hosting node).
pub struct Rendezvous {
    pub(crate) store: Store,
    _server: Option<StoreServer>,
    pub(crate) hosting: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) nnodes: usize,
    nproc: usize,
    node_rank: Option<usize>,
    timeout: Duration,
}

impl Rendezvous {
    /// Host or reach the store: `--rdzv-endpoint`'s (whichever node can bind its port
    /// hosts it), else `--master-addr`'s (node 0 hosts it).
    pub fn join(cfg: &LaunchConfig, token: &str) -> Result<Rendezvous, LaunchError> {
        let token = Token::new(token);
        let (host, port, hosting_wanted) = match &cfg.rdzv_endpoint {
            Some(ep) => {
                let (h, p) = ep
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
                    .ok_or_else(|| {
                        LaunchError::Usage(format!("--rdzv-endpoint {ep:?}: expected HOST:PORT"))
                    })?;
                (h, p, None)
            }
            None => (
                cfg.master_addr.clone(),
                cfg.master_port,
                Some(cfg.node_rank.unwrap_or(0) == 0),
            ),
        };
        // Short reply slack: behind a cut link, a report or a check must fail in seconds,
        // not hold this node's failure handling (the next request connects again).
        let prefix = format!("launch/{}", cfg.rdzv_id);
        let reach = |wait: Duration| {
            Store::connect(&host, port, &token, wait).map(|s| {
                s.with_prefix(&prefix)
                    .with_reply_slack(Duration::from_secs(2))
            })
        };
        let ip = || match cfg.bind {
            Some(ip) => Ok(ip),
            None => drill_comm::net::listen_ip(&host),
        };
        let (server, store) = match hosting_wanted {
            Some(true) => {
                let at = std::net::SocketAddr::new(ip()?, port);
                let server = StoreServer::bind(&at.to_string(), &token).map_err(|e| {
                    LaunchError::Usage(format!("cannot host the store on {at}: {e} (is another job using --master-port {port}?)"))
                })?;
                (Some(server), reach(cfg.timeout)?)
            }
            Some(false) => (None, reach(cfg.timeout)?),
            None => Self::host_or_reach(ip()?, port, &token, cfg.timeout, reach)?,
        };
        Ok(Rendezvous {
            store,
            hosting: server.is_some(),
            _server: server,
            host,
            port,
            nnodes: cfg.nnodes,
            nproc: cfg.nproc_per_node,
            node_rank: cfg.node_rank,
            timeout: cfg.timeout,
        })
    }

    /// Dynamic rendezvous: whoever can bind the endpoint's port hosts the store, the others
    /// reach it. While nobody answers there, binding is tried again: the port may have been
    /// held for a moment by something else (an outgoing connection's local end), and then
    /// every launcher would otherwise wait on a store nobody hosts.
    fn host_or_reach(
        ip: std::net::IpAddr,
        port: u16,
        token: &Token,
        timeout: Duration,
        reach: impl Fn(Duration) -> drill_comm::Result<Store>,
    ) -> Result<(Option<StoreServer>, Store), LaunchError> {
        let deadline = Instant::now() + timeout;
        loop {
            let bind_error = match std::net::TcpListener::bind((ip, port)) {
                Ok(l) => {
                    let server = StoreServer::serve(l, token)?;
                    return Ok((Some(server), reach(timeout)?));
                }
                Err(e) => e,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match reach(left.min(Duration::from_millis(500))) {
                Ok(store) => return Ok((None, store)),
                Err(e @ drill_comm::CommError::Auth { .. }) => return Err(e.into()),
                Err(e) if left.is_zero() => {
                    return Err(LaunchError::Usage(format!(
                        "rendezvous: {e}; nor could this node host the store on port {port}: {bind_error}"
                    )));
                }
                Err(_) => {}
            }
        }
    }

    /// Agree on node ranks and rank offsets for attempt `round`.
    pub fn next_round(&mut self, round: usize) -> Result<Placement, LaunchError> {
        let r = format!("round{round}");
        let node_rank = match self.node_rank {
            Some(n) => n,
            None => {
                let n = self.store.add(&format!("{r}/join"), 1)? as usize - 1;
                if n >= self.nnodes {
                    return Err(LaunchError::Usage(format!(
                        "more than --nnodes {} launchers joined rendezvous round {round}",
                        self.nnodes
                    )));
                }
                n
            }
        };
        // After a failure the store may be behind a link that is still down: keep trying (the
        // request is idempotent) for as long as a node may take to join.
        let deadline = Instant::now() + self.timeout;
        let key = format!("{r}/nproc/{node_rank}");
        while let Err(e) = self.store.set(&key, self.nproc.to_string().as_bytes()) {
            if Instant::now() >= deadline {
                return Err(e.into());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let keys: Vec<String> = (0..self.nnodes).map(|n| format!("{r}/nproc/{n}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.store.wait(&refs, self.timeout).map_err(|_| {
            // Which nodes never came (the store may be out of reach too: then it says so).
            let missing: Vec<String> = (0..self.nnodes)
                .filter(|n| !self.store.check(&[refs[*n]]).unwrap_or(false))
                .map(|n| format!("node {n}"))
                .collect();
            let who = if missing.is_empty() {
                "the store stopped answering".to_string()
            } else {
                format!("missing: {}", missing.join(", "))
            };
            LaunchError::Usage(format!(
                "not all {} nodes joined the rendezvous within {:?} ({who})",
                self.nnodes, self.timeout
            ))
        })?;
        let mut offset = 0;
        let mut world = 0;
        for (n, k) in keys.iter().enumerate() {
            let v: usize = String::from_utf8_lossy(&self.store.get(k)?)
                .parse()
                .unwrap_or(0);
            if n < node_rank {
                offset += v;
            }
            world += v;
        }
        Ok(Placement {
            node_rank,
            rank_offset: offset,
            world_size: world,
            master_addr: self.host.clone(),
            master_port: self.port,
        })
    }

    /// Tell every node that attempt `round` failed.
    pub fn report_failure(&self, round: usize, what: &str) {
        let _ = self
            .store
            .compare_set(&format!("round{round}/failed"), b"", what.as_bytes());
    }

    /// Another node's failure report for attempt `round`, if any.
    pub fn remote_failure(&self, round: usize) -> Option<String> {
        text(&self.store, &format!("round{round}/failed"))
    }

    /// This node finished attempt `round`; the hosting node keeps the store up until every
    /// node has said so (bounded by the timeout).
    pub fn finish(&self, round: usize) {
        self.finish_nodes(round, self.nnodes);
    }

    /// [`Rendezvous::finish`] for a round of `nodes` nodes (an elastic job's rounds vary).
    pub(crate) fn finish_nodes(&self, round: usize, nodes: usize) {
        let k = format!("round{round}/done");
        let _ = self.store.add(&k, 1);
        if self.hosting {
            let deadline = Instant::now() + self.timeout;
            while Instant::now() < deadline {
                match self.store.add(&k, 0) {
                    Ok(n) if n as usize >= nodes => break,
                    Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => break,
                }
            }
        }
    }
}

/// The text at `key`, if the key is set and the store answers.
pub(crate) fn text(store: &Store, key: &str) -> Option<String> {
    if store.check(&[key]).ok()? {
        store
            .get(key)
            .ok()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP socket bound to `port` on every interface but not listening: binding the port
    /// fails and connecting to it is refused, as when an outgoing connection's local end holds
    /// it.
    struct Squatter(libc::c_int);

    impl Squatter {
        fn on(port: u16) -> Squatter {
            // SAFETY: plain socket calls on a descriptor this struct owns; `addr` outlives them.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                assert!(fd >= 0);
                let mut addr: libc::sockaddr_in = std::mem::zeroed();
                addr.sin_family = libc::AF_INET as libc::sa_family_t;
                addr.sin_port = port.to_be();
                let rc = libc::bind(
                    fd,
                    (&addr as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                );
                assert_eq!(rc, 0, "bind {port}: {}", std::io::Error::last_os_error());
                Squatter(fd)
            }
        }
    }

    impl Drop for Squatter {
        fn drop(&mut self) {
            // SAFETY: the descriptor is ours and closed once.
            unsafe { libc::close(self.0) };
        }
    }

    fn dynamic(port: u16) -> LaunchConfig {
        LaunchConfig {
            nproc_per_node: 1,
            nnodes: 2,
            node_rank: None,
            master_addr: String::new(),
            master_port: 0,
            rdzv_endpoint: Some(format!("127.0.0.1:{port}")),
            rdzv_id: "squat".into(),
            max_restarts: 0,
            monitor_interval: Duration::from_millis(100),
            grace: Duration::from_secs(1),
            log_dir: None,
            timeout: Duration::from_secs(20),
            program: "true".into(),
            args: vec![],
            env: vec![],
            bind: None,
            elastic: None,
            optional: Vec::new(),
        }
    }

    #[test]
    fn a_port_held_for_a_moment_is_hosted_once_it_is_free() {
        let port = drill_comm::spawn::free_port();
        let squatter = Squatter::on(port);
        let nodes: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut r = Rendezvous::join(&dynamic(port), "t").map_err(|e| e.to_string())?;
                    let p = r.next_round(0).map_err(|e| e.to_string())?;
                    r.finish(0);
                    Ok::<_, String>((r.hosting, p.node_rank, p.world_size))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(1500));
        drop(squatter);
        let mut got: Vec<_> = nodes
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect();
        got.sort_by_key(|g| g.1);
        assert_eq!(got.iter().filter(|g| g.0).count(), 1, "one host: {got:?}");
        assert_eq!(
            got.iter().map(|g| (g.1, g.2)).collect::<Vec<_>>(),
            [(0, 2), (1, 2)]
        );
    }

    #[test]
    fn a_port_nobody_frees_fails_naming_both_the_store_and_the_bind() {
        let port = drill_comm::spawn::free_port();
        let _squatter = Squatter::on(port);
        let mut cfg = dynamic(port);
        cfg.timeout = Duration::from_secs(1);
        let e = Rendezvous::join(&cfg, "t").err().unwrap().to_string();
        assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
        assert!(e.contains("nor could this node host the store"), "{e}");
    }
}
