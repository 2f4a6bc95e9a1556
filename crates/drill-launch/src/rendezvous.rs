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
    store: Store,
    _server: Option<StoreServer>,
    hosting: bool,
    host: String,
    port: u16,
    nnodes: usize,
    nproc: usize,
    node_rank: Option<usize>,
    timeout: Duration,
}

impl Rendezvous {
    /// Host or reach the store.
    pub fn join(cfg: &LaunchConfig, token: &str) -> Result<Rendezvous, LaunchError> {
        let token = Token::new(Some(token));
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
        let server = match hosting_wanted {
            Some(true) => Some(StoreServer::bind(&format!("0.0.0.0:{port}"), &token).map_err(|e| {
                LaunchError::Usage(format!("cannot host the store on port {port}: {e} (is another job using --master-port {port}?)"))
            })?),
            Some(false) => None,
            // Dynamic: whoever can bind the endpoint's port hosts it.
            None => std::net::TcpListener::bind(("0.0.0.0", port))
                .ok()
                .map(|l| StoreServer::serve(l, &token))
                .transpose()?,
        };
        // Short reply slack: behind a cut link, a report or a check must fail in seconds,
        // not hold this node's failure handling (the next request connects again).
        let store = Store::connect(&host, port, &token, cfg.timeout)?
            .with_prefix(&format!("launch/{}", cfg.rdzv_id))
            .with_reply_slack(Duration::from_secs(2));
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
            LaunchError::Usage(format!(
                "not all {} nodes joined the rendezvous within {:?}",
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
        let k = format!("round{round}/failed");
        if self.store.check(&[&k]).ok()? {
            self.store
                .get(&k)
                .ok()
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        } else {
            None
        }
    }

    /// This node finished attempt `round`; the hosting node keeps the store up until every
    /// node has said so (bounded by the timeout).
    pub fn finish(&self, round: usize) {
        let k = format!("round{round}/done");
        let _ = self.store.add(&k, 1);
        if self.hosting {
            let deadline = Instant::now() + self.timeout;
            while Instant::now() < deadline {
                match self.store.add(&k, 0) {
                    Ok(n) if n as usize >= self.nnodes => break,
                    Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                    Err(_) => break,
                }
            }
        }
    }
}
