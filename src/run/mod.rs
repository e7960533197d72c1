//! What one run of the process shares, whatever its job: logging (`logging`), progress bars
//! (`progress`), signals (`signals`) and human units (`units`).

pub mod logging;
pub mod progress;
pub mod signals;
pub mod units;

/// Writes `args` to stdout, ignoring a reader that closed it ([`crate::out!`]); any other
/// write error is logged at debug level (there is nowhere else to say it).
pub fn write_stdout(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        log::debug!("stdout: {e}");
    }
}
