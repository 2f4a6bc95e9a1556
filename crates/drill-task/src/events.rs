//! [`EventBus`]: `emit` / `on` / `once` / `off` / `wait_for` inside a process. Payloads are any
//! serde value, encoded compactly (postcard) so the same events can cross processes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::Duration;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::TaskError;

/// One emitted event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its name (`learn_output`, `finish`, ...).
    pub name: String,
    /// The encoded payload.
    pub payload: Vec<u8>,
}

impl Event {
    /// Decode the payload as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, TaskError> {
        postcard::from_bytes(&self.payload).map_err(|e| TaskError::Payload {
            event: self.name.clone(),
            detail: e.to_string(),
        })
    }
}

/// A registered handler, to remove it with [`EventBus::off`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandlerId(u64);

type Handler = Arc<dyn Fn(&Event) + Send + Sync>;

struct Entry {
    id: u64,
    once: bool,
    f: Handler,
}

/// Named events with handlers; cheap to clone (clones share handlers). Under the Parallel
/// runner, emitted events also go to the other processes and theirs arrive here.
#[derive(Clone, Default)]
pub struct EventBus {
    handlers: Arc<Mutex<HashMap<String, Vec<Entry>>>>,
    next: Arc<AtomicU64>,
    /// Sends emitted events to other processes.
    remote: Arc<RwLock<Option<Handler>>>,
    /// Set when a peer process is lost: waits fail instead of hanging.
    lost: Arc<Mutex<Option<String>>>,
}

impl EventBus {
    /// Call `f` on every later `name` event (in the emitter's thread, in registration order).
    pub fn on(&self, name: &str, f: impl Fn(&Event) + Send + Sync + 'static) -> HandlerId {
        self.add(name, false, Arc::new(f))
    }

    /// Call `f` on the next `name` event only.
    pub fn once(&self, name: &str, f: impl Fn(&Event) + Send + Sync + 'static) -> HandlerId {
        self.add(name, true, Arc::new(f))
    }

    fn add(&self, name: &str, once: bool, f: Handler) -> HandlerId {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .entry(name.to_string())
            .or_default()
            .push(Entry { id, once, f });
        HandlerId(id)
    }

    /// Remove one handler; true if it was registered.
    pub fn off(&self, id: HandlerId) -> bool {
        let mut h = self.lock();
        for list in h.values_mut() {
            if let Some(k) = list.iter().position(|e| e.id == id.0) {
                list.remove(k);
                return true;
            }
        }
        false
    }

    /// Remove every handler of `name`.
    pub fn off_all(&self, name: &str) {
        self.lock().remove(name);
    }

    /// Emit `name` with `payload` to this process's handlers and, under the Parallel
    /// runner, to the other processes.
    pub fn emit<T: Serialize + ?Sized>(&self, name: &str, payload: &T) -> Result<(), TaskError> {
        let payload = postcard::to_allocvec(payload).map_err(|e| TaskError::Payload {
            event: name.to_string(),
            detail: e.to_string(),
        })?;
        let event = Event {
            name: name.to_string(),
            payload,
        };
        self.deliver(&event);
        if let Some(send) = self
            .remote
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            send(&event);
        }
        Ok(())
    }

    /// Send emitted events to other processes through `send` (the Parallel runner's router).
    pub fn set_remote(&self, send: impl Fn(&Event) + Send + Sync + 'static) {
        *self.remote.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(send));
    }

    /// A peer process is gone: every current and later [`Self::wait_for`] fails with `why`.
    pub fn fail(&self, why: String) {
        self.lost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
    }

    /// Why a peer was lost, if one was.
    pub fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Run the handlers of `event` (handlers run outside the lock: they may emit or register).
    pub fn deliver(&self, event: &Event) {
        let todo: Vec<Handler> = {
            let mut h = self.lock();
            let Some(list) = h.get_mut(&event.name) else {
                return;
            };
            let todo = list.iter().map(|e| e.f.clone()).collect();
            list.retain(|e| !e.once);
            todo
        };
        for f in todo {
            f(event);
        }
    }

    /// Block until the next `name` event (emitted after this call) or fail after `timeout`,
    /// or as soon as a peer process is lost.
    pub fn wait_for(&self, name: &str, timeout: Duration) -> Result<Event, TaskError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let id = self.once(name, move |e| {
            let _ = tx.try_send(e.clone());
        });
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(why) = self.lost() {
                self.off(id);
                return Err(TaskError::PeerLost {
                    event: name.to_string(),
                    detail: why,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(10))) {
                Ok(e) => return Ok(e),
                Err(_) if left.is_zero() => {
                    self.off(id);
                    return Err(TaskError::Timeout {
                        event: name.to_string(),
                        timeout,
                    });
                }
                Err(_) => {}
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Entry>>> {
        self.handlers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn on_once_off_and_wait_for() {
        let bus = EventBus::default();
        let seen = Arc::new(AtomicUsize::new(0));
        let (a, b) = (seen.clone(), seen.clone());
        let every = bus.on("x", move |e| {
            a.fetch_add(e.decode::<u32>().unwrap() as usize, Ordering::SeqCst);
        });
        bus.once("x", move |_| {
            b.fetch_add(100, Ordering::SeqCst);
        });
        bus.emit("x", &1u32).unwrap();
        bus.emit("x", &2u32).unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 103, "once ran once");
        assert!(bus.off(every));
        assert!(!bus.off(every));
        bus.emit("x", &5u32).unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 103, "off removed it");

        let t = std::time::Instant::now();
        let e = bus
            .wait_for("never", Duration::from_millis(50))
            .unwrap_err();
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert!(e.to_string().contains("never"), "{e}");

        let bus2 = bus.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            bus2.emit("learn_output", &(7u64, "ok".to_string()))
                .unwrap();
        });
        let e = bus
            .wait_for("learn_output", Duration::from_secs(5))
            .unwrap();
        assert_eq!(e.decode::<(u64, String)>().unwrap(), (7, "ok".into()));
        h.join().unwrap();
    }
}
