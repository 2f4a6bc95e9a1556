//! The store client: torch's TCPStore API (set, get, wait, add, compare_set, delete), with a
//! key prefix so restart attempts and groups do not collide.

use std::io::{BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::proto::{self, MAX_KEY, MAX_VALUE, MISSING, OK, Op, Request, TIMEOUT};
use crate::auth::{self, Token};
use crate::error::{CommError, Result};

struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn new(stream: TcpStream, addr: &str) -> Result<Conn> {
        let reader = BufReader::new(
            stream
                .try_clone()
                .map_err(|e| CommError::io(format!("store {addr}"), e))?,
        );
        Ok(Conn { stream, reader })
    }
}

/// How long a reply may take beyond the request's own wait, unless
/// [`Store::with_reply_slack`] says otherwise.
pub const REPLY_SLACK: Duration = Duration::from_secs(10);

/// A connection to a store server, viewed under a key prefix. Clones share the connection.
/// A request that fails on the wire (no reply in time, a reset) drops the connection; the
/// next request connects again, so a store behind a link that went down and came back is
/// reachable again.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Option<Conn>>>,
    addr: String,
    token: Token,
    prefix: String,
    timeout: Duration,
    slack: Duration,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({}, prefix {:?})", self.addr, self.prefix)
    }
}

impl Store {
    /// Connect to `host:port`, retrying until `timeout` (the server may not be up yet).
    pub fn connect(host: &str, port: u16, token: &Token, timeout: Duration) -> Result<Store> {
        let addr = format!("{host}:{port}");
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            match Self::try_connect(&addr, token) {
                Ok(stream) => {
                    return Ok(Store {
                        conn: Arc::new(Mutex::new(Some(Conn::new(stream, &addr)?))),
                        addr,
                        token: token.clone(),
                        prefix: String::new(),
                        timeout,
                        slack: REPLY_SLACK,
                    });
                }
                Err(e @ CommError::Auth { .. }) => return Err(e),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                return Err(CommError::Store {
                    addr,
                    detail: format!(
                        "could not connect within {timeout:?}: {last} (is rank 0 or the launcher running? MASTER_ADDR/MASTER_PORT right?)"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn try_connect(addr: &str, token: &Token) -> Result<TcpStream> {
        let sock = addr
            .to_socket_addrs()
            .map_err(|e| CommError::io(format!("resolve {addr}"), e))?
            .next()
            .ok_or_else(|| CommError::Env(format!("{addr} resolves to no address")))?;
        let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2))
            .map_err(|e| CommError::io(format!("connect {addr}"), e))?;
        s.set_nodelay(true).ok();
        auth::connect(&mut s, token, b"store")?;
        Ok(s)
    }

    /// The same connection under `prefix/` added to this view's prefix.
    pub fn with_prefix(&self, prefix: &str) -> Store {
        let mut s = self.clone();
        s.prefix = format!("{}{prefix}/", self.prefix);
        s
    }

    /// The same connection with no key prefix (keys shared by every attempt of a job).
    pub fn unprefixed(&self) -> Store {
        let mut s = self.clone();
        s.prefix.clear();
        s
    }

    /// The same connection, with requests failing when their reply is `slack` late (beyond
    /// what the request itself waits). Launchers use a short one: a store behind a cut link
    /// must not hold their failure handling for long.
    pub fn with_reply_slack(&self, slack: Duration) -> Store {
        let mut s = self.clone();
        s.slack = slack;
        s
    }

    /// Default timeout of blocking calls.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The local address of our connection (the interface that reaches the store).
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.conn
            .lock()
            .ok()?
            .as_ref()?
            .stream
            .local_addr()
            .ok()
            .map(|a| a.ip())
    }

    fn key(&self, k: &str) -> Result<String> {
        let key = format!("{}{k}", self.prefix);
        if key.len() > MAX_KEY {
            return Err(self.err(format!("key {key:?} longer than {MAX_KEY} bytes")));
        }
        Ok(key)
    }

    fn err(&self, detail: String) -> CommError {
        CommError::Store {
            addr: self.addr.clone(),
            detail,
        }
    }

    fn call(&self, req: Request) -> Result<(u8, Vec<u8>)> {
        if req.args.iter().any(|a| a.len() > MAX_VALUE) {
            return Err(self.err(format!("value larger than {MAX_VALUE} bytes")));
        }
        let op = req.op;
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let c = match &mut *guard {
            Some(c) => c,
            None => {
                let stream = Self::try_connect(&self.addr, &self.token)
                    .map_err(|e| self.err(format!("{op:?}: cannot reach the store again: {e}")))?;
                guard.insert(Conn::new(stream, &self.addr)?)
            }
        };
        let wait = Duration::from_millis(req.timeout_ms) + self.slack;
        let r = c
            .stream
            .set_read_timeout(Some(wait))
            .and_then(|_| c.stream.write_all(&req.encode()))
            .and_then(|_| proto::read_response(&mut c.reader));
        r.map_err(|e| {
            // The reply may still come: this connection is out of step, so drop it.
            *guard = None;
            self.err(format!(
                "{op:?}: {e} (no reply within {wait:?}: the store host exited, or the network to it is down)"
            ))
        })
    }

    /// Set `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call(Request {
            op: Op::Set,
            keys: vec![self.key(key)?],
            args: vec![value.to_vec()],
            timeout_ms: 0,
        })?;
        Ok(())
    }

    /// The value of `key`, waiting up to the store's timeout for it to be set.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.get_timeout(key, self.timeout)
    }

    /// The value of `key`, waiting up to `timeout`.
    pub fn get_timeout(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let k = self.key(key)?;
        let (s, v) = self.call(Request {
            op: Op::Get,
            keys: vec![k.clone()],
            args: vec![],
            timeout_ms: timeout.as_millis() as u64,
        })?;
        match s {
            OK => Ok(v),
            _ => Err(self.err(format!("get {k:?}: not set within {timeout:?}"))),
        }
    }

    /// Wait until every key is set, up to `timeout`.
    pub fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let ks = keys
            .iter()
            .map(|k| self.key(k))
            .collect::<Result<Vec<_>>>()?;
        let (s, _) = self.call(Request {
            op: Op::Wait,
            keys: ks.clone(),
            args: vec![],
            timeout_ms: timeout.as_millis() as u64,
        })?;
        match s {
            OK => Ok(()),
            TIMEOUT => Err(self.err(format!("wait {ks:?}: not all set within {timeout:?}"))),
            _ => Err(self.err("wait: unexpected status".into())),
        }
    }

    /// Whether every key is set (no waiting).
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let ks = keys
            .iter()
            .map(|k| self.key(k))
            .collect::<Result<Vec<_>>>()?;
        Ok(self
            .call(Request {
                op: Op::Check,
                keys: ks,
                args: vec![],
                timeout_ms: 0,
            })?
            .1
            == [1])
    }

    /// Add `delta` to the integer at `key` (missing = 0) and return the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let (_, v) = self.call(Request {
            op: Op::Add,
            keys: vec![self.key(key)?],
            args: vec![delta.to_le_bytes().to_vec()],
            timeout_ms: 0,
        })?;
        let b: [u8; 8] = v
            .try_into()
            .map_err(|_| self.err("add: malformed reply".into()))?;
        Ok(i64::from_le_bytes(b))
    }

    /// If `key` holds `expected` (or is missing and `expected` is empty), set it to `desired`.
    /// Returns the value stored afterwards (torch's compare_set).
    pub fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let (s, v) = self.call(Request {
            op: Op::CompareSet,
            keys: vec![self.key(key)?],
            args: vec![expected.to_vec(), desired.to_vec()],
            timeout_ms: 0,
        })?;
        match s {
            OK | MISSING => Ok(v),
            _ => Err(self.err("compare_set: unexpected status".into())),
        }
    }

    /// Delete `key`; whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        Ok(self
            .call(Request {
                op: Op::Delete,
                keys: vec![self.key(key)?],
                args: vec![],
                timeout_ms: 0,
            })?
            .1
            == [1])
    }

    /// Number of keys in the whole store.
    pub fn num_keys(&self) -> Result<u64> {
        let v = self
            .call(Request {
                op: Op::NumKeys,
                keys: vec![],
                args: vec![],
                timeout_ms: 0,
            })?
            .1;
        Ok(u64::from_le_bytes(v.try_into().map_err(|_| {
            self.err("num_keys: malformed reply".into())
        })?))
    }

    /// Store-based barrier among the `n` ranks `0..n` under `name` (each call site a new
    /// name), this one being `rank`. On a timeout the error names the ranks that never came.
    pub fn barrier(&self, name: &str, rank: usize, n: usize, timeout: Duration) -> Result<()> {
        self.set(&format!("{name}/in/{rank}"), b"1")?;
        let arrived = self.add(&format!("{name}/count"), 1)?;
        if arrived as usize == n {
            self.set(&format!("{name}/done"), b"1")?;
        }
        self.wait(&[&format!("{name}/done")], timeout).map_err(|_| {
            let missing: Vec<usize> = (0..n)
                .filter(|r| !self.check(&[&format!("{name}/in/{r}")]).unwrap_or(true))
                .collect();
            self.err(format!(
                "barrier {name:?}: rank{} {} did not arrive within {timeout:?} (stopped, crashed or stuck)",
                if missing.len() == 1 { "" } else { "s" },
                missing
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    /// Say this process is done with the store (counter `name`). The process hosting the
    /// store (`host`) then keeps serving until all `n` have said so, at most `bound`, so it
    /// does not pull the store from under slower processes still finishing a barrier.
    pub fn depart(&self, name: &str, n: usize, host: bool, bound: Duration) -> Result<()> {
        self.add(name, 1)?;
        let deadline = Instant::now() + bound;
        while host && Instant::now() < deadline && (self.add(name, 0)? as usize) < n {
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;

    #[test]
    fn torch_store_semantics() {
        let token = Token::new("t");
        let srv = StoreServer::bind("127.0.0.1:0", &token).unwrap();
        let port = srv.addr().port();
        let a = Store::connect("127.0.0.1", port, &token, Duration::from_secs(5)).unwrap();
        let b = Store::connect("127.0.0.1", port, &token, Duration::from_secs(5))
            .unwrap()
            .with_prefix("x");
        let waiter = {
            let a = a.clone();
            std::thread::spawn(move || a.get("x/late").unwrap())
        };
        std::thread::sleep(Duration::from_millis(50));
        b.set("late", b"hello").unwrap();
        assert_eq!(waiter.join().unwrap(), b"hello");
        assert_eq!(a.add("n", 5).unwrap(), 5);
        assert_eq!(a.add("n", -2).unwrap(), 3);
        assert_eq!(a.compare_set("c", b"", b"1").unwrap(), b"1");
        assert_eq!(a.compare_set("c", b"0", b"2").unwrap(), b"1");
        assert_eq!(a.compare_set("c", b"1", b"2").unwrap(), b"2");
        assert!(a.delete("c").unwrap());
        assert!(!a.delete("c").unwrap());
        assert!(!a.check(&["c"]).unwrap());
        let e = a
            .get_timeout("never", Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not set within"), "{e}");
        let e = a
            .wait(&["never"], Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not all set"), "{e}");
    }

    /// Ranks 0 and 2 of 3 meet at a barrier rank 1 never reaches: rank 0 is told rank 1 is
    /// the one missing. All three: it passes.
    #[test]
    fn a_barrier_names_the_ranks_that_never_came() {
        let token = Token::new("t");
        let srv = StoreServer::bind("127.0.0.1:0", &token).unwrap();
        let port = srv.addr().port();
        // One connection each, as one per process (a connection serves one request at a time).
        let connect = || Store::connect("127.0.0.1", port, &token, Duration::from_secs(5)).unwrap();
        let t = Duration::from_secs(1);
        let other = {
            let s = connect();
            std::thread::spawn(move || s.barrier("b", 2, 3, t))
        };
        // Rank 0 comes once rank 2 is there, however slowly its thread starts.
        let s = connect();
        while !s.check(&["b/in/2"]).unwrap() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let e = s.barrier("b", 0, 3, t).unwrap_err().to_string();
        assert!(e.contains("barrier \"b\": rank 1 did not arrive"), "{e}");
        assert!(other.join().unwrap().is_err());
        let all: Vec<_> = (0..3)
            .map(|r| {
                let s = connect();
                std::thread::spawn(move || s.barrier("c", r, 3, Duration::from_secs(5)))
            })
            .collect();
        for h in all {
            h.join().unwrap().unwrap();
        }
    }

    #[test]
    fn stranger_cannot_use_the_store() {
        let srv = StoreServer::bind("127.0.0.1:0", &Token::new("right")).unwrap();
        let e = Store::connect(
            "127.0.0.1",
            srv.addr().port(),
            &Token::new("wrong"),
            Duration::from_secs(2),
        );
        assert!(matches!(e, Err(CommError::Auth { .. })), "{e:?}");
        let ok = Store::connect(
            "127.0.0.1",
            srv.addr().port(),
            &Token::new("right"),
            Duration::from_secs(2),
        )
        .unwrap();
        ok.set("k", b"v").unwrap();
    }
}
