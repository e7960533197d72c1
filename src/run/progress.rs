//! Progress of `backup` and `restore` for a person at a terminal, drawn by `indicatif`: a total
//! bar (queues done, messages, bytes, rate, ETA) and one bar per queue in work, on stderr.
//!
//! Shown only when stderr is a terminal ([`std::io::IsTerminal`]) and the log level is below
//! trace (trace output would scroll it away); scripts and log files never see it. Log lines
//! written while it is shown go through [`LogWriter`], which hides the bars while it writes
//! (`MultiProgress::suspend`), so the two never mix. The job's final summary line is printed by
//! the command line either way.
//!
//! The counts are the jobs' own counters (`crate::metrics`), copied into the bars by a thread of
//! this module 4 times a second: the hot path does nothing for the display.

use crate::metrics::Counter;
use crate::run::units::{human_bytes, thousands};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Time between two copies of the counters into the bars.
const TICK: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The board shown now, if any: the log writer and the rows find it here.
static BOARD: Mutex<Option<Arc<Board>>> = Mutex::new(None);

/// One queue's bar and the counters it shows.
struct Row {
    bar: ProgressBar,
    messages: Counter,
    bytes: Counter,
}

struct Board {
    multi: MultiProgress,
    total: ProgressBar,
    queues: usize,
    rows: Mutex<Vec<Arc<Row>>>,
    /// Messages and bytes of the rows already finished.
    finished: Mutex<(usize, u64, u64)>,
}

/// `{prefix}` bar with `{msg}` (bytes and queue counts) and indicatif's rate and ETA; a spinner
/// when the total is unknown (0).
fn style(total: u64) -> ProgressStyle {
    let template = if total == 0 {
        "{prefix}: {spinner} {human_pos} messages, {msg}, {per_sec}, {elapsed}"
    } else {
        "{prefix}: [{bar:25}] {human_pos}/{human_len} messages ({percent}%), {msg}, {per_sec}, ETA {eta}"
    };
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

fn bar(multi: &MultiProgress, total: u64, prefix: String) -> ProgressBar {
    let bar = multi.add(ProgressBar::new(total));
    bar.set_style(style(total));
    bar.set_prefix(prefix);
    bar.set_message(human_bytes(0));
    bar
}

impl Board {
    fn new(target: ProgressDrawTarget, title: &str, queues: usize, total: u64) -> Board {
        let multi = MultiProgress::with_draw_target(target);
        let total = bar(&multi, total, title.to_string());
        Board {
            multi,
            total,
            queues,
            rows: Mutex::new(Vec::new()),
            finished: Mutex::new((0, 0, 0)),
        }
    }

    /// Copies the counters into the bars.
    fn refresh(&self) {
        let (done, mut messages, mut bytes) = *lock(&self.finished);
        for r in lock(&self.rows).iter() {
            let (m, b) = (r.messages.get(), r.bytes.get());
            r.bar.set_position(m);
            r.bar.set_message(human_bytes(b));
            messages += m;
            bytes += b;
        }
        self.total.set_position(messages);
        self.total.set_message(format!(
            "{}, {done}/{} queues",
            human_bytes(bytes),
            thousands(self.queues as u64)
        ));
    }

    /// Takes a finished row off the board; its counts stay in the total.
    fn finish(&self, row: &Arc<Row>) {
        let mut rows = lock(&self.rows);
        rows.retain(|r| !Arc::ptr_eq(r, row));
        let mut f = lock(&self.finished);
        f.0 += 1;
        f.1 += row.messages.get();
        f.2 += row.bytes.get();
        row.bar.finish_and_clear();
        self.multi.remove(&row.bar);
    }
}

/// Shows the board until dropped; then erases it.
pub struct Display {
    stop: Option<crossbeam_channel::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts the board for a job of `queues` queues and `total` messages (0 = unknown), titled
/// e.g. `backup nightly`. `None` when stderr is not a terminal or the log level is trace.
pub fn start(title: &str, queues: usize, total: u64) -> Option<Display> {
    if !std::io::stderr().is_terminal() || log::max_level() >= log::LevelFilter::Trace {
        return None;
    }
    let board = Arc::new(Board::new(
        ProgressDrawTarget::stderr_with_hz(4),
        title,
        queues,
        total,
    ));
    *lock(&BOARD) = Some(board.clone());
    let (tx, rx) = crossbeam_channel::bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || loop {
            board.refresh();
            if !matches!(
                rx.recv_timeout(TICK),
                Err(crossbeam_channel::RecvTimeoutError::Timeout)
            ) {
                board.total.finish_and_clear();
                let _ = board.multi.clear();
                break;
            }
        })
        .ok()?;
    Some(Display {
        stop: Some(tx),
        thread: Some(thread),
    })
}

impl Drop for Display {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        *lock(&BOARD) = None;
    }
}

/// A queue's bar on the board while it is alive (does nothing when no board is shown).
pub struct RowGuard(Option<(Arc<Board>, Arc<Row>)>);

/// Adds a bar for queue `label` expecting `total` messages (0 = unknown), counting `messages`
/// and `bytes`.
pub fn row(label: String, total: u64, messages: Counter, bytes: Counter) -> RowGuard {
    let Some(board) = lock(&BOARD).clone() else {
        return RowGuard(None);
    };
    let row = Arc::new(Row {
        bar: bar(&board.multi, total, format!("  {label}")),
        messages,
        bytes,
    });
    lock(&board.rows).push(row.clone());
    RowGuard(Some((board, row)))
}

impl Drop for RowGuard {
    fn drop(&mut self) {
        if let Some((board, row)) = &self.0 {
            board.finish(row);
        }
    }
}

/// Where log records go when stderr is a terminal: each record is written with the bars
/// hidden, which are drawn again below it.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let board = lock(&BOARD).clone();
        let write = || {
            let mut err = std::io::stderr().lock();
            err.write_all(buf).and_then(|_| err.flush())
        };
        match board {
            Some(b) => b.multi.suspend(write)?,
            None => write()?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bars_follow_the_counters_and_finished_rows_stay_in_the_total() {
        let board = Arc::new(Board::new(
            ProgressDrawTarget::hidden(),
            "backup b",
            2,
            3000,
        ));
        *lock(&BOARD) = Some(board.clone());
        let (m, b) = (Counter::default(), Counter::default());
        let first = row("orders (vhost /)".into(), 2000, m.clone(), b.clone());
        m.add(1000);
        b.add(2048);
        board.refresh();
        let r = lock(&board.rows)[0].clone();
        assert_eq!((r.bar.position(), r.bar.length()), (1000, Some(2000)));
        assert_eq!(r.bar.message(), "2.0 KiB");
        assert_eq!(board.total.position(), 1000);
        assert_eq!(board.total.message(), "2.0 KiB, 0/2 queues");
        drop(first);
        assert!(lock(&board.rows).is_empty());
        let (m2, b2) = (Counter::default(), Counter::default());
        let _second = row("events (vhost /)".into(), 0, m2.clone(), b2);
        m2.add(5);
        board.refresh();
        assert_eq!(board.total.position(), 1005);
        assert_eq!(board.total.message(), "2.0 KiB, 1/2 queues");
        *lock(&BOARD) = None;
    }
}
