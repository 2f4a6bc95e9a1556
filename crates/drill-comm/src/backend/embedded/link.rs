//! How bytes travel to one peer: a non-blocking TCP connection or two shared-memory rings,
//! plus the peer's control connection and reduction staging buffer.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;

use super::shm::Ring;

/// Bytes of the staging buffer that received data is reduced from.
const STAGE: usize = 64 << 10;

/// How bytes travel to one peer.
pub enum Link {
    /// A TCP connection (non-blocking).
    Tcp(TcpStream),
    /// Two shared-memory rings.
    Shm {
        /// Ours to write.
        tx: Ring,
        /// Ours to read.
        rx: Ring,
    },
}

impl Link {
    #[inline]
    pub(super) fn write_some(&mut self, hdr: &[u8], payload: &[u8]) -> io::Result<usize> {
        match self {
            Link::Shm { tx, .. } => {
                let n = tx.write_some(hdr)?;
                if n < hdr.len() {
                    return Ok(n);
                }
                Ok(n + tx.write_some(payload)?)
            }
            Link::Tcp(s) => match s.write_vectored(&[IoSlice::new(hdr), IoSlice::new(payload)]) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
                Err(e) => Err(e),
            },
        }
    }

    #[inline]
    pub(super) fn read_some(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Shm { rx, .. } => rx.read_some(buf),
            Link::Tcp(s) => match s.read(buf) {
                Ok(0) if !buf.is_empty() => Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
                Err(e) => Err(e),
            },
        }
    }

    /// Whether this link goes through shared memory.
    pub fn is_shm(&self) -> bool {
        matches!(self, Link::Shm { .. })
    }
}

/// Another rank: its data link, control connection and reduction staging buffer.
pub struct Peer {
    /// How data travels.
    pub link: Link,
    /// Control connection (failure notices; its closing is how death is noticed).
    pub ctrl: TcpStream,
    pub(super) stage: Vec<u64>,
}

impl Peer {
    /// A peer from its connections.
    pub fn new(link: Link, ctrl: TcpStream) -> Peer {
        Peer {
            link,
            ctrl,
            stage: vec![0u64; STAGE / 8],
        }
    }
}
