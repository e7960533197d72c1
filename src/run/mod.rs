//! What one run of the process shares, whatever its job: logging (`logging`), progress bars
//! (`progress`), signals (`signals`) and human units (`units`).

pub mod logging;
pub mod progress;
pub mod signals;
pub mod units;
