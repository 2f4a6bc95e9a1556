//! [`Experiment`]: creates the folder and turns reports into files and a progress bar.

use crate::EventWriter;
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::report::{Progress, Reporter, TrainResult};
use drill_config::Config;
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The progress bar on screen, if any: log lines are written around it ([`suspend_bar`]).
static BAR: std::sync::Mutex<Option<ProgressBar>> = std::sync::Mutex::new(None);

/// Run `f` (which writes to the terminal, e.g. a log line) with the progress bar cleared
/// and redrawn after it, so the two never garble each other.
pub fn suspend_bar<R>(f: impl FnOnce() -> R) -> R {
    let bar = BAR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match bar {
        Some(bar) => bar.suspend(f),
        None => f(),
    }
}

/// One run's folder (see the crate docs for its layout).
pub struct Experiment {
    dir: PathBuf,
    tb: EventWriter,
    metrics: Metrics,
    /// The last counters reported: what `result.json` says when the run fails.
    last: Progress,
    bar: Option<ProgressBar>,
    first_draw: bool,
    last_draw: Instant,
    start: Instant,
    epoch: f64,
    last_latest: Option<Instant>,
    latest_every: Duration,
}

/// `metrics.jsonl`, appended whole lines at a time: a line is written with one `write` of
/// itself and the lines before it, never split across two, so a crash leaves at most one
/// partial last line, which [`Metrics::open`] cuts off before appending again.
struct Metrics<F: LogFile = File> {
    file: F,
    /// Whole lines not written yet.
    pending: String,
    /// The file's length: whole lines only, where the next write starts.
    len: u64,
}

/// Lines are written once this many bytes wait.
const METRICS_BUFFER: usize = 8 << 10;

/// What [`Metrics`] writes to: a file it can cut back.
trait LogFile: Write + Seek {
    fn set_len(&self, len: u64) -> std::io::Result<()>;
    fn sync_data(&self) -> std::io::Result<()>;
}

impl LogFile for File {
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        File::set_len(self, len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        File::sync_data(self)
    }
}

impl Metrics {
    /// Open `path`: appending (after cutting a partial last line) or from empty.
    fn open(path: &Path, append: bool) -> std::io::Result<Self> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(!append)
            .open(path)?;
        // The file's name must outlive a crash for the lines each checkpoint syncs with it.
        crate::durable::sync_dir(path)?;
        let len = if append {
            let whole = whole_lines_len(&mut file)?;
            file.set_len(whole)?;
            file.seek(SeekFrom::Start(whole))?;
            whole
        } else {
            0
        };
        Ok(Self {
            file,
            pending: String::new(),
            len,
        })
    }
}

impl<F: LogFile> Metrics<F> {
    fn line(&mut self, line: std::fmt::Arguments<'_>) -> std::io::Result<()> {
        use std::fmt::Write as _;
        let _ = writeln!(self.pending, "{line}");
        if self.pending.len() >= METRICS_BUFFER {
            self.flush()?;
        }
        Ok(())
    }

    /// Write the pending lines. A write that fails part-way (a full disk) is cut back to
    /// the last whole line and the lines stay pending, so the file never holds a torn line
    /// with more written after it.
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.pending.is_empty() {
            if let Err(e) = self.file.write_all(self.pending.as_bytes()) {
                let _ = self.file.set_len(self.len);
                let _ = self.file.seek(SeekFrom::Start(self.len));
                return Err(e);
            }
            self.len += self.pending.len() as u64;
            self.pending.clear();
        }
        Ok(())
    }

    /// Flush, then `fsync` the lines (with each checkpoint: the log holds what the
    /// checkpoint's counters say happened).
    fn sync(&mut self) -> std::io::Result<()> {
        self.flush()?;
        self.file.sync_data()
    }
}

/// The length of `file` up to and including its last newline.
fn whole_lines_len(file: &mut File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut block = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// `ckpt/latest.safetensors` is rewritten at most this often (`best` and `final` always are),
/// unless the run can be restarted (`DRILL_MAX_RESTARTS` > 0, or an elastic job's
/// `DRILL_ELASTIC`, both set by the launcher): then at every evaluation, so a restart loses
/// as little as possible.
const LATEST_EVERY: Duration = Duration::from_secs(10);

/// `dir`, or `dir_2`, `dir_3`, … if it already holds files: a run never overwrites another.
fn fresh_dir(dir: &Path) -> PathBuf {
    let taken = |d: &Path| {
        d.exists()
            && std::fs::read_dir(d)
                .map(|mut r| r.next().is_some())
                .unwrap_or(true)
    };
    if !taken(dir) {
        return dir.to_path_buf();
    }
    (2..)
        .map(|k| PathBuf::from(format!("{}_{k}", dir.display())))
        .find(|d| !taken(d))
        .unwrap()
}

impl Experiment {
    /// Create the folder for `config` (at `dir`, or a suffixed sibling if that is taken) and
    /// write the resolved config. `quiet` hides the progress bar.
    pub fn create(dir: &Path, config: &Config, quiet: bool) -> std::io::Result<Self> {
        let chosen = fresh_dir(dir);
        if chosen != dir {
            tracing::warn!(
                "{} already holds a run; writing to {}",
                dir.display(),
                chosen.display()
            );
        }
        Self::open(chosen, config, quiet, false)
    }

    /// Claim a fresh folder for a run whose writer starts elsewhere (a worker process):
    /// `dir`, or the first free `dir_K`, created with its `ckpt/` so no other run takes it.
    /// The writer then [`Self::reopen`]s it.
    pub fn reserve(dir: &Path) -> std::io::Result<PathBuf> {
        let chosen = fresh_dir(dir);
        crate::durable::create_dir_all(&chosen.join("ckpt"))?;
        Ok(chosen)
    }

    /// Continue writing into `dir`, an experiment folder a failed attempt of the same run
    /// created (after `drill train --max-restarts`): metrics are appended, TensorBoard gets a
    /// new events file, checkpoints stay.
    pub fn reopen(dir: &Path, config: &Config, quiet: bool) -> std::io::Result<Self> {
        Self::open(dir.to_path_buf(), config, quiet, true)
    }

    fn open(chosen: PathBuf, config: &Config, quiet: bool, append: bool) -> std::io::Result<Self> {
        crate::durable::create_dir_all(&chosen.join("ckpt"))?;
        // A writer killed mid-write (kill -9, a lost machine) leaves its temporary file; the
        // run that takes the folder over removes it.
        for dir in [chosen.clone(), chosen.join("ckpt")] {
            crate::durable::remove_temporaries(&dir);
        }
        crate::durable::write_atomic(&chosen.join("config.toml"), config.to_toml().as_bytes())?;
        let metrics = Metrics::open(&chosen.join("metrics.jsonl"), append)?;
        let bar = (!quiet).then(|| {
            let (bar, template) = match config.max_env_step {
                Some(n) => (
                    ProgressBar::new(n),
                    "{elapsed_precise} [{bar:20}] {human_pos}/{human_len} steps, ETA {eta}: {wide_msg}",
                ),
                None => (
                    ProgressBar::no_length(),
                    "{elapsed_precise} {human_pos} env steps: {wide_msg}",
                ),
            };
            bar.set_style(
                ProgressStyle::with_template(template)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            *BAR.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.clone());
            bar
        });
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        Ok(Self {
            tb: EventWriter::create(&chosen.join("tb"))?,
            metrics,
            last: Progress::default(),
            dir: chosen,
            bar,
            first_draw: true,
            last_draw: Instant::now() - Duration::from_secs(1),
            start: Instant::now(),
            epoch,
            last_latest: None,
            latest_every: match std::env::var("DRILL_MAX_RESTARTS") {
                Ok(v) if v.parse::<u64>().is_ok_and(|n| n > 0) => Duration::ZERO,
                _ if std::env::var_os("DRILL_ELASTIC").is_some() => Duration::ZERO,
                _ => LATEST_EVERY,
            },
        })
    }

    /// The folder in use.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Say in the metrics that training continues here from a checkpoint at `env_step`,
    /// which took `train_seconds` of training to reach (`None`: unknown): a [`RESUMED_TAG`]
    /// scalar. `drill plot` drops the values an earlier attempt logged past that step (work
    /// done again) and counts `--x wall` in training time, without the pause.
    /// The checkpoint's train iteration goes beside it ([`RESUMED_ITER_TAG`]), so the folder
    /// says exactly which state each part of the run started from.
    pub fn mark_resume(&mut self, env_step: u64, train_iter: u64, train_seconds: Option<f64>) {
        self.scalar(RESUMED_TAG, train_seconds.unwrap_or(f64::NAN), env_step);
        self.scalar(RESUMED_ITER_TAG, train_iter as f64, env_step);
        // On disk at once: a part of the run killed before its first checkpoint still says
        // where it started.
        if let Err(e) = self.metrics.sync() {
            tracing::warn!("cannot write metrics to {}: {e}", self.dir.display());
        }
    }

    /// Write `result.json` (durably), flush the logs and clear the progress bar.
    pub fn finish(&mut self, result: &TrainResult) -> std::io::Result<()> {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            BAR.lock().unwrap_or_else(|p| p.into_inner()).take();
        }
        self.tb.flush()?;
        self.metrics.sync()?;
        write_result(&self.dir, result)
    }

    /// End a run of `world_size` ranks (restarted `restarts` times) that failed with `error`:
    /// `result.json` holds the last counters reported (or its newest checkpoint's, if further)
    /// and the error (written if the disk lets it); what no evaluation measured is `null`.
    pub fn fail(&mut self, error: &str, world_size: usize, restarts: u32) -> std::io::Result<()> {
        let p = self.last;
        let wall_seconds = self.start.elapsed().as_secs_f64();
        // The counters of the work kept: an attempt that failed before reporting any (a
        // restart on a full disk) still says where the run's newest checkpoint stands.
        let mut result = kept_failure(&self.dir, error, wall_seconds, world_size, restarts);
        result.env_steps = result.env_steps.max(p.env_steps);
        result.train_iters = result.train_iters.max(p.train_iters);
        result.env_steps_per_sec = p.env_steps_per_sec;
        result.eval_reward_mean = p.last_eval.unwrap_or(f64::NAN);
        self.finish(&result)
    }
}

/// The metrics tag of [`Experiment::mark_resume`]: step the checkpoint's env step, value its
/// training seconds (`null` when unknown).
pub const RESUMED_TAG: &str = "run/resumed";

/// The metrics tag beside [`RESUMED_TAG`]: step the checkpoint's env step, value its train
/// iteration.
pub const RESUMED_ITER_TAG: &str = "run/resumed_iteration";

/// `result.json` in `dir`, written durably.
fn write_result(dir: &Path, result: &TrainResult) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(result).expect("result serialises");
    crate::durable::write_atomic(&dir.join("result.json"), (json + "\n").as_bytes())
}

/// `(env_steps, train_iters)` of the newest checkpoint in `dir`, or zeros.
fn kept_counters(dir: &Path) -> (u64, u64) {
    Checkpoint::newest_in(dir)
        .ok()
        .flatten()
        .map(|ck| {
            (
                ck.counter("env_steps").unwrap_or(0),
                ck.counter("train_iters").unwrap_or(0),
            )
        })
        .unwrap_or((0, 0))
}

/// [`Experiment::fail`] from a rank that holds no [`Experiment`], started at `since`:
/// `result.json` in the run's folder `dir` when the folder's writer (rank 0) is the rank that
/// was lost, written by the rank that noticed. It holds the newest checkpoint's counters and
/// the error; what no evaluation measured is `null`. A `result.json` written since `since` is
/// left as it is: rank 0 was there to say why after all (it shut its group down first).
pub fn fail_in(
    dir: &Path,
    error: &str,
    since: SystemTime,
    world_size: usize,
    restarts: u32,
) -> std::io::Result<()> {
    let path = dir.join("result.json");
    if std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since)
    {
        return Ok(());
    }
    let wall = since.elapsed().map_or(f64::NAN, |d| d.as_secs_f64());
    write_result(dir, &kept_failure(dir, error, wall, world_size, restarts))
}

/// [`fail_in`] for the process that started a split run's workers and outlived them: when
/// the folder's writer (the learner's worker) was the one lost, `result.json` is an earlier
/// attempt's, or absent. Unless it speaks for the last attempt (`restarts` restarts in), it
/// is written with the newest checkpoint's counters and `error`.
pub fn fail_after_workers(
    dir: &Path,
    error: &str,
    world_size: usize,
    restarts: u32,
) -> std::io::Result<()> {
    let said = std::fs::read(dir.join("result.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|r| r["restarts"].as_u64() == Some(u64::from(restarts)));
    if said {
        return Ok(());
    }
    write_result(
        dir,
        &kept_failure(dir, error, f64::NAN, world_size, restarts),
    )
}

/// A failed run's result from its folder alone: the newest checkpoint's counters, `error`;
/// what no evaluation measured is `null`.
fn kept_failure(
    dir: &Path,
    error: &str,
    wall_seconds: f64,
    world_size: usize,
    restarts: u32,
) -> TrainResult {
    let (env_steps, train_iters) = kept_counters(dir);
    TrainResult {
        stop_reached: false,
        env_steps,
        train_iters,
        wall_seconds,
        total_wall_seconds: None,
        env_steps_per_sec: f64::NAN,
        eval_reward_mean: f64::NAN,
        eval_reward_std: f64::NAN,
        eval_episodes: 0,
        world_size,
        restarts,
        interrupted: false,
        error: Some(error.to_string()),
    }
}

impl Reporter for Experiment {
    fn scalar(&mut self, tag: &str, value: f64, step: u64) {
        let wall = self.epoch + self.start.elapsed().as_secs_f64();
        let written = self
            .tb
            .scalar(tag, value as f32, step as i64, wall)
            .and_then(|_| {
                self.metrics.line(format_args!(
                    r#"{{"tag":"{tag}","step":{step},"value":{},"wall_time":{wall:.3}}}"#,
                    serde_json::json!(value)
                ))
            });
        if let Err(e) = written {
            tracing::warn!("cannot write metrics to {}: {e}", self.dir.display());
        }
    }

    fn progress(&mut self, p: &Progress) {
        self.last = *p;
        let Some(bar) = &self.bar else { return };
        if self.last_draw.elapsed() < Duration::from_millis(100) {
            return;
        }
        self.last_draw = Instant::now();
        bar.set_position(p.env_steps);
        if self.first_draw {
            // A resumed run starts part way: the ETA counts from here, not from 0.
            self.first_draw = false;
            bar.reset_eta();
        }
        let eval = p.last_eval.map_or("-".to_string(), |e| format!("{e:.1}"));
        let rate = p.env_steps_per_sec;
        let rate = if rate >= 1e4 {
            format!("{:.1}k", rate / 1e3)
        } else {
            format!("{rate:.0}")
        };
        // `wide_msg`: cut to the terminal's width, so the bar never wraps.
        bar.set_message(format!(
            "eval {eval}, {rate} steps/s, {} iters",
            p.train_iters
        ));
    }

    fn checkpoint(
        &mut self,
        name: &str,
        build: &mut dyn FnMut() -> Checkpoint,
    ) -> Result<(), CheckpointError> {
        if name == "latest"
            && self
                .last_latest
                .is_some_and(|t| t.elapsed() < self.latest_every)
        {
            return Ok(());
        }
        if name == "latest" {
            self.last_latest = Some(Instant::now());
        }
        // Logs up to this point land with the checkpoint; failing to flush them is a logging
        // problem (warned, as in `scalar`), not a reason to lose the checkpoint.
        if let Err(e) = self.tb.flush().and_then(|_| self.metrics.sync()) {
            tracing::warn!("cannot flush metrics in {}: {e}", self.dir.display());
        }
        build().save(&self.dir.join("ckpt").join(format!("{name}.safetensors")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file on a disk that fills after `room` bytes: a write past it stores what fits and
    /// fails, as a full disk does.
    struct FillingFile {
        data: std::cell::RefCell<Vec<u8>>,
        pos: usize,
        room: usize,
    }

    impl Write for FillingFile {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let fits = buf.len().min(self.room.saturating_sub(self.pos));
            if fits == 0 && !buf.is_empty() {
                return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
            }
            let mut data = self.data.borrow_mut();
            let len = data.len();
            data.resize(len.max(self.pos + fits), 0);
            data[self.pos..self.pos + fits].copy_from_slice(&buf[..fits]);
            self.pos += fits;
            Ok(fits)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Seek for FillingFile {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            let SeekFrom::Start(p) = to else {
                unreachable!("Metrics seeks from the start only")
            };
            self.pos = p as usize;
            Ok(p)
        }
    }

    impl LogFile for FillingFile {
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.data.borrow_mut().resize(len as usize, 0);
            Ok(())
        }
        fn sync_data(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A full disk in the middle of a flush leaves whole lines only, and the lines that did
    /// not fit are written, whole, once there is room again.
    #[test]
    fn a_full_disk_never_leaves_a_torn_line() {
        let mut m = Metrics {
            file: FillingFile {
                data: Default::default(),
                pos: 0,
                room: 30,
            },
            pending: String::new(),
            len: 0,
        };
        m.line(format_args!("{{\"step\":1,\"a\":1.0}}")).unwrap();
        m.flush().unwrap();
        m.line(format_args!("{{\"step\":2,\"a\":2.0}}")).unwrap();
        assert!(m.flush().is_err(), "the disk should be full");
        m.file.room = 1 << 20;
        m.line(format_args!("{{\"step\":3,\"a\":3.0}}")).unwrap();
        m.flush().unwrap();
        let text = String::from_utf8(m.file.data.borrow().clone()).unwrap();
        let steps: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, [1, 2, 3], "{text:?}");
    }

    fn read_result(dir: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("result.json")).unwrap()).unwrap()
    }

    /// A rank that noticed rank 0 lost writes `result.json` with the error, unless rank 0
    /// wrote one since that rank started.
    #[test]
    fn fail_in_writes_the_error_unless_a_newer_result_is_there() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let read = || read_result(dir);
        let before = SystemTime::now() - Duration::from_secs(60);
        fail_in(dir, "rank 0 is gone", before, 2, 1).unwrap();
        let r = read();
        assert_eq!(r["error"], "rank 0 is gone");
        assert_eq!(
            (r["world_size"].as_u64(), r["restarts"].as_u64()),
            (Some(2), Some(1))
        );
        assert!(r["wall_seconds"].as_f64().unwrap() >= 60.0, "{r}");
        assert!(r["eval_reward_mean"].is_null(), "{r}");
        // That file is newer than `before`: a second report leaves it.
        fail_in(dir, "another", before, 2, 1).unwrap();
        assert_eq!(read()["error"], "rank 0 is gone");
        // A result older than this rank's start (a previous attempt's) is replaced.
        fail_in(
            dir,
            "newer",
            SystemTime::now() + Duration::from_secs(60),
            2,
            1,
        )
        .unwrap();
        assert_eq!(read()["error"], "newer");
    }

    /// The split run's parent replaces an earlier attempt's result.json (the learner was
    /// killed in the last one) with the newest checkpoint's counters, and leaves the last
    /// attempt's own.
    #[test]
    fn fail_after_workers_speaks_for_the_last_attempt_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let read = || read_result(dir);
        std::fs::create_dir(dir.join("ckpt")).unwrap();
        let mut ck = Checkpoint::default();
        ck.meta.insert("env_steps".into(), "4584".into());
        ck.meta.insert("train_iters".into(), "2805".into());
        ck.save(&dir.join("ckpt/latest.safetensors")).unwrap();
        fail_in(dir, "attempt 0: node 0 is gone", SystemTime::now(), 3, 0).unwrap();
        fail_after_workers(dir, "attempt 1: the learner was killed", 3, 1).unwrap();
        let r = read();
        assert_eq!(r["error"], "attempt 1: the learner was killed");
        assert_eq!(
            (r["env_steps"].as_u64(), r["train_iters"].as_u64()),
            (Some(4584), Some(2805))
        );
        assert_eq!(r["restarts"].as_u64(), Some(1));
        // The last attempt's own word stays.
        fail_after_workers(dir, "something else", 3, 1).unwrap();
        assert_eq!(read()["error"], "attempt 1: the learner was killed");
    }

    #[test]
    fn a_failed_checkpoint_write_names_the_file_and_runs_never_share_a_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config::parse("[env]\nid = \"CartPole-v0\"\n", "t.toml", &[]).unwrap();
        let dir = tmp.path().join("run");
        let mut exp = Experiment::create(&dir, &config, true).unwrap();
        assert_eq!(exp.dir(), dir);
        assert!(dir.join("config.toml").is_file());
        // A file where the checkpoint folder should be makes the write fail.
        std::fs::remove_dir(dir.join("ckpt")).unwrap();
        std::fs::write(dir.join("ckpt"), b"").unwrap();
        let err = exp
            .checkpoint("best", &mut Checkpoint::default)
            .unwrap_err()
            .to_string();
        let want = format!("checkpoint {}", dir.join("ckpt/best.safetensors").display());
        assert!(err.starts_with(&want), "{err}");
        // `latest` is throttled: a second request right after the first is skipped.
        std::fs::remove_file(dir.join("ckpt")).unwrap();
        std::fs::create_dir(dir.join("ckpt")).unwrap();
        exp.checkpoint("latest", &mut Checkpoint::default).unwrap();
        exp.checkpoint("latest", &mut || panic!("not rebuilt within 10 s"))
            .unwrap();
        assert!(dir.join("ckpt/latest.safetensors").is_file());
        let second = Experiment::create(&dir, &config, true).unwrap();
        assert_eq!(second.dir(), tmp.path().join("run_2"));
    }
}
