//! Shared-memory byte streams between two ranks on one host: a file in /dev/shm holding two
//! single-producer single-consumer rings (one per direction).
//!
//! Hand-written because it is ~100 lines of atomics on a mapping (memmap2 does the mapping):
//! no crate offers a cross-process SPSC byte ring with the non-blocking partial reads and
//! writes the progress engine needs.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapRaw;

use crate::error::{CommError, Result};

/// Bytes before each ring's data: head and tail counters on their own cache lines.
const RING_HEADER: usize = 256;
const TAIL_OFFSET: usize = 128;

/// Ring capacity in bytes (power of two); `DRILL_SHM_RING_BYTES` overrides the default 4 MiB.
pub fn ring_capacity() -> usize {
    std::env::var("DRILL_SHM_RING_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map(|v| v.clamp(4096, 1 << 30).next_power_of_two())
        .unwrap_or(4 << 20)
}

/// The mapping shared by the two rings of a pair.
pub struct Segment {
    map: MmapRaw,
    cap: usize,
}

impl Segment {
    /// Create a new segment file (mode 0600, must not exist) sized for two rings of `cap`.
    pub fn create(path: &Path, cap: usize) -> Result<Arc<Segment>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| CommError::io(format!("create shared memory {}", path.display()), e))?;
        file.set_len((2 * (RING_HEADER + cap)) as u64)
            .map_err(|e| CommError::io(format!("size shared memory {}", path.display()), e))?;
        Self::map(&file, path, cap)
    }

    /// Open a segment the peer created.
    pub fn open(path: &Path, cap: usize) -> Result<Arc<Segment>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| CommError::io(format!("open shared memory {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| CommError::io("stat shared memory", e))?
            .len();
        if len != (2 * (RING_HEADER + cap)) as u64 {
            return Err(CommError::io(
                format!(
                    "shared memory {} has {len} bytes, expected {}",
                    path.display(),
                    2 * (RING_HEADER + cap)
                ),
                std::io::ErrorKind::InvalidData.into(),
            ));
        }
        Self::map(&file, path, cap)
    }

    fn map(file: &File, path: &Path, cap: usize) -> Result<Arc<Segment>> {
        assert!(cap.is_power_of_two());
        let map = MmapRaw::map_raw(file)
            .map_err(|e| CommError::io(format!("map {}", path.display()), e))?;
        Ok(Arc::new(Segment { map, cap }))
    }

    /// Ring `i` (0 or 1) of this segment.
    pub fn ring(self: &Arc<Self>, i: usize) -> Ring {
        assert!(i < 2);
        let base = unsafe { self.map.as_mut_ptr().add(i * (RING_HEADER + self.cap)) };
        Ring {
            seg: self.clone(),
            base,
            cap: self.cap,
        }
    }
}

/// One direction of a pair: the writer side calls [`Ring::write_some`], the reader side
/// [`Ring::read_some`]; each side only ever uses one of the two.
pub struct Ring {
    seg: Arc<Segment>,
    base: *mut u8,
    cap: usize,
}

// The ring is used by one thread at a time on each side; the counters are atomics in the
// shared mapping and the data region is only touched between them (SPSC protocol).
unsafe impl Send for Ring {}

impl Ring {
    fn head(&self) -> &AtomicU64 {
        unsafe { &*(self.base as *const AtomicU64) }
    }

    fn tail(&self) -> &AtomicU64 {
        unsafe { &*(self.base.add(TAIL_OFFSET) as *const AtomicU64) }
    }

    fn data(&self) -> *mut u8 {
        unsafe { self.base.add(RING_HEADER) }
    }

    /// Copy as much of `buf` as fits; returns the bytes written (0 when full).
    #[inline]
    pub fn write_some(&mut self, buf: &[u8]) -> usize {
        let head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::Acquire);
        let used = head.wrapping_sub(tail) as usize;
        let n = buf.len().min(self.cap - used);
        if n == 0 {
            return 0;
        }
        let pos = head as usize & (self.cap - 1);
        let first = n.min(self.cap - pos);
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), self.data().add(pos), first);
            std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), self.data(), n - first);
        }
        self.head()
            .store(head.wrapping_add(n as u64), Ordering::Release);
        n
    }

    /// Copy as many available bytes as fit into `buf`; returns the bytes read (0 when empty).
    #[inline]
    pub fn read_some(&mut self, buf: &mut [u8]) -> usize {
        let tail = self.tail().load(Ordering::Relaxed);
        let head = self.head().load(Ordering::Acquire);
        let avail = head.wrapping_sub(tail) as usize;
        let n = buf.len().min(avail);
        if n == 0 {
            return 0;
        }
        let pos = tail as usize & (self.cap - 1);
        let first = n.min(self.cap - pos);
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(pos), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data(), buf.as_mut_ptr().add(first), n - first);
        }
        self.tail()
            .store(tail.wrapping_add(n as u64), Ordering::Release);
        n
    }

    /// Keep the mapping alive (for the borrow checker's sake, the field is read here).
    pub fn capacity(&self) -> usize {
        debug_assert!(self.seg.cap == self.cap);
        self.cap
    }
}

/// A fresh, unguessable segment path for a pair.
pub fn segment_path(lo: usize, hi: usize) -> PathBuf {
    use rand::RngCore;
    let r = rand::rng().next_u64();
    PathBuf::from(format!(
        "/dev/shm/drill-{}-{lo}-{hi}-{r:016x}",
        std::process::id()
    ))
}

/// Whether shared memory can be used here.
pub fn available() -> bool {
    Path::new("/dev/shm").is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wraps_and_preserves_order() {
        let path = segment_path(0, 1);
        let seg = Segment::create(&path, 4096).unwrap();
        let other = Segment::open(&path, 4096).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut tx = seg.ring(0);
        let mut rx = other.ring(0);
        assert_eq!(tx.capacity(), 4096);
        let msg: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut got = vec![0u8; msg.len()];
        let (mut w, mut r) = (0, 0);
        while r < msg.len() {
            w += tx.write_some(&msg[w..(w + 3000).min(msg.len())]);
            r += rx.read_some(&mut got[r..(r + 1234).min(msg.len())]);
        }
        assert_eq!(got, msg);
        assert_eq!(rx.read_some(&mut [0u8; 8]), 0);
    }
}
