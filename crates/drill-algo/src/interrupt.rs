//! Ctrl-C and SIGTERM during training: the first asks the run to stop after its current step
//! (the termination checker sees `requested`, every rank stops at the same step, `final`
//! and `result.json` are written); a second one exits at once with status 130.
//!
//! A command installs the handlers for good ([`install`]); a host process that trains now
//! and then (Python's `drill.train`) holds them only while it trains ([`scope`]), so that
//! its own Ctrl-C handling comes back afterwards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use signal_hook::SigId;

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// The handlers registered, while they are.
static HANDLERS: Mutex<Vec<SigId>> = Mutex::new(Vec::new());

fn flag() -> &'static Arc<AtomicBool> {
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Install the handlers for SIGINT and SIGTERM for the rest of the process (later calls do
/// nothing).
pub fn install() -> std::io::Result<()> {
    let mut handlers = HANDLERS.lock().unwrap_or_else(|p| p.into_inner());
    if !handlers.is_empty() {
        return Ok(());
    }
    let flag = flag();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as the previous signal left it: set means
        // this is the second signal.
        handlers.push(signal_hook::flag::register_conditional_shutdown(
            sig,
            130,
            Arc::clone(flag),
        )?);
        handlers.push(signal_hook::flag::register(sig, Arc::clone(flag))?);
    }
    Ok(())
}

/// The handlers, installed until this is dropped (unless [`install`] keeps them).
pub struct Scope {
    owned: bool,
}

/// Install the handlers until the returned [`Scope`] is dropped, with no stop requested; the
/// handlers that were there before (a host interpreter's) still run on each signal.
pub fn scope() -> std::io::Result<Scope> {
    let owned = HANDLERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty();
    install()?;
    clear();
    Ok(Scope { owned })
}

impl Drop for Scope {
    fn drop(&mut self) {
        if self.owned {
            for id in HANDLERS.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                signal_hook::low_level::unregister(id);
            }
            clear();
        }
    }
}

/// Forget an earlier request.
fn clear() {
    flag().store(false, Ordering::SeqCst);
}

/// Whether a signal asked the run to stop.
pub(crate) fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::SeqCst))
}
