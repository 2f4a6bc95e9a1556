//! The Parallel runner (DI-engine's `Parallel.runner`): re-executes the current program as N
//! worker processes through drill-launch (env protocol, prefixed output, restarts), gives each
//! a [`Task`] labelled `distributed` and `node.N`, and links their event buses as the
//! [`Topology`] says.
//!
//! ```no_run
//! use drill_task::{OnlineRLContext, TaskError};
//! use drill_task::parallel::{Parallel, Topology};
//! Parallel::runner(2).topology(Topology::Star).run::<OnlineRLContext>(|task| {
//!     if task.handle().match_labels(&["node.0"])? {
//!         task.handle().emit("learn_output", &(1u64, vec![0.5f32; 4]))?;
//!     } else {
//!         let e = task.handle().wait_for("learn_output", std::time::Duration::from_secs(10))?;
//!         let (iter, weights): (u64, Vec<f32>) = e.decode()?;
//!         assert_eq!((iter, weights.len()), (1, 4));
//!     }
//!     Ok(())
//! }).unwrap();
//! ```

#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod router;

use std::time::Duration;

use drill_comm::Store;
use drill_launch::{LaunchConfig, Outcome};

use crate::{Context, Labels, Task, TaskError};
pub use router::{PEER_JOINED, PEER_LEFT, PEER_READY, Place, Router, Topology};

/// Set in the environment of the worker processes.
const WORKER_ENV: &str = "DRILL_TASK_WORKER";
/// The store key naming the current attempt's run id (its keys' prefix), for workers that
/// join.
const CURRENT_RUN: &str = "task/current";

/// What carries events between the workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mq {
    /// Direct authenticated TCP links as the [`Topology`] says (default).
    Tcp,
    /// Redis pub/sub on the server at `url` (`redis://[user:password@]host:port`); every
    /// worker hears every other. Needs the `redis` cargo feature.
    Redis {
        /// The server.
        url: String,
    },
}

/// Who starts the worker processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// The runner re-executes the program N times on this machine (through drill-launch).
    Local,
    /// Slurm started them (`srun -n N program ...`): each process is a worker, its node id
    /// `SLURM_PROCID`, node 0's host (first of the node list) hosts the rendezvous store
    /// on `MASTER_PORT` (default: 15000 + the Slurm job id modulo 10000).
    Slurm,
}

/// Builder for a run of N cooperating processes.
#[derive(Debug, Clone)]
pub struct Parallel {
    n: usize,
    platform: Platform,
    mq: Mq,
    topology: Topology,
    labels: Vec<String>,
    attach: Vec<Vec<usize>>,
    max_restarts: usize,
    timeout: Duration,
    env: Vec<(String, String)>,
    local: Option<Local>,
    may_leave: Vec<usize>,
    master_port: Option<u16>,
}

/// The workers this runner starts when the others run elsewhere (`node_ids`).
#[derive(Debug, Clone)]
struct Local {
    first: usize,
    count: usize,
    master_addr: String,
    master_port: u16,
}

/// Whether this process is a worker of a Parallel run (started by the runner).
pub fn in_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

impl Parallel {
    /// `n` worker processes, star topology.
    pub fn runner(n: usize) -> Self {
        Self {
            n,
            platform: Platform::Local,
            mq: Mq::Tcp,
            topology: Topology::Star,
            labels: Vec::new(),
            attach: vec![Vec::new(); n],
            max_restarts: 0,
            timeout: Duration::from_secs(60),
            env: Vec::new(),
            local: None,
            may_leave: Vec::new(),
            master_port: None,
        }
    }

    /// The rendezvous port when every worker runs here (default: a free one), so that
    /// workers can [`join`](Self::join) the run.
    pub fn master_port(mut self, port: u16) -> Self {
        self.master_port = Some(port);
        self
    }

    /// Workers that may leave or die without ending the run (a split run's collectors): the
    /// launcher logs their exit, the others get [`router::PEER_LEFT`] instead of an error, and
    /// they take no part in the closing barrier. Not node 0 under a star (it relays).
    pub fn may_leave(mut self, nodes: &[usize]) -> Self {
        self.may_leave = nodes.to_vec();
        self
    }

    /// Who starts the workers (default: this runner, on this machine).
    pub fn platform(mut self, p: Platform) -> Self {
        self.platform = p;
        self
    }

    /// What carries the events (default: direct TCP links).
    pub fn mq(mut self, mq: Mq) -> Self {
        self.mq = mq;
        self
    }

    /// How the workers are linked.
    pub fn topology(mut self, t: Topology) -> Self {
        self.topology = t;
        self
    }

    /// Labels every worker gets (besides `distributed` and `node.N`).
    pub fn labels<I: IntoIterator<Item = S>, S: Into<String>>(mut self, labels: I) -> Self {
        self.labels = labels.into_iter().map(Into::into).collect();
        self
    }

    /// Under [`Topology::Alone`]: node `node` connects to `peers`.
    pub fn attach_to(mut self, node: usize, peers: &[usize]) -> Self {
        if node < self.attach.len() {
            self.attach[node] = peers.to_vec();
        }
        self
    }

    /// Start only the workers `ids` (contiguous, e.g. `2..4`) here; runners started the same
    /// way on other machines start the rest (the same number each, DI-engine's `--node-ids`).
    /// The runner holding node 0 hosts the rendezvous on `master_addr:master_port`; all share
    /// `DRILL_JOB_TOKEN`.
    pub fn node_ids(
        mut self,
        ids: std::ops::Range<usize>,
        master_addr: &str,
        master_port: u16,
    ) -> Result<Self, TaskError> {
        let count = ids.len();
        if count == 0
            || ids.end > self.n
            || !self.n.is_multiple_of(count)
            || !ids.start.is_multiple_of(count)
        {
            return Err(TaskError::msg(format!(
                "node ids {}..{} of {} workers: each runner must start an equal, aligned share (e.g. 0..{c} and {c}..{})",
                ids.start,
                ids.end,
                self.n,
                2 * count.max(1),
                c = count.max(1)
            )));
        }
        self.local = Some(Local {
            first: ids.start,
            count,
            master_addr: master_addr.to_string(),
            master_port,
        });
        Ok(self)
    }

    /// Set `key=value` in every worker's environment (e.g. a folder the parent chose).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Restart the whole group up to `n` times after a worker fails (DI-engine's
    /// auto-recover).
    pub fn auto_recover(mut self, n: usize) -> Self {
        self.max_restarts = n;
        self
    }

    /// Run `main` on every worker. In the parent this starts the workers and returns when
    /// they end (an error names the failed node); in a worker it runs `main` on its task and
    /// returns what `main` returned.
    pub fn run<C: Context>(
        self,
        main: impl FnOnce(&mut Task<'_, C>) -> Result<(), TaskError>,
    ) -> Result<(), TaskError> {
        if in_worker() || self.platform == Platform::Slurm {
            return self.worker(main);
        }
        let exe =
            std::env::current_exe().map_err(|e| TaskError::msg(format!("current_exe: {e}")))?;
        let (per_node, nnodes, node_rank, master_addr, master_port) = match &self.local {
            Some(l) => (
                l.count,
                self.n / l.count,
                l.first / l.count,
                l.master_addr.clone(),
                l.master_port,
            ),
            None => (
                self.n,
                1,
                0,
                "127.0.0.1".to_string(),
                self.master_port
                    .unwrap_or_else(drill_comm::spawn::free_port),
            ),
        };
        let outcome = drill_launch::launch(&LaunchConfig {
            nproc_per_node: per_node,
            nnodes,
            node_rank: Some(node_rank),
            master_addr,
            master_port,
            rdzv_endpoint: None,
            rdzv_id: "drill-task".into(),
            max_restarts: self.max_restarts,
            monitor_interval: Duration::from_millis(50),
            grace: Duration::from_secs(3),
            log_dir: None,
            timeout: self.timeout,
            program: exe.display().to_string(),
            args: std::env::args().skip(1).collect(),
            env: [(WORKER_ENV.to_string(), "1".to_string())]
                .into_iter()
                .chain(self.env.iter().cloned())
                .collect(),
            bind: None,
            elastic: None,
            optional: self.may_leave.clone(),
        })
        .map_err(|e| TaskError::msg(format!("parallel runner: {e}")))?;
        match outcome {
            // Workers stop early on an interrupt (exit 130): all exiting 0 means they had
            // finished when it came.
            Outcome::Success { .. } | Outcome::Interrupted { finished: true, .. } => Ok(()),
            Outcome::Failed { failure, restarts } => Err(TaskError::WorkersFailed {
                failure: failure.to_string(),
                restarts,
            }),
            Outcome::Interrupted { signal, .. } => Err(TaskError::Interrupted { signal }),
        }
    }

    fn worker<C: Context>(
        self,
        main: impl FnOnce(&mut Task<'_, C>) -> Result<(), TaskError>,
    ) -> Result<(), TaskError> {
        let info = drill_comm::InitInfo::from_env().map_err(|e| TaskError::msg(e.to_string()))?;
        if self.platform == Platform::Slurm && !info.source.starts_with("Slurm") {
            return Err(TaskError::msg(format!(
                "platform slurm: no SLURM_PROCID/SLURM_NTASKS in the environment (found {}); start the workers with `srun -n {}`",
                info.source, self.n
            )));
        }
        if info.world_size != self.n {
            return Err(TaskError::msg(format!(
                "{} workers were asked for, but {} says the job has {}",
                self.n, info.source, info.world_size
            )));
        }
        let token = drill_comm::net::job_token(info.token.as_deref(), &info.master_addr)
            .map_err(|e| TaskError::msg(e.to_string()))?;
        // Without a launcher (Slurm), node 0 hosts the rendezvous store.
        let server = if info.rank == 0 && !info.agent_store {
            let ip = drill_comm::net::listen_ip(&info.master_addr)
                .map_err(|e| TaskError::msg(e.to_string()))?;
            Some(
                drill_comm::StoreServer::bind(
                    &std::net::SocketAddr::new(ip, info.master_port).to_string(),
                    &token,
                )
                .map_err(|e| {
                    TaskError::msg(format!(
                        "node 0 cannot host the store on port {}: {e}",
                        info.master_port
                    ))
                })?,
            )
        } else {
            None
        };
        let store = Store::connect(&info.master_addr, info.master_port, &token, info.timeout)
            .map_err(|e| TaskError::msg(e.to_string()))?
            .with_prefix(&format!("task/{}", info.run_id));
        let mut task = Task::<C>::with_labels(self.worker_labels(info.rank));
        let link = match &self.mq {
            Mq::Tcp => Link::Tcp(Router::connect(
                router::Place {
                    node: info.rank,
                    n: info.world_size,
                    topology: self.topology,
                    attach: &self.attach,
                    may_leave: &self.may_leave,
                },
                &store,
                &token,
                task.handle().events(),
                self.timeout,
            )?),
            #[cfg(feature = "redis")]
            Mq::Redis { url } => Link::Redis(redis::RedisLink::connect(
                url,
                &format!("drill/{}", info.run_id),
                info.rank,
                info.world_size,
                task.handle().events(),
            )?),
            #[cfg(not(feature = "redis"))]
            Mq::Redis { .. } => {
                return Err(TaskError::msg(
                    "mq redis: this build has no Redis support; rebuild with the `redis` feature",
                ));
            }
        };
        // Everyone linked before anyone emits, so no early event is lost.
        store
            .barrier("linked", info.rank, info.world_size, self.timeout)
            .map_err(|e| TaskError::msg(e.to_string()))?;
        if info.rank == 0 {
            // Where a worker that joins later finds this attempt's keys.
            store
                .unprefixed()
                .set(CURRENT_RUN, info.run_id.as_bytes())
                .map_err(|e| TaskError::msg(e.to_string()))?;
        }
        link.arm();
        let (barrier_store, me, world, timeout) =
            (store.clone(), info.rank, info.world_size, self.timeout);
        let count = std::sync::atomic::AtomicU64::new(0);
        task.handle().set_barrier(move || {
            let k = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            barrier_store
                .barrier(&format!("user{k}"), me, world, timeout)
                .map_err(|e| TaskError::msg(e.to_string()))
        });
        let result = main(&mut task);
        // Nobody leaves while others may still send to it; workers that may leave take no
        // part (they may be gone already).
        let staying = info.world_size - self.may_leave.len();
        if result.is_ok() && !self.may_leave.contains(&info.rank) {
            store
                .barrier("done", info.rank, staying, self.timeout)
                .map_err(|e| TaskError::msg(e.to_string()))?;
            // A store hosted here (Slurm) serves until the others are past the barrier too.
            store
                .depart("left", staying, server.is_some(), Duration::from_secs(5))
                .map_err(|e| TaskError::msg(e.to_string()))?;
        }
        link.close();
        result
    }

    /// Worker `node`'s labels: `distributed`, `node.N`, the builder's and `DRILL_LABELS`.
    fn worker_labels(&self, node: usize) -> Labels {
        let mut labels = Labels::new(["distributed".to_string(), format!("node.{node}")]);
        for l in &self.labels {
            labels.insert(l.clone());
        }
        if let Ok(list) = std::env::var("DRILL_LABELS") {
            labels.extend_from_list(&list);
        }
        labels
    }

    /// Join a running Parallel run of this builder's `n` workers as one more worker that may
    /// leave: the store at `master_addr:master_port` (the run's token in `DRILL_JOB_TOKEN`)
    /// gives it a node id after the run's (labels `distributed`, `node.ID`, `joined`, and the
    /// builder's), and it links to the nodes `dial` names (the hub under a star). Runs `main`
    /// on its task; the run goes on when it leaves.
    pub fn join<C: Context>(
        self,
        master_addr: &str,
        master_port: u16,
        dial: &[usize],
        main: impl FnOnce(&mut Task<'_, C>) -> Result<(), TaskError>,
    ) -> Result<(), TaskError> {
        let token = std::env::var("DRILL_JOB_TOKEN").map_err(|_| {
            TaskError::msg(
                "joining a run needs its token: set DRILL_JOB_TOKEN to the token the run's workers have",
            )
        })?;
        let token = drill_comm::Token::new(&token);
        let root = Store::connect(master_addr, master_port, &token, self.timeout).map_err(|e| {
            TaskError::msg(format!(
                "no run to join at {master_addr}:{master_port}: {e}"
            ))
        })?;
        let run = root.get_timeout(CURRENT_RUN, self.timeout).map_err(|e| {
            TaskError::msg(format!(
                "the run at {master_addr}:{master_port} has not started its workers: {e}"
            ))
        })?;
        let store = root.with_prefix(&format!("task/{}", String::from_utf8_lossy(&run)));
        let k = store
            .add("joined", 1)
            .map_err(|e| TaskError::msg(e.to_string()))?;
        let node = self.n + k as usize - 1;
        let mut labels = self.worker_labels(node);
        labels.insert("joined".to_string());
        let mut task = Task::<C>::with_labels(labels);
        let router = Router::join(
            node,
            dial,
            &store,
            &token,
            task.handle().events(),
            self.timeout,
        )?;
        // The run's barriers are its workers'; one who joins later has none to meet, and
        // says instead that it listens.
        let bus = task.handle().events().clone();
        task.handle()
            .set_barrier(move || bus.emit(PEER_READY, &(node as u32)));
        let result = main(&mut task);
        router.close();
        result
    }
}

/// The event transport of a worker.
enum Link {
    Tcp(std::sync::Arc<Router>),
    #[cfg(feature = "redis")]
    Redis(redis::RedisLink),
}

impl Link {
    /// Everyone is connected: start detecting lost peers (TCP links do from the start).
    fn arm(&self) {
        #[cfg(feature = "redis")]
        if let Link::Redis(r) = self {
            r.arm();
        }
    }

    fn close(self) {
        match self {
            Link::Tcp(r) => r.close(),
            #[cfg(feature = "redis")]
            Link::Redis(r) => r.close(),
        }
    }
}
