//! Liveness through the Store, for backends without connections of their own to watch (NCCL
//! today) and for the launchers of an elastic job: each process bumps a counter (`hb/<global
//! rank>`, or a key of its own) every [`HEARTBEAT_EVERY`] (or its own period) from a thread
//! ([`Heartbeat`]); a reader ([`Liveness`]) declares it dead once its counter has not moved
//! for [`HEARTBEAT_DEAD`] (or the reader's bound). To a rank waiting on a collective, a store
//! that cannot be reached counts as rank 0 (or the launcher hosting it) being gone.

use std::collections::HashMap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
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
    /// Dropping it wakes the thread from its wait and ends it.
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Start bumping `hb/<global_rank>` under `store`'s prefix every [`HEARTBEAT_EVERY`]
    /// (give it a connection of its own: the thread holds it).
    pub fn start(store: Store, global_rank: usize) -> Heartbeat {
        Heartbeat::every(store, format!("hb/{global_rank}"), HEARTBEAT_EVERY)
    }

    /// Start bumping `key` under `store`'s prefix every `period`; a failed bump is tried
    /// again next period (a store behind a cut link may come back).
    pub fn every(store: Store, key: String, period: Duration) -> Heartbeat {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("drill-heartbeat".into())
            .spawn(move || {
                loop {
                    let _ = store.add(&key, 1);
                    // The wait is the period, cut short by a stop (the sender dropped).
                    if stopped.recv_timeout(period) != Err(RecvTimeoutError::Timeout) {
                        return;
                    }
                }
            })
            .ok();
        Heartbeat {
            stop: Some(stop),
            thread,
        }
    }

    /// Stop and wait (at most a minute) until the thread has made its last bump.
    #[cfg(test)]
    fn stop(mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !t.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "the heartbeat thread did not stop"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            t.join().ok();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.take();
        // Detached, not joined: a store that no longer answers could hold a join up to the
        // store's timeout; the thread ends after its current request.
        self.thread.take();
    }
}

/// Reads the other processes' heartbeats.
pub struct Liveness {
    store: Store,
    /// Silence after which a heartbeat counts as stopped.
    bound: Duration,
    /// Last counter seen and when it last moved, per key.
    seen: HashMap<String, (i64, Instant)>,
}

impl Liveness {
    /// Watch heartbeats through `store` (the prefix the heartbeats were started under),
    /// declaring one dead after [`HEARTBEAT_DEAD`].
    pub fn new(store: Store) -> Liveness {
        Liveness::with_bound(store, HEARTBEAT_DEAD)
    }

    /// The same with a bound of the caller's.
    pub fn with_bound(store: Store, bound: Duration) -> Liveness {
        Liveness {
            store,
            bound,
            seen: HashMap::new(),
        }
    }

    /// How long the counter at `key` has stood still, once that is past the bound (`None`
    /// while it moves, or before this reader has watched it that long); the store's error
    /// when it cannot be read.
    pub fn silent(&mut self, key: &str) -> crate::Result<Option<Duration>> {
        self.silent_at(key, Instant::now())
    }

    fn silent_at(&mut self, key: &str, now: Instant) -> crate::Result<Option<Duration>> {
        let v = self.store.add(key, 0)?;
        let e = self.seen.entry(key.to_string()).or_insert((v, now));
        if v != e.0 {
            *e = (v, now);
            return Ok(None);
        }
        let silent = now.saturating_duration_since(e.1);
        Ok((silent > self.bound).then_some(silent))
    }

    /// The first of `ranks` whose heartbeat has not moved for the bound, or a store that
    /// cannot be reached (its host, rank 0 or the launcher, is gone).
    pub fn dead(&mut self, ranks: &[usize]) -> Option<(usize, String)> {
        self.dead_at(ranks, Instant::now())
    }

    /// [`Liveness::dead`] as read at `now`: the counters are read from the store, the
    /// silence measured against `now`, so the rule is testable without racing a clock.
    fn dead_at(&mut self, ranks: &[usize], now: Instant) -> Option<(usize, String)> {
        for &r in ranks {
            match self.silent_at(&format!("hb/{r}"), now) {
                Ok(None) => {}
                Ok(Some(silent)) => return Some((r, format!("no heartbeat for {silent:?}"))),
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

    fn store() -> (StoreServer, impl Fn() -> Store) {
        let token = Token::new("hb");
        let srv = StoreServer::bind("127.0.0.1:0", &token).unwrap();
        let port = srv.addr().port();
        let connect = move || {
            Store::connect("127.0.0.1", port, &token, Duration::from_secs(30))
                .unwrap()
                .with_prefix("job")
        };
        (srv, connect)
    }

    /// The rule on a clock the test sets: a counter that moves is alive however long between
    /// reads; one that stands still is dead once, and only once, it has stood for longer
    /// than the bound. No thread is scheduled, so a slow or loaded machine cannot change it.
    #[test]
    fn a_rank_is_dead_once_its_counter_stands_past_the_bound_and_not_before() {
        let (_srv, connect) = store();
        let beats = connect();
        let mut live = Liveness::new(connect());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        beats.add("hb/0", 1).unwrap();
        beats.add("hb/1", 1).unwrap();
        assert_eq!(live.dead_at(&[0, 1], at(0)), None);
        // Rank 0 beats between every read; rank 1 never again.
        let bound = HEARTBEAT_DEAD.as_millis() as u64;
        for ms in (250..=bound).step_by(250) {
            beats.add("hb/0", 1).unwrap();
            assert_eq!(live.dead_at(&[0, 1], at(ms)), None, "dead at {ms} ms");
        }
        // Exactly at the bound rank 1 is still alive; just past it, it is dead, by number.
        beats.add("hb/0", 1).unwrap();
        let found = live
            .dead_at(&[0, 1], at(bound + 1))
            .expect("rank 1 not found dead");
        assert_eq!(found.0, 1, "{found:?}");
        assert!(found.1.contains("no heartbeat for 3.001s"), "{found:?}");
        // A rank that beats again after a long read gap is alive: the gap is the reader's.
        beats.add("hb/1", 1).unwrap();
        beats.add("hb/0", 1).unwrap();
        assert_eq!(live.dead_at(&[0, 1], at(bound * 10)), None);
    }

    /// The thread: it bumps its counter (waited for, not timed), and once stopped it never
    /// bumps again.
    #[test]
    fn a_heartbeat_bumps_its_counter_until_stopped() {
        let (_srv, connect) = store();
        let probe = connect();
        let beat = Heartbeat::start(connect(), 3);
        let deadline = Instant::now() + Duration::from_secs(120);
        while probe.add("hb/3", 0).unwrap() < 3 {
            assert!(
                Instant::now() < deadline,
                "the heartbeat never bumped 3 times"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        beat.stop();
        let last = probe.add("hb/3", 0).unwrap();
        std::thread::sleep(HEARTBEAT_EVERY * 3);
        assert_eq!(
            probe.add("hb/3", 0).unwrap(),
            last,
            "bumped after it stopped"
        );
    }

    /// A heartbeat under a key of its own, read with a bound of the reader's (an elastic
    /// job's launchers): silent once, and only once, its counter has stood past that bound.
    #[test]
    fn a_named_heartbeat_is_silent_past_the_readers_bound() {
        let (_srv, connect) = store();
        let beats = connect();
        let mut live = Liveness::with_bound(connect(), Duration::from_millis(800));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        beats.add("hb/host-a:1", 1).unwrap();
        assert_eq!(live.silent_at("hb/host-a:1", at(0)).unwrap(), None);
        assert_eq!(live.silent_at("hb/host-a:1", at(800)).unwrap(), None);
        let silent = live.silent_at("hb/host-a:1", at(801)).unwrap();
        assert_eq!(silent, Some(Duration::from_millis(801)));
        beats.add("hb/host-a:1", 1).unwrap();
        assert_eq!(live.silent_at("hb/host-a:1", at(5000)).unwrap(), None);
        // The thread bumps the key it was given, at its own period.
        let beat = Heartbeat::every(connect(), "hb/host-b:2".into(), Duration::from_millis(10));
        let deadline = Instant::now() + Duration::from_secs(120);
        while beats.add("hb/host-b:2", 0).unwrap() < 3 {
            assert!(Instant::now() < deadline, "never bumped 3 times");
            std::thread::sleep(Duration::from_millis(5));
        }
        beat.stop();
    }
}
