//! Where a process learns its place in the job: torchrun's variables, Slurm, OpenMPI / PMI,
//! or values given explicitly.

use std::time::Duration;

use crate::error::{CommError, Result};

/// Default rendezvous port (torchrun's).
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// Default timeout of every blocking call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A process's coordinates in a job and how to reach the rendezvous store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitInfo {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank among the ranks of this node.
    pub local_rank: usize,
    /// Number of ranks on this node.
    pub local_world_size: usize,
    /// Index of this node (torchrun's GROUP_RANK).
    pub node_rank: usize,
    /// Host of the rendezvous store.
    pub master_addr: String,
    /// Port of the rendezvous store.
    pub master_port: u16,
    /// Whether a launcher hosts the store (`drill launch` does); otherwise rank 0 hosts it.
    pub agent_store: bool,
    /// Secret every connection proves it knows (`DRILL_JOB_TOKEN`).
    pub token: Option<String>,
    /// Key prefix that separates restart attempts in the store.
    pub run_id: String,
    /// Timeout of every blocking call.
    pub timeout: Duration,
    /// Where these values came from (for messages).
    pub source: &'static str,
    /// Whether an MPI launcher started the job (`mpirun`, or `srun --mpi=pmix|pmi2`): an MPI
    /// build then uses the MPI backend.
    pub mpi: bool,
}

impl InitInfo {
    /// A single-process job (world size 1); needs no store.
    pub fn single() -> Self {
        InitInfo::explicit(0, 1, "127.0.0.1", 0)
    }

    /// Explicit values, one node, rank 0 hosting the store.
    pub fn explicit(rank: usize, world_size: usize, master_addr: &str, master_port: u16) -> Self {
        InitInfo {
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            node_rank: 0,
            master_addr: master_addr.to_string(),
            master_port,
            agent_store: false,
            token: None,
            run_id: "0".into(),
            timeout: DEFAULT_TIMEOUT,
            source: "explicit",
            mpi: false,
        }
    }

    /// Read the process environment (`env://`): torchrun / `drill launch` variables first, then
    /// Slurm, then OpenMPI / PMI. Without any of them the job is a single process.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(&|k| std::env::var(k).ok())
    }

    /// As [`InitInfo::from_env`], reading variables through `get` (for tests).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self> {
        let num = |key: &str| -> Result<Option<usize>> {
            match get(key) {
                None => Ok(None),
                Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                    CommError::Env(format!("{key}={v:?} is not a non-negative integer"))
                }),
            }
        };
        let timeout = match get("DRILL_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some(v) => parse_duration(&v).ok_or_else(|| {
                CommError::Env(format!(
                    "DRILL_TIMEOUT={v:?}: expected seconds such as 30 or 2.5"
                ))
            })?,
        };
        let addr = get("MASTER_ADDR");
        let mut mpi = false;
        let (source, rank, world, local, local_world, node): (&'static str, _, _, _, _, _) =
            if let (Some(r), Some(w)) = (num("RANK")?, num("WORLD_SIZE")?) {
                let local = num("LOCAL_RANK")?.unwrap_or(r);
                let lw = num("LOCAL_WORLD_SIZE")?.unwrap_or(w);
                let node = num("GROUP_RANK")?.or(num("NODE_RANK")?).unwrap_or(0);
                ("RANK/WORLD_SIZE", r, w, local, lw, node)
            } else if let (Some(r), Some(w)) =
                (num("OMPI_COMM_WORLD_RANK")?, num("OMPI_COMM_WORLD_SIZE")?)
            {
                let local = num("OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
                let lw = num("OMPI_COMM_WORLD_LOCAL_SIZE")?.unwrap_or(w);
                let node = num("OMPI_COMM_WORLD_NODE_RANK")?
                    .map(|_| r / lw.max(1))
                    .unwrap_or(r / lw.max(1));
                mpi = true;
                ("OpenMPI (OMPI_COMM_WORLD_*)", r, w, local, lw, node)
            } else if let (Some(r), Some(w)) = (num("SLURM_PROCID")?, num("SLURM_NTASKS")?) {
                let local = num("SLURM_LOCALID")?.unwrap_or(0);
                let lw = match get("SLURM_NTASKS_PER_NODE").and_then(|v| first_count(&v)) {
                    Some(n) => n,
                    None => w / num("SLURM_NNODES")?.unwrap_or(1).max(1),
                };
                let node = num("SLURM_NODEID")?.unwrap_or(0);
                // srun --mpi=pmix|pmi2 starts MPI processes; --mpi=none plain ones.
                mpi = get("SLURM_MPI_TYPE").is_some_and(|t| !t.is_empty() && t != "none");
                ("Slurm (SLURM_*)", r, w, local, lw, node)
            } else if let (Some(r), Some(w)) = (num("PMI_RANK")?, num("PMI_SIZE")?) {
                let local = num("MPI_LOCALRANKID")?.unwrap_or(r);
                let lw = num("MPI_LOCALNRANKS")?.unwrap_or(w);
                mpi = true;
                ("PMI (PMI_RANK/PMI_SIZE)", r, w, local, lw, 0)
            } else {
                ("no launcher variables: single process", 0, 1, 0, 1, 0)
            };
        if world == 0 || rank >= world {
            return Err(CommError::Env(format!(
                "rank {rank} is not below world size {world} (from {source})"
            )));
        }
        if local >= local_world.max(1) {
            return Err(CommError::Env(format!(
                "local rank {local} is not below local world size {local_world} (from {source})"
            )));
        }
        let port = match get("MASTER_PORT") {
            Some(v) => v
                .trim()
                .parse::<u16>()
                .map_err(|_| CommError::Env(format!("MASTER_PORT={v:?} is not a port number")))?,
            // Under Slurm, jobs sharing a node must not meet on one port: derive it from the
            // job id (as PyTorch Lightning does), 15000..=24999.
            None => match num("SLURM_JOB_ID")? {
                Some(job) if source.starts_with("Slurm") => slurm_port(job),
                _ => DEFAULT_MASTER_PORT,
            },
        };
        let master_addr = match addr {
            Some(a) => a,
            None => match get("SLURM_STEP_NODELIST")
                .or_else(|| get("SLURM_JOB_NODELIST"))
                .or_else(|| get("SLURM_NODELIST"))
            {
                Some(list) if source.starts_with("Slurm") => {
                    first_host(&list).ok_or_else(|| {
                        CommError::Env(format!(
                            "cannot read the first host of SLURM node list {list:?}"
                        ))
                    })?
                }
                _ => "127.0.0.1".to_string(),
            },
        };
        Ok(InitInfo {
            rank,
            world_size: world,
            local_rank: local,
            local_world_size: local_world.max(1),
            node_rank: node,
            master_addr,
            master_port: port,
            agent_store: get("DRILL_AGENT_STORE").is_some_and(|v| v == "1"),
            token: get("DRILL_JOB_TOKEN").filter(|t| !t.is_empty()),
            run_id: get("DRILL_RUN_ID")
                .or_else(|| get("DRILL_RESTART_COUNT"))
                .unwrap_or_else(|| "0".into()),
            timeout,
            source,
            mpi,
        })
    }

    /// Whether this is rank 0.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

/// Seconds (fractional allowed) to a duration.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let s: f64 = v.trim().trim_end_matches('s').parse().ok()?;
    (s.is_finite() && s > 0.0).then(|| Duration::from_secs_f64(s))
}

/// The store's port for Slurm job `job` when `MASTER_PORT` is not set.
pub fn slurm_port(job: usize) -> u16 {
    15000 + (job % 10000) as u16
}

/// First count of a Slurm tasks-per-node value such as `4(x2),3`.
fn first_count(v: &str) -> Option<usize> {
    v.split([',', '(']).next()?.trim().parse().ok()
}

/// First host of a Slurm compressed host list: `node[03-05,9],gpu1` gives `node03`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let first_end = {
        let mut depth = 0;
        let mut end = list.len();
        for (i, c) in list.char_indices() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                ',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        end
    };
    let item = &list[..first_end];
    match item.find('[') {
        None => (!item.is_empty()).then(|| item.to_string()),
        Some(open) => {
            let close = item[open..].find(']')? + open;
            let prefix = &item[..open];
            let range = item[open + 1..close].split(',').next()?;
            let lo = range.split('-').next()?;
            if lo.is_empty() || !lo.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            Some(format!("{prefix}{lo}{}", &item[close + 1..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn info(vars: &[(&str, &str)]) -> Result<InitInfo> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        InitInfo::from_lookup(&|k| m.get(k).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let i = info(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1234"),
            ("DRILL_TIMEOUT", "2.5"),
        ])
        .unwrap();
        assert_eq!(
            (
                i.rank,
                i.world_size,
                i.local_rank,
                i.local_world_size,
                i.node_rank
            ),
            (3, 4, 1, 2, 1)
        );
        assert_eq!((i.master_addr.as_str(), i.master_port), ("10.0.0.1", 1234));
        assert_eq!(i.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn slurm_openmpi_pmi_and_none() {
        let s = info(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("SLURM_NTASKS_PER_NODE", "2(x4)"),
            ("SLURM_JOB_NODELIST", "gpu[07-10],cpu1"),
        ])
        .unwrap();
        assert_eq!(
            (
                s.rank,
                s.world_size,
                s.local_rank,
                s.local_world_size,
                s.node_rank
            ),
            (5, 8, 1, 2, 2)
        );
        assert_eq!(s.master_addr, "gpu07");
        assert_eq!((s.master_port, s.mpi), (DEFAULT_MASTER_PORT, false));
        let j = info(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_MPI_TYPE", "pmix"),
        ])
        .unwrap();
        assert_eq!((j.master_port, j.mpi), (18456, true));
        let k = info(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_MPI_TYPE", "none"),
            ("MASTER_PORT", "4000"),
        ])
        .unwrap();
        assert_eq!((k.master_port, k.mpi), (4000, false));
        let o = info(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!((o.rank, o.world_size, o.local_rank, o.mpi), (1, 2, 1, true));
        let p = info(&[("PMI_RANK", "2"), ("PMI_SIZE", "3")]).unwrap();
        assert_eq!((p.rank, p.world_size), (2, 3));
        let n = info(&[]).unwrap();
        assert_eq!(
            (n.rank, n.world_size, n.master_port),
            (0, 1, DEFAULT_MASTER_PORT)
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = info(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=\"x\""), "{e}");
        let e = info(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 2 is not below world size 2"), "{e}");
        let e = info(&[("DRILL_TIMEOUT", "soon")]).unwrap_err().to_string();
        assert!(e.contains("DRILL_TIMEOUT"), "{e}");
    }

    #[test]
    fn slurm_host_lists() {
        assert_eq!(first_host("node01").as_deref(), Some("node01"));
        assert_eq!(first_host("a[3-5,9]").as_deref(), Some("a3"));
        assert_eq!(first_host("a[003-005]-ib,b1").as_deref(), Some("a003-ib"));
        assert_eq!(first_host("").as_deref(), None);
    }
}
