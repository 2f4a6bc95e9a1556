//! Helpers shared by the end-to-end tests: the built `drill`, the repository, outputs.
#![allow(dead_code)]

pub mod netns;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The built `drill`, outside any launcher's environment.
pub fn drill() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_drill"));
    c.env_remove("RANK").env_remove("WORLD_SIZE");
    c
}

/// `drill train CONFIG --quiet --exp-dir EXP ARGS...` started with piped output.
pub fn spawn_train(config: &str, exp: &Path, args: &[&str]) -> Child {
    drill()
        .arg("train")
        .arg(repo().join(config))
        .args(["--quiet", "--exp-dir"])
        .arg(exp)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for every child (started with piped output) and check each succeeded.
pub fn wait_all_ok(children: Vec<Child>) -> Vec<Output> {
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    outs
}

/// Stdout and stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `DIR/result.json`.
pub fn result(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap()
}

/// The pid of rank `rank` among `parent`'s children, once the ranks are training (their
/// first checkpoint exists).
pub fn rank_pid(parent: u32, rank: usize, exp: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "ranks never started training");
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        let ready = exp.join("ckpt/best.safetensors").is_file();
        for pid in children.split_whitespace() {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let is_rank = env
                .split(|&b| b == 0)
                .any(|v| v == format!("RANK={rank}").as_bytes());
            if is_rank && ready {
                return pid.parse().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kill -9 rank `rank` of `child` (a run with `--max-restarts 1`) `delay` after it started
/// training; check the group restarted, resumed and finished in the same folder `exp`, and
/// return its result.
pub fn kill_and_expect_resume(
    child: Child,
    rank: usize,
    exp: &Path,
    delay: Duration,
) -> serde_json::Value {
    let pid = rank_pid(child.id(), rank, exp);
    std::thread::sleep(delay);
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("resuming from"), "{log}");
    let r = result(exp);
    assert_eq!(r["restarts"], 1, "{r}");
    let name = exp.file_name().unwrap().to_string_lossy();
    let sibling = exp.with_file_name(format!("{name}_2"));
    assert!(!sibling.exists(), "the same folder carried on");
    r
}

/// Kill -9 rank `rank` of `child` (a run without restarts) `delay` after it started
/// training; check the run failed naming the rank, and return its output and how long the
/// failure took after the kill.
pub fn kill_and_expect_failure(
    child: Child,
    rank: usize,
    exp: &Path,
    delay: Duration,
) -> (String, Duration) {
    let pid = rank_pid(child.id(), rank, exp);
    std::thread::sleep(delay);
    let t = Instant::now();
    // SAFETY: kill(2) touches no memory of this process.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    let dt = t.elapsed();
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains(&format!("rank {rank}")), "{log}");
    (log, dt)
}

/// A tmpfs mounted at a new folder, unmounted (lazily, so a process still inside cannot keep
/// it) and the folder removed when dropped.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mount a tmpfs of `size_kib` KiB at `dir` (created; needs root).
    pub fn mount(dir: &Path, size_kib: u64) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_kib}k"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mount a tmpfs at {} (root?)",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
