//! The store server: one accept thread, one thread per authenticated client, state under a
//! mutex with a condition variable for blocking reads.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::proto::{self, MISSING, OK, Op, Request, TIMEOUT};
use crate::auth::{self, Token};
use crate::error::{CommError, Result};

/// Most connections that may be mid-handshake at once; strangers beyond it are dropped.
const MAX_PENDING: usize = 64;

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

/// A running store server; stops accepting when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

/// How often the accept loop checks whether the server is stopping.
const ACCEPT_POLL: Duration = Duration::from_millis(10);

impl StoreServer {
    /// Bind `addr` (port 0 picks one) and serve clients that know `token`.
    pub fn bind(addr: &str, token: &Token) -> Result<StoreServer> {
        let listener =
            TcpListener::bind(addr).map_err(|e| CommError::io(format!("store: bind {addr}"), e))?;
        Self::serve(listener, token)
    }

    /// Serve on an already-bound listener.
    pub fn serve(listener: TcpListener, token: &Token) -> Result<StoreServer> {
        let addr = listener
            .local_addr()
            .map_err(|e| CommError::io("store: local address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State::default());
        let token = token.clone();
        let stop2 = stop.clone();
        let pending = Arc::new(AtomicUsize::new(0));
        // Accepting polls the stop flag: a wake-up connection can be lost (a lossy network
        // drops its SYN), and then a blocking accept would keep the server, and the launcher
        // that drops it, alive forever.
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::io("store: listen", e))?;
        let accept = std::thread::Builder::new()
            .name("drill-store".into())
            .spawn(move || {
                loop {
                    if stop2.load(Ordering::Acquire) {
                        break;
                    }
                    let stream = match listener.accept() {
                        Ok((stream, _)) => stream,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(ACCEPT_POLL);
                            continue;
                        }
                        Err(_) => continue,
                    };
                    if stream.set_nonblocking(false).is_err() {
                        continue;
                    }
                    if pending.load(Ordering::Acquire) >= MAX_PENDING {
                        continue;
                    }
                    pending.fetch_add(1, Ordering::AcqRel);
                    let (state, token, pending) = (state.clone(), token.clone(), pending.clone());
                    let _ = std::thread::Builder::new()
                        .name("drill-store-conn".into())
                        .spawn(move || {
                            let mut stream = stream;
                            let ok = auth::accept(&mut stream, &token);
                            pending.fetch_sub(1, Ordering::AcqRel);
                            match ok {
                                Ok(_) => serve_client(stream, &state),
                                Err(e) => tracing::warn!("store: dropped a connection: {e}"),
                            }
                        });
                }
            })
            .map_err(|e| CommError::io("store: spawn accept thread", e))?;
        Ok(StoreServer {
            addr,
            stop,
            accept: Some(accept),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // The accept loop sees the flag within ACCEPT_POLL.
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve_client(stream: TcpStream, state: &State) {
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut r = BufReader::new(read_half);
    let mut w = BufWriter::new(stream);
    loop {
        let req = match Request::decode(&mut r) {
            Ok(req) => req,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    tracing::warn!("store: dropped a client after a bad request: {e}");
                }
                return;
            }
        };
        let (status, value) = handle(req, state);
        if proto::write_response(&mut w, status, &value)
            .and_then(|_| w.flush())
            .is_err()
        {
            return;
        }
    }
}

fn handle(mut req: Request, state: &State) -> (u8, Vec<u8>) {
    let mut map = state.map.lock().unwrap_or_else(|p| p.into_inner());
    let deadline = Instant::now() + Duration::from_millis(req.timeout_ms);
    match req.op {
        Op::Set => {
            map.insert(req.keys.remove(0), req.args.remove(0));
            state.changed.notify_all();
            (OK, vec![])
        }
        Op::Get | Op::Wait => loop {
            if req.keys.iter().all(|k| map.contains_key(k)) {
                let v = if req.op == Op::Get {
                    map[&req.keys[0]].clone()
                } else {
                    vec![]
                };
                return (OK, v);
            }
            let now = Instant::now();
            if now >= deadline {
                return (TIMEOUT, vec![]);
            }
            map = state
                .changed
                .wait_timeout(map, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        },
        Op::Add => {
            let inc = i64::from_le_bytes(req.args[0][..8].try_into().unwrap());
            let cur = map
                .get(&req.keys[0])
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                .unwrap_or(0);
            let new = cur.wrapping_add(inc);
            map.insert(req.keys.remove(0), new.to_string().into_bytes());
            state.changed.notify_all();
            (OK, new.to_le_bytes().to_vec())
        }
        Op::CompareSet => {
            let desired = req.args.pop().unwrap();
            let expected = req.args.pop().unwrap();
            let key = req.keys.remove(0);
            match map.get(&key) {
                None if expected.is_empty() => {
                    map.insert(key, desired.clone());
                    state.changed.notify_all();
                    (OK, desired)
                }
                None => (MISSING, expected),
                Some(cur) if *cur == expected => {
                    map.insert(key, desired.clone());
                    state.changed.notify_all();
                    (OK, desired)
                }
                Some(cur) => (OK, cur.clone()),
            }
        }
        Op::Delete => {
            let had = map.remove(&req.keys[0]).is_some();
            (OK, vec![had as u8])
        }
        Op::Check => (OK, vec![req.keys.iter().all(|k| map.contains_key(k)) as u8]),
        Op::NumKeys => (OK, (map.len() as u64).to_le_bytes().to_vec()),
    }
}
