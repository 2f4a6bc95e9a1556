//! The store's wire format: one request frame, one response frame; every length bounded.

use std::io::{self, Read, Write};

/// Longest key accepted.
pub const MAX_KEY: usize = 1024;
/// Largest value accepted.
pub const MAX_VALUE: usize = 64 << 20;
/// Most keys in one wait/check request.
pub const MAX_KEYS: usize = 4096;

/// Request kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Set = 1,
    Get = 2,
    Add = 3,
    CompareSet = 4,
    Delete = 5,
    Wait = 6,
    Check = 7,
    NumKeys = 8,
}

impl Op {
    fn from_u8(b: u8) -> Option<Op> {
        Some(match b {
            1 => Op::Set,
            2 => Op::Get,
            3 => Op::Add,
            4 => Op::CompareSet,
            5 => Op::Delete,
            6 => Op::Wait,
            7 => Op::Check,
            8 => Op::NumKeys,
            _ => return None,
        })
    }
}

/// A decoded request: the op, its keys, its byte arguments and a timeout in milliseconds.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub keys: Vec<String>,
    pub args: Vec<Vec<u8>>,
    pub timeout_ms: u64,
}

/// Response status.
pub const OK: u8 = 0;
pub const TIMEOUT: u8 = 1;
pub const MISSING: u8 = 2;

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_bytes(r: &mut impl Read, limit: usize, what: &str) -> io::Result<Vec<u8>> {
    let n = read_u32(r)? as usize;
    if n > limit {
        return Err(bad(format!(
            "{what} of {n} bytes exceeds the limit of {limit}"
        )));
    }
    // Grown as the bytes arrive, not reserved from the length field: a frame that claims the
    // limit and then stops costs what it sent, not 64 MiB.
    let mut v = Vec::with_capacity(n.min(64 << 10));
    r.take(n as u64).read_to_end(&mut v)?;
    if v.len() < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(v)
}

impl Request {
    /// Encode into one buffer (written with a single write).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![self.op as u8];
        b.extend_from_slice(&self.timeout_ms.to_le_bytes());
        b.extend_from_slice(&(self.keys.len() as u32).to_le_bytes());
        for k in &self.keys {
            b.extend_from_slice(&(k.len() as u32).to_le_bytes());
            b.extend_from_slice(k.as_bytes());
        }
        b.extend_from_slice(&(self.args.len() as u32).to_le_bytes());
        for a in &self.args {
            b.extend_from_slice(&(a.len() as u32).to_le_bytes());
            b.extend_from_slice(a);
        }
        b
    }

    /// Decode one request; rejects unknown ops, oversized fields and bad UTF-8.
    pub fn decode(r: &mut impl Read) -> io::Result<Request> {
        let mut op = [0u8; 1];
        r.read_exact(&mut op)?;
        let op = Op::from_u8(op[0]).ok_or_else(|| bad(format!("unknown store op {}", op[0])))?;
        let mut t = [0u8; 8];
        r.read_exact(&mut t)?;
        let nkeys = read_u32(r)? as usize;
        if nkeys > MAX_KEYS {
            return Err(bad(format!(
                "{nkeys} keys in one request (limit {MAX_KEYS})"
            )));
        }
        let mut keys = Vec::with_capacity(nkeys.min(16));
        for _ in 0..nkeys {
            let k = read_bytes(r, MAX_KEY, "key")?;
            keys.push(String::from_utf8(k).map_err(|_| bad("key is not UTF-8".into()))?);
        }
        let nargs = read_u32(r)? as usize;
        if nargs > 2 {
            return Err(bad(format!("{nargs} arguments in one request (limit 2)")));
        }
        let mut args = Vec::with_capacity(nargs);
        for _ in 0..nargs {
            args.push(read_bytes(r, MAX_VALUE, "value")?);
        }
        let req = Request {
            op,
            keys,
            args,
            timeout_ms: u64::from_le_bytes(t),
        };
        let (k, a) = match op {
            Op::Set => (1, 1),
            Op::Get | Op::Delete => (1, 0),
            Op::Add => (1, 1),
            Op::CompareSet => (1, 2),
            Op::Wait | Op::Check => (req.keys.len(), 0),
            Op::NumKeys => (0, 0),
        };
        if req.keys.len() != k || req.args.len() != a {
            return Err(bad(format!(
                "{op:?} with {} keys and {} arguments",
                req.keys.len(),
                req.args.len()
            )));
        }
        if op == Op::Add && req.args[0].len() != 8 {
            return Err(bad("add takes an 8-byte integer".into()));
        }
        Ok(req)
    }
}

/// Write a response.
pub fn write_response(w: &mut impl Write, status: u8, value: &[u8]) -> io::Result<()> {
    let mut b = Vec::with_capacity(5 + value.len());
    b.push(status);
    b.extend_from_slice(&(value.len() as u32).to_le_bytes());
    b.extend_from_slice(value);
    w.write_all(&b)
}

/// Read a response.
pub fn read_response(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut s = [0u8; 1];
    r.read_exact(&mut s)?;
    if s[0] > MISSING {
        return Err(bad(format!("unknown store status {}", s[0])));
    }
    Ok((s[0], read_bytes(r, MAX_VALUE, "value")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let r = Request {
            op: Op::CompareSet,
            keys: vec!["k".into()],
            args: vec![b"a".to_vec(), vec![]],
            timeout_ms: 7,
        };
        assert_eq!(Request::decode(&mut &r.encode()[..]).unwrap(), r);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_or_overallocate(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            // Either a valid request or an error; lengths above the limits are refused before
            // allocating, so a 4-byte length field cannot make us reserve gigabytes.
            let _ = Request::decode(&mut &bytes[..]);
            let _ = read_response(&mut &bytes[..]);
        }

        #[test]
        fn truncations_of_valid_requests_are_errors(key in "[a-z]{0,20}", val in proptest::collection::vec(any::<u8>(), 0..64), cut in 0usize..100) {
            let enc = Request { op: Op::Set, keys: vec![key], args: vec![val], timeout_ms: 0 }.encode();
            let cut = cut.min(enc.len().saturating_sub(1));
            prop_assert!(Request::decode(&mut &enc[..cut]).is_err());
        }
    }
}
