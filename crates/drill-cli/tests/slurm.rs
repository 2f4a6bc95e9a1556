//! drill under a real Slurm: a one-node cluster (`scripts/slurm_cluster.sh`: munged,
//! slurmctld and slurmd from Debian's slurm-wlm, 2 CPUs, everything in a temporary folder)
//! per test. `srun -n2 drill train` trains data-parallel with ranks from SLURM_*; a stopped
//! rank is named within 5 s and `srun --kill-on-bad-exit` ends the step; the `sbatch` example
//! in `examples/slurm/` runs to the stop value; `--parallel-workers 2 --platform slurm`
//! splits the pipeline over the tasks; with the MPI build, `srun --mpi=pmix` carries
//! the gradients through MPI and `--mpi=pmi2` is refused with advice. Needs root;
//! `cargo test --release -p drill-cli --features slurm --test slurm` (add `,mpi` for the MPI
//! cases, `,netns` for a two-node cluster on namespace hosts: `srun -N2` with shared memory
//! inside a host and TCP between). Every test stops its cluster, also when it fails.
#![cfg(feature = "slurm")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

use common::{repo, result, text};

/// One cluster at a time: each uses both CPUs of a 2-core machine, and the timing checks
/// must not share them.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn config() -> String {
    repo()
        .join("configs/cartpole_dqn_ddp.toml")
        .display()
        .to_string()
}

/// A Slurm cluster (one node on this machine, or one per namespace host), stopped (daemons,
/// jobs, files) on drop.
struct Cluster {
    dir: tempfile::TempDir,
    /// The namespace host set the nodes run on; client commands run on its host 0.
    hosts: Option<String>,
}

impl Cluster {
    /// One node, this machine.
    fn up() -> Cluster {
        Cluster::start(None)
    }

    /// One node per host of `hosts`, the controller on host 0.
    #[cfg(feature = "netns")]
    fn on_hosts(hosts: &common::netns::Hosts) -> Cluster {
        Cluster::start(Some(hosts.set.clone()))
    }

    fn start(hosts: Option<String>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let cluster = Cluster { dir, hosts };
        let mut up = Command::new(repo().join("scripts/slurm_cluster.sh"));
        match &cluster.hosts {
            None => up.arg("up"),
            Some(set) => up.env("DRILL_NETNS_SET", set).arg("up-hosts"),
        };
        let out = up.arg(cluster.state()).output().unwrap();
        assert!(out.status.success(), "slurm_cluster.sh up: {}", text(&out));
        cluster
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("cluster")
    }

    /// A Slurm client command (`srun`, `sbatch`, ...) for this cluster, run in `work`, with
    /// the test's drill first on PATH.
    fn client(&self, cmd: &str, work: &Path) -> Command {
        let bin = Path::new(env!("CARGO_BIN_EXE_drill")).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = match &self.hosts {
            None => Command::new(cmd),
            Some(set) => {
                let mut c = Command::new(repo().join("scripts/netns_hosts.sh"));
                c.env("DRILL_NETNS_SET", set).args(["exec", "0", cmd]);
                c
            }
        };
        c.env("SLURM_CONF", self.state().join("slurm.conf"))
            .env("PATH", path)
            .current_dir(work);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/slurm_cluster.sh"))
            .arg("down")
            .arg(self.state())
            .status();
    }
}

/// `srun ARGS drill train cartpole_dqn_ddp.toml --exp-dir EXP`, bounded by 120 s.
fn srun_train(cluster: &Cluster, work: &Path, srun: &[&str], exp: &str) -> Output {
    cluster
        .client("timeout", work)
        .args(["120", "srun"])
        .args(srun)
        .args(["drill", "train", &config(), "--exp-dir", exp])
        .output()
        .unwrap()
}

#[test]
fn srun_n2_trains_to_the_stop_value_with_ranks_from_slurm() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let work = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = srun_train(&cluster, work.path(), &["-n2"], "sr");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    println!(
        "srun -n2: stop value, srun done in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for rank in 0..2 {
        assert!(
            all.contains(&format!(
                "rank {rank} of 2 (from Slurm (SLURM_*)), embedded backend"
            )),
            "{all}"
        );
    }
    assert!(
        all.contains("shared memory with ranks [1], TCP with ranks []"),
        "{all}"
    );
    let result = result(&work.path().join("sr"));
    assert_eq!(result["stop_reached"], true, "{result}");
    assert_eq!(result["world_size"], 2, "{result}");
}

/// The pid of the `drill train` process of `rank` whose command line names `exp`.
fn rank_pid(exp: &str, rank: usize) -> Option<u32> {
    let want = format!("SLURM_PROCID={rank}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_rank =
            args.first().is_some_and(|a| a.ends_with(b"drill")) && args.contains(&exp.as_bytes());
        if !is_rank {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_stopped_rank_is_named_within_5_s_and_srun_ends_the_step_within_10_s() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let work = tempfile::tempdir().unwrap();
    let exp = "stopped-rank";
    // A stop value that cannot be reached: the job runs until rank 1 is stopped.
    let mut srun = cluster
        .client("srun", work.path())
        .args(["-n2", "--kill-on-bad-exit=1", "drill", "train", &config()])
        .args(["--exp-dir", exp, "--set", "env.stop_value=1000000"])
        .args(["--set", "max_env_step=1000000000"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = srun.stderr.take().unwrap();
    let lines = std::sync::Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                lines.lock().unwrap().push((Instant::now(), l));
            }
        })
    };
    let all = |lines: &Mutex<Vec<(Instant, String)>>| -> String {
        let lines = lines.lock().unwrap();
        lines.iter().map(|(_, l)| format!("{l}\n")).collect()
    };
    let start = Instant::now();
    while !all(&lines).contains("training dqn on CartPole-v0") || rank_pid(exp, 1).is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job did not start:\n{}",
            all(&lines)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    let pid = rank_pid(exp, 1).unwrap();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    let stopped = Instant::now();
    let mut status = None;
    while stopped.elapsed() < Duration::from_secs(30) {
        if let Some(s) = srun.try_wait().unwrap() {
            status = Some((s, stopped.elapsed()));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Some((status, ended)) = status else {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let _ = srun.kill();
        let _ = srun.wait();
        panic!(
            "srun still runs 30 s after rank 1 stopped:\n{}",
            all(&lines)
        );
    };
    reader.join().unwrap();
    let text = all(&lines);
    assert!(!status.success(), "{text}");
    let named = lines
        .lock()
        .unwrap()
        .iter()
        .find(|(_, l)| l.contains("rank 1 is gone") && l.contains("nothing heard from it"))
        .map(|(at, _)| *at - stopped)
        .unwrap_or_else(|| panic!("rank 0 never named rank 1:\n{text}"));
    println!("rank 1 stopped: named by rank 0 after {named:?}, srun ended after {ended:?}");
    assert!(
        named < Duration::from_secs(5),
        "named after {named:?}\n{text}"
    );
    assert!(
        ended < Duration::from_secs(10),
        "srun ended after {ended:?}\n{text}"
    );
}

#[test]
fn the_sbatch_example_trains_to_the_stop_value() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let work = tempfile::tempdir().unwrap();
    let script = repo().join("examples/slurm/ddp.sbatch");
    let out = cluster
        .client("timeout", work.path())
        .args(["180", "sbatch", "--wait", "--output=job.out"])
        .arg(&script)
        .args([&config(), "--exp-dir", "sb"])
        .output()
        .unwrap();
    let log = std::fs::read_to_string(work.path().join("job.out")).unwrap_or_default();
    assert!(out.status.success(), "{}\njob.out:\n{log}", text(&out));
    assert!(log.contains("stop value reached"), "{log}");
    let result = result(&work.path().join("sb"));
    assert_eq!(result["stop_reached"], true, "{result}");
    assert_eq!(result["world_size"], 2, "{result}");
}

#[test]
fn srun_runs_a_pipeline_split_with_platform_slurm() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let work = tempfile::tempdir().unwrap();
    let cfg = repo().join("configs/cartpole_dqn_dist.toml");
    let out = cluster
        .client("timeout", work.path())
        .args([
            "120",
            "srun",
            "-n2",
            "--kill-on-bad-exit=1",
            "drill",
            "train",
        ])
        .arg(&cfg)
        .args(["--parallel-workers", "2", "--platform", "slurm"])
        .args(["--exp-dir", "split"])
        .output()
        .unwrap();
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let result = result(&work.path().join("split"));
    assert_eq!(result["stop_reached"], true, "{result}");
}

#[cfg(feature = "netns")]
#[test]
fn srun_over_two_namespace_hosts_trains_with_shm_inside_and_tcp_between() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let hosts = common::netns::Hosts::up(2, "s");
    let cluster = Cluster::on_hosts(&hosts);
    let work = tempfile::tempdir().unwrap();
    let srun = |token: Option<&str>| {
        let mut c = cluster.client("timeout", work.path());
        c.args(["120", "srun", "-N2", "--ntasks-per-node=2"]).args([
            "drill",
            "train",
            &config(),
            "--exp-dir",
            "two",
        ]);
        match token {
            Some(t) => c.env("DRILL_JOB_TOKEN", t),
            None => c.env_remove("DRILL_JOB_TOKEN"),
        };
        c.output().unwrap()
    };
    // Across hosts without a shared secret: refused, with the fix, before anything listens.
    let out = srun(None);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("DRILL_JOB_TOKEN is not set") && all.contains("export DRILL_JOB_TOKEN="),
        "{all}"
    );
    let t = Instant::now();
    let out = srun(Some("two-hosts-secret"));
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    println!(
        "srun -N2 --ntasks-per-node=2 over 2 namespace hosts: stop value, srun done in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let set = &hosts.set;
    common::netns::assert_shm_inside_tcp_between(&all, set);
    let result = result(&work.path().join("two"));
    assert_eq!(result["stop_reached"], true, "{result}");
    assert_eq!(result["world_size"], 4, "{result}");
}

#[cfg(feature = "mpi")]
#[test]
fn srun_mpi_pmix_trains_through_mpi_and_pmi2_is_refused_with_advice() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let work = tempfile::tempdir().unwrap();
    let out = srun_train(&cluster, work.path(), &["--mpi=pmix", "-n2"], "px");
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("rank 1 of 2 (from Slurm (SLURM_*)), mpi backend"),
        "{all}"
    );
    assert_eq!(result(&work.path().join("px"))["stop_reached"], true);
    let out = srun_train(&cluster, work.path(), &["--mpi=pmi2", "-n2"], "p2");
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("started by `srun --mpi=pmi2`") && all.contains("use `srun --mpi=pmix`"),
        "{all}"
    );
}
