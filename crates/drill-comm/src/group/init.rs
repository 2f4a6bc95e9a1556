//! Joining a job: [`InitOptions`], [`ProcessGroup::init`] (rendezvous, backend choice, the
//! world group).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::checked::Checked;
use crate::backend::embedded::{Embedded, EmbeddedOptions};
use crate::backend::{Backend, BackendKind};
use crate::env::InitInfo;
use crate::error::{CommError, Result};
use crate::store::{Store, StoreServer};
use crate::work::Executor;

use super::{Inner, ProcessGroup, World};

/// How to start a process group; every field has a default from the environment.
#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    /// Backend (default: `DRILL_BACKEND`, else the embedded TCP/shared-memory one).
    pub backend: Option<BackendKind>,
    /// Timeout of every blocking call (default: `DRILL_TIMEOUT`, else 30 s).
    pub timeout: Option<Duration>,
    /// Shared memory between same-host ranks (default: on unless `DRILL_SHM=0`).
    pub shm: Option<bool>,
    /// Silence after which the embedded backend counts a peer as unreachable (default:
    /// `DRILL_HEARTBEAT_TIMEOUT` in seconds, else 3 s).
    pub heartbeat_timeout: Option<Duration>,
    /// Coordinates (default: read from the environment, `env://`).
    pub info: Option<InitInfo>,
}

fn env_heartbeat() -> Result<Duration> {
    match std::env::var("DRILL_HEARTBEAT_TIMEOUT") {
        Ok(v) if !v.is_empty() => v
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.5)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                CommError::Env(format!(
                    "DRILL_HEARTBEAT_TIMEOUT={v:?}: expected seconds, at least 0.5 (heartbeats go every 0.5 s)"
                ))
            }),
        _ => Ok(crate::backend::embedded::health::HEARTBEAT_TIMEOUT),
    }
}

fn env_backend() -> Result<Option<BackendKind>> {
    match std::env::var("DRILL_BACKEND") {
        Ok(v) if !v.is_empty() => BackendKind::parse(&v).map(Some).ok_or_else(|| {
            CommError::Env(format!("DRILL_BACKEND={v:?}: expected tcp, mpi or nccl"))
        }),
        _ => Ok(None),
    }
}

impl ProcessGroup {
    /// Join the job described by the environment (torchrun / drill launch / Slurm / OpenMPI
    /// variables) with default options.
    pub fn from_env() -> Result<ProcessGroup> {
        Self::init(InitOptions::default())
    }

    /// Join a job: rendezvous, connect, return the world group.
    pub fn init(opts: InitOptions) -> Result<ProcessGroup> {
        let kind = match opts.backend {
            Some(k) => k,
            None => env_backend()?.unwrap_or(BackendKind::Embedded),
        };
        let mut info = match opts.info {
            Some(i) => i,
            None if kind == BackendKind::Mpi => InitInfo::single(),
            None => InitInfo::from_env()?,
        };
        if let Some(t) = opts.timeout {
            info.timeout = t;
        }
        let exec = Executor::new();
        let (backend, store, server): (Box<dyn Backend>, _, _) = match kind {
            BackendKind::Mpi => {
                #[cfg(feature = "mpi")]
                {
                    let b = crate::backend::mpi::Mpi::init()?;
                    info.rank = b.rank();
                    info.world_size = b.size();
                    info.local_rank = b.local_rank();
                    info.local_world_size = b.local_size();
                    info.source = "MPI";
                    (Box::new(b), None, None)
                }
                #[cfg(not(feature = "mpi"))]
                return Err(CommError::Backend { backend: "mpi", detail: "drill was built without MPI: rebuild with `--features mpi` (needs libopenmpi-dev and libclang-dev)".into() });
            }
            BackendKind::Embedded if info.world_size == 1 => {
                (Box::new(Embedded::single(info.timeout)?), None, None)
            }
            BackendKind::Embedded | BackendKind::Nccl => {
                let token = crate::net::job_token(info.token.as_deref(), &info.master_addr)?;
                let server = if info.rank == 0 && !info.agent_store {
                    let ip = crate::net::listen_ip(&info.master_addr)?;
                    Some(StoreServer::bind(&std::net::SocketAddr::new(ip, info.master_port).to_string(), &token).map_err(|e| {
                        CommError::Env(format!("rank 0 cannot host the store on port {}: {e} (another job on MASTER_PORT?)", info.master_port))
                    })?)
                } else {
                    None
                };
                let store =
                    Store::connect(&info.master_addr, info.master_port, &token, info.timeout)?
                        .with_prefix(&format!("drill/{}", info.run_id));
                let backend: Box<dyn Backend> = if kind == BackendKind::Embedded {
                    let shm = opts.shm.unwrap_or_else(|| {
                        std::env::var("DRILL_SHM").map(|v| v != "0").unwrap_or(true)
                    });
                    Box::new(Embedded::connect(
                        info.rank,
                        info.world_size,
                        &store.with_prefix("world"),
                        &token,
                        &EmbeddedOptions {
                            shm,
                            timeout: info.timeout,
                            heartbeat: match opts.heartbeat_timeout {
                                Some(t) => t,
                                None => env_heartbeat()?,
                            },
                        },
                    )?)
                } else {
                    #[cfg(feature = "nccl")]
                    {
                        let heartbeat = Store::connect(
                            &info.master_addr,
                            info.master_port,
                            &token,
                            info.timeout,
                        )?
                        .with_prefix(&format!("drill/{}", info.run_id));
                        Box::new(crate::backend::nccl::Nccl::connect(
                            info.rank,
                            info.world_size,
                            info.local_rank,
                            &store.with_prefix("world"),
                            heartbeat.with_prefix("world"),
                            info.timeout,
                        )?)
                    }
                    #[cfg(not(feature = "nccl"))]
                    return Err(CommError::Backend {
                        backend: "nccl",
                        detail: "drill was built without NCCL: rebuild with `--features nccl` (CUDA and NCCL are loaded at run time)".into(),
                    });
                };
                (backend, Some(store), server)
            }
        };
        let backend: Box<dyn Backend> = if Checked::wanted() {
            Box::new(Checked::new(backend, "world"))
        } else {
            backend
        };
        let (rank, size) = (backend.rank(), backend.size());
        let pg = ProcessGroup {
            inner: Arc::new(Inner {
                backend: Mutex::new(backend),
                world: Arc::new(World {
                    info,
                    store,
                    server: Mutex::new(server),
                    next_id: Mutex::new(1),
                    exec,
                    failed: Default::default(),
                }),
                name: "world".into(),
                rank,
                size,
                global: (0..size).collect(),
            }),
        };
        if size > 1 {
            pg.barrier()?;
        }
        Ok(pg)
    }
}
