//! Liveness through the Store, for backends without connections of their own to watch (NCCL
//! today): each process bumps a counter `hb/<global rank>` every [`HEARTBEAT_EVERY`] from a
//! thread ([`Heartbeat`]); a waiting operation reads the others' counters ([`Liveness`]) and
//! declares a rank dead once its counter has not moved for [`HEARTBEAT_DEAD`]. A store that
//! cannot be reached counts as rank 0 (or the launcher hosting it) being gone.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::Store;

/// How often each process bumps its heartbeat counter: drill's one heartbeat period, also
/// that of the embedded backend's control connections and of a split run's links.
pub const HEARTBEAT_EVERY: Duration = Duration::from_millis(500);
/// A heartbeat that has not moved for this long marks its rank dead: drill's one default
/// silence bound, also the embedded backend's and a split run's.
pub const HEARTBEAT_DEAD: Duration = Duration::from_secs(3);

/// Bumps this process's heartbeat counter in the Store until dropped.
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Start bumping `hb/<global_rank>` under `store`'s prefix (give it a connection of its
    /// own: the thread holds it).
    pub fn start(store: Store, global_rank: usize) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let key = format!("hb/{global_rank}");
        std::thread::Builder::new()
            .name("drill-heartbeat".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    if store.add(&key, 1).is_err() {
                        return;
                    }
                    std::thread::sleep(HEARTBEAT_EVERY);
                }
            })
            .ok();
        Heartbeat { stop }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads the other ranks' heartbeats while an operation waits.
pub struct Liveness {
    store: Store,
    /// Last counter seen and when it last moved, per global rank.
    seen: HashMap<usize, (i64, Instant)>,
}

impl Liveness {
    /// Watch heartbeats through `store` (the prefix the heartbeats were started under).
    pub fn new(store: Store) -> Liveness {
        Liveness {
            store,
            seen: HashMap::new(),
        }
    }

    /// The first of `ranks` whose heartbeat has not moved for [`HEARTBEAT_DEAD`], or a store
    /// that cannot be reached (its host, rank 0 or the launcher, is gone).
    pub fn dead(&mut self, ranks: &[usize]) -> Option<(usize, String)> {
        let now = Instant::now();
        for &r in ranks {
            match self.store.add(&format!("hb/{r}"), 0) {
                Ok(v) => {
                    let e = self.seen.entry(r).or_insert((v, now));
                    if v != e.0 {
                        *e = (v, now);
                    } else if now - e.1 > HEARTBEAT_DEAD {
                        return Some((r, format!("no heartbeat for {:?}", now - e.1)));
                    }
                }
                Err(e) => return Some((0, format!("the store is unreachable: {e}"))),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Token;
    use crate::store::StoreServer;

    #[test]
    fn a_stopped_heartbeat_marks_its_rank_dead_and_a_running_one_does_not() {
        let token = Token::new(Some("hb"));
        let srv = StoreServer::bind("127.0.0.1:0", &token).unwrap();
        let port = srv.addr().port();
        let connect = || {
            Store::connect("127.0.0.1", port, &token, Duration::from_secs(5))
                .unwrap()
                .with_prefix("job")
        };
        let alive = Heartbeat::start(connect(), 0);
        let stops = Heartbeat::start(connect(), 1);
        let mut live = Liveness::new(connect());
        // Both running: never dead over a window longer than the silence bound, polled the
        // way a waiting operation polls.
        let start = Instant::now();
        while start.elapsed() < HEARTBEAT_DEAD + HEARTBEAT_EVERY {
            assert_eq!(
                live.dead(&[0, 1]),
                None,
                "a running heartbeat was called dead"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(stops);
        let start = Instant::now();
        let found = loop {
            if let Some(d) = live.dead(&[0, 1]) {
                break d;
            }
            assert!(
                start.elapsed() < HEARTBEAT_DEAD * 3,
                "rank 1 never found dead"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(found.0, 1, "{found:?}");
        assert!(found.1.contains("no heartbeat"), "{found:?}");
        drop(alive);
    }
}
