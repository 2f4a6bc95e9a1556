//! Ctrl-C and SIGTERM during training: the first asks the run to stop after its current step
//! (the termination checker sees [`requested`], every rank stops at the same step, `final`
//! and `result.json` are written); a second one exits at once with status 130.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Install the handlers for SIGINT and SIGTERM (once per process; later calls do nothing).
pub fn install() -> std::io::Result<()> {
    if FLAG.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registered first, so it sees the flag as the previous signal left it: set means
        // this is the second signal.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&flag))?;
        signal_hook::flag::register(sig, Arc::clone(&flag))?;
    }
    let _ = FLAG.set(flag);
    Ok(())
}

/// Whether a signal asked the run to stop.
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::SeqCst))
}
