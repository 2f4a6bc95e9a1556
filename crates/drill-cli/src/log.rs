//! Log output: stderr, and once a run knows its folder, also that rank's log file
//! (`EXP/logs/rank_N.log`).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

static FILE: OnceLock<Mutex<File>> = OnceLock::new();

/// Writes each log line to stderr and to the log file when one is set.
pub struct Tee;

/// The writer [`Tee`] hands out per event.
pub struct TeeWriter;

impl Write for TeeWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = FILE.get() {
            let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
            // A full disk must not stop training; stderr still has the line.
            let _ = f.write_all(buf);
        }
        // Around the progress bar, so a log line never lands in the middle of it.
        drill_exp::suspend_bar(|| std::io::stderr().write_all(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Tee {
    type Writer = TeeWriter;
    fn make_writer(&'a self) -> TeeWriter {
        TeeWriter
    }
}

/// From now on, also append log lines to `path` (its folder is created).
pub fn also_to(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let _ = FILE.set(Mutex::new(f));
    Ok(())
}
