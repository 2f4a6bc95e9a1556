//! Events through Redis pub/sub (DI-engine's `mq_type = "redis"`), for deployments where the
//! workers cannot reach each other directly but all reach one Redis server. Every worker
//! hears every other (pub/sub has no topology). Rendezvous and barriers still use the run's
//! store; Redis carries only events.
//!
//! Pub/sub delivers in order per publisher but tells nobody when a publisher dies, so each
//! worker publishes a heartbeat every [`HEARTBEAT`]; a peer silent for [`LOST_AFTER`] without
//! saying goodbye is lost, and waits on it fail (as a closed TCP link does). Protect the
//! channel with Redis's own AUTH / ACLs (`redis://user:password@host:port`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Commands;
use serde::{Deserialize, Serialize};

use crate::error::TaskError;
use crate::events::{Event, EventBus};

/// How often a worker says it is alive.
pub const HEARTBEAT: Duration = drill_comm::store::HEARTBEAT_EVERY;
/// Silence after which a peer is lost.
pub const LOST_AFTER: Duration = drill_comm::store::HEARTBEAT_DEAD;

#[derive(Serialize, Deserialize)]
pub(crate) enum Kind {
    Event { name: String, payload: Vec<u8> },
    Heartbeat,
    Bye,
}

/// What goes over the channel (postcard).
#[derive(Serialize, Deserialize)]
pub(crate) struct Frame {
    pub(crate) from: u32,
    pub(crate) kind: Kind,
}

/// This worker's connection to the Redis channel of its run.
pub struct RedisLink {
    publisher: Arc<Mutex<redis::Connection>>,
    channel: String,
    node: usize,
    stop: Arc<AtomicBool>,
    armed: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn err(detail: impl std::fmt::Display) -> TaskError {
    TaskError::msg(format!("redis: {detail}"))
}

fn publish(con: &Mutex<redis::Connection>, channel: &str, frame: &Frame) -> Result<(), TaskError> {
    let bytes = postcard::to_allocvec(frame).map_err(err)?;
    let mut con = con.lock().unwrap_or_else(|p| p.into_inner());
    con.publish::<_, _, ()>(channel, bytes).map_err(err)
}

/// The environment variable that holds the Redis password (never the URL: it is written
/// to config.toml and the workers' command lines).
pub const PASSWORD_VAR: &str = "DRILL_REDIS_PASSWORD";

/// A client for `url` with the password from [`PASSWORD_VAR`]; errors never show the URL's
/// user part.
fn open(url: &str) -> Result<redis::Client, TaskError> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info().map_err(|e| {
        err(format!(
            "the Redis URL is not valid ({}): expected redis://[user@]host:port",
            e.category()
        ))
    })?;
    let info = match std::env::var(PASSWORD_VAR) {
        Ok(p) if !p.is_empty() => {
            let settings = info.redis_settings().clone().set_password(p);
            info.set_redis_settings(settings)
        }
        _ => info,
    };
    redis::Client::open(info).map_err(|e| err(format!("Redis client: {}", e.category())))
}

impl RedisLink {
    /// Subscribe node `node` of `n` to `channel` on the server at `url` and route `bus`'s
    /// emitted events through it. Returns once subscribed: make the run's barrier after it.
    pub fn connect(
        url: &str,
        channel: &str,
        node: usize,
        n: usize,
        bus: &EventBus,
    ) -> Result<RedisLink, TaskError> {
        let client = open(url)?;
        let at = client.get_connection_info().addr().to_string();
        let connect = || {
            client
                .get_connection_with_timeout(Duration::from_secs(5))
                .map_err(|e| err(format!("cannot reach the Redis server at {at}: {e}")))
        };
        let mut sub = connect()?;
        let publisher = Arc::new(Mutex::new(connect()?));
        let stop = Arc::new(AtomicBool::new(false));
        let armed = Arc::new(AtomicBool::new(false));
        let last_seen: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; n]));
        let gone = Arc::new(Mutex::new(vec![false; n]));
        // Subscribed before returning, so no event published after the barrier is missed.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let reader = {
            let (bus, stop, seen, gone) =
                (bus.clone(), stop.clone(), last_seen.clone(), gone.clone());
            let channel = channel.to_string();
            std::thread::spawn(move || {
                let mut ps = sub.as_pubsub();
                let ok = ps
                    .subscribe(&channel)
                    .and_then(|_| ps.set_read_timeout(Some(Duration::from_millis(50))));
                let _ = ready_tx.send(ok.map_err(|e| e.to_string()));
                while !stop.load(Ordering::SeqCst) {
                    let msg = match ps.get_message() {
                        Ok(m) => m,
                        Err(e) if e.is_timeout() => continue,
                        Err(e) => {
                            if !stop.load(Ordering::SeqCst) {
                                bus.fail(format!("redis: the subscription ended: {e}"));
                            }
                            return;
                        }
                    };
                    let Ok(frame) = postcard::from_bytes::<Frame>(msg.get_payload_bytes()) else {
                        tracing::warn!("redis: ignoring a message that is not a drill frame");
                        continue;
                    };
                    let from = frame.from as usize;
                    if from == node || from >= n {
                        continue;
                    }
                    seen.lock().unwrap_or_else(|p| p.into_inner())[from] = Some(Instant::now());
                    match frame.kind {
                        Kind::Event { name, payload } => bus.deliver(&Event { name, payload }),
                        Kind::Heartbeat => {}
                        Kind::Bye => gone.lock().unwrap_or_else(|p| p.into_inner())[from] = true,
                    }
                }
            })
        };
        ready_rx
            .recv()
            .map_err(|_| err("the subscriber thread ended"))?
            .map_err(|e| err(format!("subscribe {channel}: {e}")))?;
        let watcher = {
            let (bus, stop, seen, gone) = (bus.clone(), stop.clone(), last_seen, gone);
            let (publisher, channel, armed) =
                (publisher.clone(), channel.to_string(), armed.clone());
            std::thread::spawn(move || {
                let mut start = None;
                while !stop.load(Ordering::SeqCst) {
                    let beat = Frame {
                        from: node as u32,
                        kind: Kind::Heartbeat,
                    };
                    if let Err(e) = publish(&publisher, &channel, &beat) {
                        bus.fail(e.to_string());
                        return;
                    }
                    if !armed.load(Ordering::SeqCst) {
                        std::thread::sleep(HEARTBEAT);
                        continue;
                    }
                    let start = *start.get_or_insert_with(Instant::now);
                    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let gone = gone.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    for (peer, at) in seen.iter().enumerate() {
                        if peer == node || gone[peer] {
                            continue;
                        }
                        // A peer never heard from gets LOST_AFTER from the arming.
                        let silent = at.map_or(start.elapsed(), |t| t.elapsed());
                        if silent > LOST_AFTER {
                            bus.fail(format!(
                                "node {peer} sent no heartbeat through redis for {:.1} s",
                                silent.as_secs_f64()
                            ));
                        }
                    }
                    std::thread::sleep(HEARTBEAT);
                }
            })
        };
        let (p, ch) = (publisher.clone(), channel.to_string());
        let b = bus.clone();
        bus.set_remote(move |e: &Event| {
            let frame = Frame {
                from: node as u32,
                kind: Kind::Event {
                    name: e.name.clone(),
                    payload: e.payload.clone(),
                },
            };
            if let Err(e) = publish(&p, &ch, &frame) {
                b.fail(e.to_string());
            }
        });
        Ok(RedisLink {
            publisher,
            channel: channel.to_string(),
            node,
            stop,
            armed,
            threads: vec![reader, watcher],
        })
    }

    /// Start watching the peers' heartbeats (once every worker is connected).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Say goodbye (so the others do not take this worker for lost) and stop.
    pub fn close(self) {
        let bye = Frame {
            from: self.node as u32,
            kind: Kind::Bye,
        };
        let _ = publish(&self.publisher, &self.channel, &bye);
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}
