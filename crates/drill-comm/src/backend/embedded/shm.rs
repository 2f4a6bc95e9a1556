//! Shared-memory byte streams between two ranks on one host: a file in /dev/shm holding two
//! single-producer single-consumer rings (one per direction).
//!
//! Hand-written because it is ~100 lines of atomics on a mapping (memmap2 does the mapping):
//! no crate offers a cross-process SPSC byte ring with the non-blocking partial reads and
//! writes the progress engine needs.

use std::fs::{File, OpenOptions};
use std::io;
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
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| CommError::io(format!("create shared memory {}", path.display()), e))?;
        file.set_len((2 * (RING_HEADER + cap)) as u64)
            .map_err(|e| CommError::io(format!("size shared memory {}", path.display()), e))?;
        Self::map(&file, path, cap)
    }

    /// Open a segment the peer created: a regular file of this user's, never through a
    /// symbolic link (another user could plant one in `/dev/shm` to redirect the mapping).
    pub fn open(path: &Path, cap: usize) -> Result<Arc<Segment>> {
        use std::os::unix::fs::MetadataExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| CommError::io(format!("open shared memory {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| CommError::io("stat shared memory", e))?;
        // SAFETY: getuid has no preconditions and cannot fail.
        let me = unsafe { libc::getuid() };
        if !meta.file_type().is_file() || meta.uid() != me {
            return Err(CommError::io(
                format!(
                    "shared memory {} is not a regular file of this user's (uid {}, ours {me})",
                    path.display(),
                    meta.uid()
                ),
                std::io::ErrorKind::PermissionDenied.into(),
            ));
        }
        let len = meta.len();
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
        // SAFETY: the mapping holds two rings of RING_HEADER + cap bytes (sized so by
        // `create` and checked by `open`), so ring i's start lies inside it.
        let base = unsafe { self.map.as_mut_ptr().add(i * (RING_HEADER + self.cap)) };
        Ring::over(Mapped {
            seg: self.clone(),
            base,
        })
    }
}

/// Where a ring's counters and bytes live: the shared mapping ([`Mapped`]), or, in the
/// model-checking test, loom's instrumented cells.
pub trait Memory {
    /// The data region's size in bytes (a power of two).
    fn capacity(&self) -> usize;
    /// Load the write counter.
    fn load_head(&self, order: Ordering) -> u64;
    /// Publish the write counter.
    fn store_head(&self, value: u64, order: Ordering);
    /// Load the read counter.
    fn load_tail(&self, order: Ordering) -> u64;
    /// Publish the read counter.
    fn store_tail(&self, value: u64, order: Ordering);
    /// Copy `src` into the data region at `pos`.
    ///
    /// # Safety
    /// `pos + src.len() <= capacity()`, and the peer must not touch those bytes meanwhile
    /// (the SPSC protocol of [`Ring`] guarantees it).
    unsafe fn write(&self, pos: usize, src: &[u8]);
    /// Copy the data region's bytes at `pos` into `dst`.
    ///
    /// # Safety
    /// As for [`Memory::write`].
    unsafe fn read(&self, pos: usize, dst: &mut [u8]);
}

/// A ring in a shared mapping: the counters in its header, the bytes after it.
pub struct Mapped {
    seg: Arc<Segment>,
    base: *mut u8,
}

// SAFETY: the ring is used by one thread at a time on each side; the counters are atomics in
// the shared mapping and the data region is only touched between them (SPSC protocol).
unsafe impl Send for Mapped {}

impl Mapped {
    fn head(&self) -> &AtomicU64 {
        // SAFETY: `base` is 8-aligned (a page-aligned mapping plus multiples of 256 bytes)
        // and the counter lies in the ring's header, inside the mapping, which `seg` keeps
        // alive; other processes only touch it atomically.
        unsafe { &*(self.base as *const AtomicU64) }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as for `head`, TAIL_OFFSET bytes on, still inside the header.
        unsafe { &*(self.base.add(TAIL_OFFSET) as *const AtomicU64) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data region follows the header inside the mapping.
        unsafe { self.base.add(RING_HEADER) }
    }
}

impl Memory for Mapped {
    fn capacity(&self) -> usize {
        self.seg.cap
    }
    fn load_head(&self, order: Ordering) -> u64 {
        self.head().load(order)
    }
    fn store_head(&self, value: u64, order: Ordering) {
        self.head().store(value, order)
    }
    fn load_tail(&self, order: Ordering) -> u64 {
        self.tail().load(order)
    }
    fn store_tail(&self, value: u64, order: Ordering) {
        self.tail().store(value, order)
    }
    unsafe fn write(&self, pos: usize, src: &[u8]) {
        // SAFETY: inside the data region, untouched by the peer (the caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.data().add(pos), src.len()) }
    }
    unsafe fn read(&self, pos: usize, dst: &mut [u8]) {
        // SAFETY: as for `write`.
        unsafe { std::ptr::copy_nonoverlapping(self.data().add(pos), dst.as_mut_ptr(), dst.len()) }
    }
}

/// One direction of a pair: the writer side calls [`Ring::write_some`], the reader side
/// [`Ring::read_some`]; each side only ever uses one of the two.
///
/// Each side keeps its own counter here and only publishes it to the mapping, and checks the
/// peer's counter before trusting it: a peer that writes nonsense into the shared counters
/// (a bug, memory corruption) gets an error, never a copy outside the ring.
pub struct Ring<M: Memory = Mapped> {
    mem: M,
    cap: usize,
    /// Bytes written so far (the writer's own count; the reader's last check of it).
    head: u64,
    /// Bytes read so far (the reader's own count; the writer's last check of it).
    tail: u64,
}

impl<M: Memory> Ring<M> {
    /// A ring over `mem`, starting from the counters it holds.
    pub fn over(mem: M) -> Self {
        let cap = mem.capacity();
        assert!(cap.is_power_of_two());
        let (head, tail) = (
            mem.load_head(Ordering::Acquire),
            mem.load_tail(Ordering::Acquire),
        );
        Ring {
            mem,
            cap,
            head,
            tail,
        }
    }

    /// The peer's published counter `seen` (the reader's `tail` for a writer, the writer's
    /// `head` for a reader), checked against ours: the bytes between them must be within the
    /// capacity and the counter must not go backwards.
    fn check(&self, what: &str, used: u64, seen: u64, last: u64) -> io::Result<()> {
        let moved = seen.wrapping_sub(last);
        if used > self.cap as u64 || moved > self.cap as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "shared-memory ring corrupt: the peer's {what} counter reads {seen}, against {last} before and {} bytes of capacity",
                    self.cap
                ),
            ));
        }
        Ok(())
    }

    /// Copy as much of `buf` as fits; returns the bytes written (0 when full), or an error
    /// when the peer's read counter is out of range.
    #[inline]
    pub fn write_some(&mut self, buf: &[u8]) -> io::Result<usize> {
        let head = self.head;
        let tail = self.mem.load_tail(Ordering::Acquire);
        let used = head.wrapping_sub(tail);
        self.check("read", used, tail, self.tail)?;
        self.tail = tail;
        let n = buf.len().min(self.cap - used as usize);
        if n == 0 {
            return Ok(0);
        }
        let pos = head as usize & (self.cap - 1);
        let first = n.min(self.cap - pos);
        // SAFETY: pos < cap and first <= cap - pos, n - first <= pos (n <= cap): both copies
        // stay inside the data region; the reader does not touch these bytes until the head
        // store below publishes them (used + n <= cap, checked above).
        unsafe {
            self.mem.write(pos, &buf[..first]);
            self.mem.write(0, &buf[first..n]);
        }
        self.head = head.wrapping_add(n as u64);
        self.mem.store_head(self.head, Ordering::Release);
        Ok(n)
    }

    /// Copy as many available bytes as fit into `buf`; returns the bytes read (0 when empty),
    /// or an error when the peer's write counter is out of range.
    #[inline]
    pub fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let tail = self.tail;
        let head = self.mem.load_head(Ordering::Acquire);
        let avail = head.wrapping_sub(tail);
        self.check("write", avail, head, self.head)?;
        self.head = head;
        let n = buf.len().min(avail as usize);
        if n == 0 {
            return Ok(0);
        }
        let pos = tail as usize & (self.cap - 1);
        let first = n.min(self.cap - pos);
        // SAFETY: as in `write_some`, both copies stay inside the data region; the writer
        // published these bytes (avail <= cap, checked above) and does not reuse them until
        // the tail store below.
        unsafe {
            let (a, b) = buf[..n].split_at_mut(first);
            self.mem.read(pos, a);
            self.mem.read(0, b);
        }
        self.tail = tail.wrapping_add(n as u64);
        self.mem.store_tail(self.tail, Ordering::Release);
        Ok(n)
    }

    /// The data region's size in bytes.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Overwrite the shared counter the peer publishes (a test of the checks above).
    #[cfg(test)]
    fn corrupt(&self, head: bool, value: u64) {
        if head {
            self.mem.store_head(value, Ordering::Release);
        } else {
            self.mem.store_tail(value, Ordering::Release);
        }
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

    /// Ring 0 of a fresh 4096-byte segment, seen by its writer and by its reader (through a
    /// second mapping, as another process would); the file is already unlinked.
    fn ring_pair() -> (Ring, Ring) {
        let path = segment_path(0, 1);
        let seg = Segment::create(&path, 4096).unwrap();
        let other = Segment::open(&path, 4096).unwrap();
        std::fs::remove_file(&path).unwrap();
        (seg.ring(0), other.ring(0))
    }

    #[test]
    fn a_symbolic_link_is_never_followed() {
        let target = segment_path(7, 8);
        let seg = Segment::create(&target, 4096).unwrap();
        let link = segment_path(7, 9);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let opened = Segment::open(&link, 4096);
        let created = Segment::create(&link, 4096);
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_file(&target).unwrap();
        drop(seg);
        let e = opened.err().expect("opened through a link").to_string();
        assert!(e.contains("open shared memory"), "{e}");
        assert!(created.is_err(), "created through a link");
    }

    #[test]
    fn ring_wraps_and_preserves_order() {
        let (mut tx, mut rx) = ring_pair();
        assert_eq!(tx.capacity(), 4096);
        let msg: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut got = vec![0u8; msg.len()];
        let (mut w, mut r) = (0, 0);
        while r < msg.len() {
            w += tx.write_some(&msg[w..(w + 3000).min(msg.len())]).unwrap();
            r += rx
                .read_some(&mut got[r..(r + 1234).min(msg.len())])
                .unwrap();
        }
        assert_eq!(got, msg);
        assert_eq!(rx.read_some(&mut [0u8; 8]).unwrap(), 0);
    }

    /// The ring's synchronisation, model-checked: loom runs a writer and a reader over a
    /// 4-byte ring through every interleaving its C11 memory model allows (acquire/release
    /// included), and fails on a data race on any byte (a read not ordered after the write
    /// it sees, or a write over bytes not yet read) or a wrong message.
    #[test]
    fn the_protocol_is_race_free_in_every_interleaving() {
        use loom::cell::UnsafeCell;
        use loom::sync::atomic::AtomicU64;

        struct Model {
            head: AtomicU64,
            tail: AtomicU64,
            data: Vec<UnsafeCell<u8>>,
        }
        struct Side(loom::sync::Arc<Model>);
        impl Memory for Side {
            fn capacity(&self) -> usize {
                self.0.data.len()
            }
            fn load_head(&self, order: Ordering) -> u64 {
                self.0.head.load(order)
            }
            fn store_head(&self, value: u64, order: Ordering) {
                self.0.head.store(value, order)
            }
            fn load_tail(&self, order: Ordering) -> u64 {
                self.0.tail.load(order)
            }
            fn store_tail(&self, value: u64, order: Ordering) {
                self.0.tail.store(value, order)
            }
            unsafe fn write(&self, pos: usize, src: &[u8]) {
                for (i, b) in src.iter().enumerate() {
                    // SAFETY: loom's cell checks the access itself (a race fails the model).
                    self.0.data[pos + i].with_mut(|p| unsafe { *p = *b });
                }
            }
            unsafe fn read(&self, pos: usize, dst: &mut [u8]) {
                for (i, d) in dst.iter_mut().enumerate() {
                    // SAFETY: as in `write`.
                    *d = self.0.data[pos + i].with(|p| unsafe { *p });
                }
            }
        }

        loom::model(|| {
            let model = loom::sync::Arc::new(Model {
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                data: (0..4).map(|_| UnsafeCell::new(0)).collect(),
            });
            let mut tx = Ring::over(Side(model.clone()));
            let mut rx = Ring::over(Side(model));
            // Six bytes through four: the writer must wait for the reader, and wraps.
            let msg = [1u8, 2, 3, 4, 5, 6];
            let writer = loom::thread::spawn(move || {
                let mut w = 0;
                while w < msg.len() {
                    let n = tx.write_some(&msg[w..(w + 3).min(msg.len())]).unwrap();
                    if n == 0 {
                        loom::thread::yield_now();
                    }
                    w += n;
                }
            });
            let mut got = [0u8; 6];
            let mut r = 0;
            while r < got.len() {
                let n = rx.read_some(&mut got[r..]).unwrap();
                if n == 0 {
                    loom::thread::yield_now();
                }
                r += n;
            }
            writer.join().unwrap();
            assert_eq!(got, msg);
        });
    }

    /// A peer that writes nonsense into the counters it publishes gets an error naming the
    /// counter, and no byte is copied (the copy would land outside the ring).
    #[test]
    fn a_corrupt_counter_is_an_error_not_a_wild_copy() {
        let (mut tx, mut rx) = ring_pair();
        assert_eq!(tx.write_some(&[1; 100]).unwrap(), 100);
        // The reader's published count jumps past what was written: the writer would see
        // 2^64 - 100 bytes in use.
        rx.corrupt(false, 200);
        let err = tx.write_some(&[2; 10]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("read counter reads 200"), "{err}");
        // The writer's published count runs a whole ring ahead: the reader would copy from
        // bytes never written.
        rx.corrupt(false, 0);
        tx.corrupt(true, 100 + 5000);
        let mut buf = [0u8; 64];
        let err = rx.read_some(&mut buf).unwrap_err();
        assert!(
            err.to_string().contains("write counter reads 5100"),
            "{err}"
        );
        assert_eq!(buf, [0u8; 64]);
        // Going backwards is caught too.
        tx.corrupt(true, 100);
        assert_eq!(rx.read_some(&mut buf[..10]).unwrap(), 10);
        tx.corrupt(true, 50);
        assert!(rx.read_some(&mut buf).is_err());
    }
}
