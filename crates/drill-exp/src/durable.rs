//! Files that survive a crash whole: [`write_atomic`] writes a temporary file in the same
//! folder, `fsync`s it, renames it over the target and `fsync`s the folder (SQLite's and
//! etcd's sequence), so after a power cut the path holds either the old contents or the new,
//! never a renamed but empty or torn file. A failed write removes its temporary file, and a
//! full disk is an error naming the path and the bytes the file needed.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Write `bytes` to `path` durably and atomically (see the module docs).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, bytes.len() as u64, |tmp| {
        File::create(tmp)?.write_all(bytes)
    })
}

/// [`write_atomic`] for contents that `fill` writes to the temporary path it is given (a
/// writer that opens its own file); `size` is what they take (for the message when the disk
/// is full).
pub fn write_atomic_with(
    path: &Path,
    size: u64,
    fill: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<()> {
    if drill_plant::planted(drill_plant::Bug::CheckpointInPlace) {
        let in_place = fill(path).and_then(|_| File::open(path)?.sync_all());
        return in_place.map_err(|e| explain(e, size));
    }
    let tmp = temporary(path);
    let written = (|| {
        fill(&tmp)?;
        File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(path)
    })();
    if written.is_err() {
        // The rename may not have happened: never leave the temporary file behind (on a full
        // disk it holds the space the rest of the run needs).
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| explain(e, size))
}

/// `std::fs::create_dir_all` whose new folders survive a crash: each folder it creates is
/// `fsync`ed into its parent (a new folder's name lives in its parent's entries, which no
/// write inside it makes durable), the deepest first and the pre-existing ancestor last.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.as_os_str().is_empty() && !at.is_dir() {
        missing.push(at);
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    std::fs::create_dir_all(dir)?;
    for created in missing {
        sync_dir(created)?;
    }
    Ok(())
}

/// `fsync` the folder holding `path`, so a rename or a new file in it is durable.
pub fn sync_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// A full disk said with the bytes needed; other errors unchanged.
fn explain(e: io::Error, size: u64) -> io::Error {
    if e.kind() == io::ErrorKind::StorageFull {
        io::Error::new(
            io::ErrorKind::StorageFull,
            format!("no space left on the device for {size} bytes ({e})"),
        )
    } else {
        e
    }
}

/// Remove the temporary files [`write_atomic`] left in `dir` when its writer died mid-write
/// (call it only while nothing writes there).
pub fn remove_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.contains(".tmp-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The temporary sibling of `path`, unique to this process and thread (ranks and threads of
/// one run never share one).
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    path.with_file_name(format!(".{name}.tmp-{}-{thread}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new contents").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new contents");
        let names: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_failed_fill_keeps_the_old_file_and_removes_the_temporary_one() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("ck");
        write_atomic(&path, b"old").unwrap();
        let err = write_atomic_with(&path, 7, |tmp| {
            std::fs::write(tmp, b"half")?;
            Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"))
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(err.to_string().contains("for 7 bytes"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        // What a writer killed mid-write leaves is removed by the next one to take the folder.
        std::fs::write(tmp.path().join(".ck.tmp-123-4"), b"torn").unwrap();
        remove_temporaries(tmp.path());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn create_dir_all_makes_every_missing_level_and_takes_an_existing_one() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("run/ckpt");
        create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_all(&deep).unwrap();
        std::fs::write(tmp.path().join("file"), b"").unwrap();
        assert!(create_dir_all(&tmp.path().join("file/sub")).is_err());
    }
}
