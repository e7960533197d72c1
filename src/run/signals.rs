//! SIGTERM and SIGINT (signal-hook): the first asks the running backup or restore to stop
//! gracefully (reading stops, held messages go back, the current segment and checkpoint are
//! finished); the second ends the process at once, with the same exit code.
//!
//! Exit codes follow the shell convention 128 + signal number: 143 after SIGTERM, 130 after
//! SIGINT (README "Exit codes"). The jobs poll [`requested`] where they already poll for a stop.

use crate::error::{Error, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

struct Flags {
    /// Set by the first signal; arms the immediate exit of the second.
    stop: Arc<AtomicBool>,
    /// The number of the signal received last.
    which: Arc<AtomicUsize>,
}

static FLAGS: OnceLock<Flags> = OnceLock::new();

/// Installs the handlers (once per process; later calls do nothing).
///
/// Errors: `IO error: cannot install the signal handlers: ...`.
pub fn install() -> Result<()> {
    if FLAGS.get().is_some() {
        return Ok(());
    }
    let flags = Flags {
        stop: Arc::new(AtomicBool::new(false)),
        which: Arc::new(AtomicUsize::new(0)),
    };
    let err = |e: std::io::Error| Error::Io(format!("cannot install the signal handlers: {e}"));
    for sig in [SIGTERM, SIGINT] {
        // Registered first, so it sees the flag as the previous signal left it: a second
        // signal exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, flags.stop.clone())
            .map_err(err)?;
        signal_hook::flag::register_usize(sig, flags.which.clone(), sig as usize).map_err(err)?;
        signal_hook::flag::register(sig, flags.stop.clone()).map_err(err)?;
    }
    let _ = FLAGS.set(flags);
    Ok(())
}

/// The signal that asked the job to stop (`SIGTERM` = 15, `SIGINT` = 2), if one did.
pub fn requested() -> Option<i32> {
    let flags = FLAGS.get()?;
    if flags.stop.load(Ordering::Relaxed) {
        Some(flags.which.load(Ordering::Relaxed) as i32)
    } else {
        None
    }
}

/// `SIGTERM`, `SIGINT`, or `signal <n>`.
pub fn name(sig: i32) -> String {
    match sig {
        SIGTERM => "SIGTERM".into(),
        SIGINT => "SIGINT".into(),
        n => format!("signal {n}"),
    }
}

/// The exit code after `sig`: 128 + its number.
pub fn exit_code(sig: i32) -> i32 {
    128 + sig
}

/// `Some(reason)` once a stop was requested: what a job's `should_stop` returns.
pub fn stop_reason(job: &str) -> Option<String> {
    requested().map(|sig| {
        format!(
            "interrupted by {}: {job} stopped; run the same command again to finish it",
            name(sig)
        )
    })
}
