//! Worker output: every line prefixed with `[rank N]` on the launcher's terminal, and copied
//! unprefixed to the rank's log file when `--log-dir` is given.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::thread::JoinHandle;

/// Which terminal stream a worker stream goes to.
#[derive(Clone, Copy)]
pub enum Stream {
    /// The launcher's stdout.
    Out,
    /// The launcher's stderr.
    Err,
}

/// Copy `src` line by line until it closes.
pub fn pump(
    src: impl Read + Send + 'static,
    prefix: String,
    to: Stream,
    mut file: Option<File>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if let Some(f) = file.as_mut() {
                let _ = f.write_all(&line);
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let _ = match to {
                Stream::Out => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(prefix.as_bytes())
                        .and_then(|_| o.write_all(&line))
                        .and_then(|_| o.flush())
                }
                Stream::Err => {
                    let mut o = std::io::stderr().lock();
                    o.write_all(prefix.as_bytes())
                        .and_then(|_| o.write_all(&line))
                }
            };
        }
        if let Some(f) = file.as_mut() {
            let _ = f.flush();
        }
    })
}
