//! What a run leaves on disk when things go wrong under it.
//! - A full disk: the experiment folder on a small tmpfs that fills up while checkpoints are
//!   written. The run stops by itself with exit code 1 and an error naming the checkpoint's
//!   path and the bytes it needed; every checkpoint left on disk loads; no temporary file is
//!   left; `result.json` says why. Needs root (it mounts the tmpfs and unmounts it, also when
//!   it fails).
//! - A power cut at any point: a run's file operations recorded with `strace` and replayed
//!   on a file system model whose write-back cache a crash loses (`durability/crashfs.rs`),
//!   every prefix checked and every distinct state resumed; the same trace with an fsync or
//!   the rename taken out must fail. Needs `strace`.
//!
//! `cargo test --release -p drill-cli --features netns --test durability -- --nocapture`
#![cfg(feature = "netns")]

use std::time::{Duration, Instant};

mod common;

use common::{Tmpfs, drill, repo, text};

#[test]
fn a_full_disk_stops_the_run_naming_the_checkpoint_and_keeps_the_previous_one() {
    let tmp = std::env::temp_dir().join(format!("drill-full-disk-{}", std::process::id()));
    let disk = Tmpfs::mount(&tmp, 1500);
    let exp = tmp.join("run");
    // CartPole DQN's checkpoints are 545 kB each: `best` and `latest` fit, a third does not.
    let start = Instant::now();
    let out = drill()
        .arg("train")
        .arg(repo().join("configs/cartpole_dqn.toml"))
        .args(["--quiet", "--threads", "1", "--exp-dir"])
        .arg(&exp)
        .args(["--set", "policy.eval.evaluator.eval_freq=20"])
        .args([
            "--set",
            "env.stop_value=1000",
            "--set",
            "max_env_step=20000",
        ])
        .output()
        .unwrap();
    let log = text(&out);
    assert!(start.elapsed() < Duration::from_secs(60), "{log}");
    assert_eq!(out.status.code(), Some(1), "{log}");
    let ckpt = exp.join("ckpt");
    assert!(
        log.contains(&format!("checkpoint {}/", ckpt.display()))
            && log.contains("no space left on the device for 545"),
        "the error names the file and the bytes: {log}"
    );
    let mut loaded = 0;
    for entry in std::fs::read_dir(&ckpt).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.ends_with(".safetensors") && !name.starts_with('.'),
            "left behind: {name}"
        );
        let ck = drill_exp::Checkpoint::load(&path).unwrap();
        ck.counter("train_iters").unwrap();
        loaded += 1;
    }
    assert!(
        loaded >= 1,
        "the checkpoints written before the disk filled stay"
    );
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(exp.join("result.json")).unwrap()).unwrap();
    let error = result["error"].as_str().unwrap_or_default();
    assert!(error.contains("no space left"), "{result}");
    assert!(result["env_steps"].as_u64().unwrap() > 0, "{result}");
    // Every line of the metrics log is whole.
    let metrics = std::fs::read_to_string(exp.join("metrics.jsonl")).unwrap();
    for line in metrics.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    eprintln!("{log}");
    drop(disk);
}

#[path = "durability/crashfs.rs"]
mod crashfs;

use crashfs::{Crash, Disk, Fs, Op};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The files a run replaces whole: after a crash each holds a complete version the run
/// wrote, never older than the newest one whose save had returned.
const WHOLE: [&str; 5] = [
    "run/config.toml",
    "run/result.json",
    "run/ckpt/latest.safetensors",
    "run/ckpt/best.safetensors",
    "run/ckpt/final.safetensors",
];

/// A temporary file of `drill_exp::durable::write_atomic`.
fn temporary(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with('.') && name.contains(".tmp-")
}

/// Each version a whole file was given: its bytes, the op that renamed it into place, and
/// the op at which the save had returned (the run went on to something other than syncing
/// the folder).
struct Version {
    bytes: Vec<u8>,
    renamed_at: usize,
    returned_at: usize,
}

/// What the unchanged trace promises, and what each op is (for the planted bugs).
struct Survey {
    versions: BTreeMap<String, Vec<Version>>,
    /// Files synced in place (metrics.jsonl): from this op on, they exist.
    synced: BTreeMap<String, usize>,
    kind: Vec<Kind>,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    SyncTemporary,
    SyncFolderAfterRename,
    SyncFolderAfterNewName,
    Other,
}

fn survey(ops: &[Op]) -> Survey {
    let mut fs = Fs::new();
    let mut versions: BTreeMap<String, Vec<Version>> = BTreeMap::new();
    let mut synced = BTreeMap::new();
    let mut kind = Vec::with_capacity(ops.len());
    // Saves whose return is not yet seen: (path, version) and synced paths.
    let (mut waiting, mut waiting_sync) = (Vec::<(String, usize)>::new(), Vec::<String>::new());
    for (i, op) in ops.iter().enumerate() {
        let folder_tail = match op {
            Op::Open { path, .. } => fs.is_dir(path),
            Op::Sync { fd } | Op::Close { fd } => fs.fd_is_dir(*fd) == Some(true),
            _ => false,
        };
        if !folder_tail {
            for (path, v) in waiting.drain(..) {
                versions.get_mut(&path).unwrap()[v].returned_at = i;
            }
            for path in waiting_sync.drain(..) {
                synced.entry(path).or_insert(i);
            }
        }
        kind.push(match op {
            Op::Sync { fd } => match (fs.fd_path(*fd), fs.dir_of(*fd)) {
                (Some(p), _) if temporary(p) => Kind::SyncTemporary,
                (Some(p), _) => {
                    waiting_sync.push(p.to_string());
                    Kind::Other
                }
                (None, Some((_, dirty))) if dirty.renamed => Kind::SyncFolderAfterRename,
                (None, Some(_)) => Kind::SyncFolderAfterNewName,
                _ => Kind::Other,
            },
            _ => Kind::Other,
        });
        if let Op::Rename { from, to } = op {
            let bytes = fs.read(from).unwrap_or_default().to_vec();
            let list = versions.entry(to.clone()).or_default();
            list.push(Version {
                bytes,
                renamed_at: i,
                returned_at: usize::MAX,
            });
            waiting.push((to.clone(), list.len() - 1));
        }
        fs.apply(op)
            .unwrap_or_else(|e| panic!("op {i} ({op:?}): {e}"));
    }
    for (path, v) in waiting {
        versions.get_mut(&path).unwrap()[v].returned_at = ops.len();
    }
    for path in waiting_sync {
        synced.entry(path).or_insert(ops.len());
    }
    Survey {
        versions,
        synced,
        kind,
    }
}

/// What is wrong with `disk`, a crash after the first `at` ops.
fn violations(disk: &Disk<'_>, at: usize, survey: &Survey) -> Vec<String> {
    let mut bad = Vec::new();
    for path in WHOLE {
        let Some(vs) = survey.versions.get(path) else {
            continue;
        };
        let renamed = vs.iter().filter(|v| v.renamed_at < at).count();
        let returned = vs.iter().rposition(|v| v.returned_at <= at);
        let found = disk.get(path).copied().flatten();
        let allowed = returned.unwrap_or(0)..renamed;
        match (found, returned) {
            (None, None) => {}
            (None, Some(r)) => bad.push(format!("{path} lost (version {r} was saved)")),
            (Some(bytes), _) => match vs.iter().position(|v| v.bytes == bytes) {
                Some(j) if allowed.contains(&j) => {}
                Some(j) => bad.push(format!(
                    "{path} holds version {j}, the saved one is {}",
                    returned.unwrap_or(0)
                )),
                None => bad.push(format!("{path} torn ({} bytes)", bytes.len())),
            },
        }
    }
    for (path, &from) in &survey.synced {
        let found = disk.get(path.as_str()).copied().flatten();
        if from <= at && found.is_none() {
            bad.push(format!("{path} lost (synced before op {from})"));
        }
        if let (Some(bytes), true) = (found, path.ends_with(".jsonl")) {
            let text = String::from_utf8_lossy(bytes);
            let whole = text.is_empty() || text.ends_with('\n');
            let parse = text
                .lines()
                .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok());
            if !whole || !parse {
                bad.push(format!("{path} holds a torn line"));
            }
        }
    }
    bad
}

/// Replay `ops` (op `i` replaced by `plant(i)`, `None` dropping it) and check every crash
/// state. Returns (crash states checked, violations with where they were found), and calls
/// `each` with every distinct synced-only state of the unchanged run.
fn explore(
    ops: &[Op],
    survey: &Survey,
    plant: &dyn Fn(usize) -> Option<Op>,
    each: &mut dyn FnMut(usize, &Disk<'_>),
) -> (usize, Vec<String>) {
    let mut fs = Fs::new();
    let (mut states, mut bad) = (0, Vec::new());
    for at in 0..=ops.len() {
        for kind in [Crash::SyncedOnly, Crash::NamesAheadOfData] {
            let disk = fs.crash(kind);
            states += 1;
            for v in violations(&disk, at, survey) {
                bad.push(format!("crash after op {at} ({kind:?}): {v}"));
            }
            if kind == Crash::SyncedOnly {
                each(at, &disk);
            }
        }
        if at < ops.len()
            && let Some(op) = plant(at)
        {
            fs.apply(&op)
                .unwrap_or_else(|e| panic!("op {at} ({op:?}): {e}"));
        }
    }
    (states, bad)
}

/// Op `i` as a planted bug changes it (`None`: taken out).
type Plant<'a> = dyn Fn(usize) -> Option<Op> + 'a;

/// The trace with every whole-file save written in place: each temporary file's ops go to
/// its target and the rename is gone.
fn in_place(ops: &[Op]) -> Vec<Option<Op>> {
    let mut out: Vec<Option<Op>> = vec![None; ops.len()];
    let mut target: HashMap<String, String> = HashMap::new();
    for (i, op) in ops.iter().enumerate().rev() {
        out[i] = match op {
            Op::Rename { from, to } if temporary(from) => {
                target.insert(from.clone(), to.clone());
                None
            }
            Op::Open { path, .. } if target.contains_key(path) => {
                let mut moved = op.clone();
                if let Op::Open { path: p, .. } = &mut moved {
                    *p = target[path].clone();
                }
                Some(moved)
            }
            other => Some(other.clone()),
        };
    }
    out
}

/// `cmd`'s output, killed after `limit`.
fn output_within(cmd: &mut std::process::Command, limit: Duration) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (None, format!("still running after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let log = std::fs::read_to_string(&out).unwrap_or_default()
        + &std::fs::read_to_string(&err).unwrap_or_default();
    (status.code(), log)
}

/// The newest loadable checkpoint's train iteration in a crash state (what a resume must
/// start from), `None` when it holds none.
fn newest_iteration(disk: &Disk<'_>) -> Option<u64> {
    ["final", "latest", "best"]
        .iter()
        .filter_map(|n| {
            disk.get(format!("run/ckpt/{n}.safetensors").as_str())
                .copied()
                .flatten()
        })
        .filter_map(|bytes| {
            drill_exp::Checkpoint::from_bytes(bytes, std::path::Path::new("crash")).ok()
        })
        .filter_map(|ck| ck.counter("train_iters").ok())
        .max()
}

/// A run recorded with strace (a first part to 2048 env steps, then `--resume` to 4096,
/// `latest` saved at every evaluation), its file operations replayed as every crash point
/// would leave them: each whole file (the checkpoints, config.toml, result.json) is a
/// complete version and never older than the newest saved one; metrics.jsonl, once synced,
/// stays, with whole lines only; every distinct state resumes from its newest checkpoint.
/// Then the same trace with one fsync (or the rename) taken out, as a bug would: each must
/// lose a file.
#[test]
fn every_crash_point_of_a_run_leaves_whole_files_and_resumes() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let config = repo().join("configs/cartpole_v1_ppo.toml");
    let small = [
        "--quiet",
        "--threads",
        "1",
        "--set",
        "env.stop_value=1000",
        "--set",
        "policy.eval.evaluator.eval_freq=8",
        "--set",
        "env.evaluator_env_num=4",
        "--set",
        "env.n_evaluator_episode=4",
    ];
    let mut first = drill();
    first
        .arg("train")
        .arg(&config)
        .args(["--exp-dir", "run", "--set", "max_env_step=2000"])
        .args(small)
        .env("DRILL_MAX_RESTARTS", "1");
    let mut ops = crashfs::record(&mut first, &root).unwrap();
    ops.push(Op::Exit);
    let mut second = drill();
    second
        .args(["train", "--resume", "run", "--set", "max_env_step=4000"])
        .args(small)
        .env("DRILL_MAX_RESTARTS", "1");
    ops.extend(crashfs::record(&mut second, &root).unwrap());

    // The recorder saw every write: its replay ends with the files the run left.
    let mut fs = Fs::new();
    for op in &ops {
        fs.apply(op).unwrap();
    }
    let mut on_disk = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                on_disk.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let replayed: BTreeMap<String, Vec<u8>> = fs
        .live_files()
        .into_iter()
        .map(|(p, b)| (p.to_string(), b.to_vec()))
        .collect();
    assert_eq!(
        replayed.keys().collect::<Vec<_>>(),
        on_disk.keys().collect::<Vec<_>>()
    );
    for (p, b) in &on_disk {
        assert!(replayed[p] == *b, "the replay of {p} differs from the file");
    }

    let survey = survey(&ops);
    for path in WHOLE {
        assert!(
            survey.versions.get(path).is_some_and(|v| !v.is_empty()),
            "{path} was never saved"
        );
    }
    assert!(survey.synced.contains_key("run/metrics.jsonl"));

    // The run as it is: no violation at any crash point; every distinct state resumes.
    let mut resumed = 0;
    let mut seen = HashSet::new();
    let (states, bad) = explore(&ops, &survey, &|i| Some(ops[i].clone()), &mut |at, disk| {
        if !seen.insert(format!("{disk:?}")) {
            return;
        }
        let dir = work.path().join(format!("crash-{at}"));
        crashfs::materialize(disk, &dir).unwrap();
        let newest = newest_iteration(disk);
        let (code, log) = output_within(
            drill()
                .args(["train", "--resume"])
                .arg(dir.join("run"))
                .args(["--quiet", "--threads", "1", "--set", "max_env_step=4300"]),
            Duration::from_secs(60),
        );
        match newest {
            Some(iter) if disk.contains_key("run/config.toml") => {
                assert_eq!(code, Some(0), "crash after op {at}: {log}");
                let metrics = std::fs::read_to_string(dir.join("run/metrics.jsonl")).unwrap();
                let from = metrics
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .rfind(|v| v["tag"] == drill_exp::RESUMED_ITER_TAG)
                    .map(|v| v["value"].as_f64().unwrap() as u64);
                assert_eq!(
                    from,
                    Some(iter),
                    "crash after op {at}: resumed from {from:?}"
                );
            }
            _ => assert_eq!(
                code,
                Some(1),
                "crash after op {at} (no checkpoint): a clean error expected: {log}"
            ),
        }
        resumed += 1;
        let _ = std::fs::remove_dir_all(&dir);
    });
    println!(
        "{} ops, {states} crash states, {} distinct synced states resumed, {} violations",
        ops.len(),
        resumed,
        bad.len()
    );
    assert!(bad.is_empty(), "{}", bad[..bad.len().min(20)].join("\n"));
    assert!(resumed >= 10, "{resumed}");

    // Planted bugs: each must lose or tear a file somewhere.
    let (kinds, trace) = (&survey.kind, &ops);
    let dropped = |k: Kind| move |i: usize| (kinds[i] != k).then(|| trace[i].clone());
    let rewritten = in_place(&ops);
    let plants: [(&str, &Plant); 4] = [
        (
            "no fsync of the temporary file",
            &dropped(Kind::SyncTemporary),
        ),
        (
            "no fsync of the folder after a rename",
            &dropped(Kind::SyncFolderAfterRename),
        ),
        (
            "no fsync of a new name into its folder",
            &dropped(Kind::SyncFolderAfterNewName),
        ),
        ("written in place, no rename", &|i| rewritten[i].clone()),
    ];
    for (name, plant) in plants {
        let (_, bad) = explore(&ops, &survey, plant, &mut |_, _| {});
        println!(
            "planted {name}: {} violations{}",
            bad.len(),
            bad.first()
                .map(|b| format!(", first: {b}"))
                .unwrap_or_default()
        );
        assert!(!bad.is_empty(), "the planted bug '{name}' went unseen");
    }
}
