//! Progress of `backup` and `restore` for a person at a terminal: one line per queue in work and
//! a total line (messages, bytes, rate, ETA), redrawn at most 4 times a second on stderr by a
//! thread of its own.
//!
//! Shown only when stderr is a terminal ([`std::io::IsTerminal`]) and the log level is below
//! trace (trace output would scroll it away); scripts and log files never see it. Log lines
//! written while it is shown go through [`LogWriter`], which erases the board, writes the line
//! and draws the board again, so the two never mix. The job's final summary line is printed by
//! the command line either way.
//!
//! The counts are the jobs' own counters (`crate::metrics`), read by the drawing thread: the hot
//! path does nothing for the display.

use crate::metrics::Counter;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Time between redraws.
const TICK: Duration = Duration::from_millis(250);
/// Ticks over which the total rate is measured (4 s).
const RATE_WINDOW: usize = 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What is on the terminal: the lines of the board drawn last, and their text.
struct Screen {
    lines: usize,
    frame: String,
}

static SCREEN: Mutex<Screen> = Mutex::new(Screen {
    lines: 0,
    frame: String::new(),
});
static BOARD: Mutex<Option<Arc<Board>>> = Mutex::new(None);

/// One queue on the board.
struct Row {
    label: String,
    /// Messages expected (depth at start, or the manifest's count); 0 = unknown.
    total: u64,
    messages: Counter,
    bytes: Counter,
    started: Instant,
    done: AtomicBool,
}

struct Board {
    title: String,
    queues: usize,
    total: u64,
    started: Instant,
    rows: Mutex<Vec<Arc<Row>>>,
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
    let board = Arc::new(Board {
        title: title.to_string(),
        queues,
        total,
        started: Instant::now(),
        rows: Mutex::new(Vec::new()),
    });
    *lock(&BOARD) = Some(board.clone());
    let (tx, rx) = crossbeam_channel::bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("progress".into())
        .spawn(move || {
            let mut samples: Vec<(Instant, u64)> = Vec::with_capacity(RATE_WINDOW + 1);
            loop {
                let now = Instant::now();
                samples.push((now, board.done()));
                if samples.len() > RATE_WINDOW {
                    samples.remove(0);
                }
                draw(&board.render(now, &samples, width()));
                if !matches!(
                    rx.recv_timeout(TICK),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout)
                ) {
                    break;
                }
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
        draw("");
    }
}

/// A queue's line on the board while it is alive (does nothing when no board is shown).
pub struct RowGuard(Option<Arc<Row>>);

/// Adds a line for queue `label` expecting `total` messages (0 = unknown), counting
/// `messages` and `bytes`.
pub fn row(label: String, total: u64, messages: Counter, bytes: Counter) -> RowGuard {
    let Some(board) = lock(&BOARD).clone() else {
        return RowGuard(None);
    };
    let row = Arc::new(Row {
        label,
        total,
        messages,
        bytes,
        started: Instant::now(),
        done: AtomicBool::new(false),
    });
    lock(&board.rows).push(row.clone());
    RowGuard(Some(row))
}

impl Drop for RowGuard {
    fn drop(&mut self) {
        if let Some(r) = &self.0 {
            r.done.store(true, Ordering::Relaxed);
        }
    }
}

impl Board {
    fn done(&self) -> u64 {
        lock(&self.rows).iter().map(|r| r.messages.get()).sum()
    }

    /// The board's text at `now`: the total line, then one line per queue in work, each cut to
    /// `width` characters.
    fn render(&self, now: Instant, samples: &[(Instant, u64)], width: usize) -> String {
        let rows = lock(&self.rows).clone();
        let done_msgs: u64 = rows.iter().map(|r| r.messages.get()).sum();
        let bytes: u64 = rows.iter().map(|r| r.bytes.get()).sum();
        let finished = rows
            .iter()
            .filter(|r| r.done.load(Ordering::Relaxed))
            .count();
        let rate = match (samples.first(), samples.last()) {
            (Some((t0, n0)), Some((t1, n1))) if *t1 > *t0 => {
                n1.saturating_sub(*n0) as f64 / (*t1 - *t0).as_secs_f64()
            }
            _ => 0.0,
        };
        let mut lines = vec![format!(
            "{}: {finished}/{} queues, {}, {}, {}{}",
            self.title,
            self.queues,
            count_of(done_msgs, self.total),
            crate::inspect::human_bytes(bytes),
            rate_text(rate),
            eta(done_msgs, self.total, rate)
                .map(|e| format!(", ETA {e}"))
                .unwrap_or_default(),
        )];
        lines[0].push_str(&format!(", {}", elapsed(now - self.started)));
        for r in rows.iter().filter(|r| !r.done.load(Ordering::Relaxed)) {
            let n = r.messages.get();
            let secs = (now - r.started).as_secs_f64();
            let rate = if secs > 0.0 { n as f64 / secs } else { 0.0 };
            lines.push(format!(
                "  {}: {}, {}, {}{}",
                r.label,
                count_of(n, r.total),
                crate::inspect::human_bytes(r.bytes.get()),
                rate_text(rate),
                eta(n, r.total, rate)
                    .map(|e| format!(", ETA {e}"))
                    .unwrap_or_default(),
            ));
        }
        let mut out = String::new();
        for l in lines {
            out.extend(l.chars().take(width.saturating_sub(1).max(20)));
            out.push('\n');
        }
        out
    }
}

/// `12,345/100,000 messages (12%)`, or `12,345 messages` when the total is unknown.
fn count_of(n: u64, total: u64) -> String {
    if total == 0 {
        format!("{} messages", thousands(n))
    } else {
        format!(
            "{}/{} messages ({}%)",
            thousands(n),
            thousands(total),
            (n.min(total) * 100 / total)
        )
    }
}

fn rate_text(rate: f64) -> String {
    format!("{} msg/s", thousands(rate.round() as u64))
}

/// Time left at `rate` messages per second, when the total is known and the rate is not 0.
fn eta(n: u64, total: u64, rate: f64) -> Option<String> {
    if total == 0 || rate < 0.5 || n >= total {
        return None;
    }
    Some(elapsed(Duration::from_secs_f64((total - n) as f64 / rate)))
}

/// `42s`, `3m05s`, `2h07m`.
fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s % 3600 / 60)
    }
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The terminal's width from `COLUMNS`, else 100.
fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|w| *w >= 20)
        .unwrap_or(100)
}

/// The escape sequence that moves up over `lines` drawn lines and clears to the end of screen.
fn erase(lines: usize) -> String {
    if lines == 0 {
        String::new()
    } else {
        format!("\x1b[{lines}A\r\x1b[J")
    }
}

/// Replaces the board on the terminal by `frame` ("" erases it).
fn draw(frame: &str) {
    let mut screen = lock(&SCREEN);
    let mut out = erase(screen.lines);
    out.push_str(frame);
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(out.as_bytes());
    let _ = err.flush();
    screen.lines = frame.matches('\n').count();
    screen.frame = frame.to_string();
}

/// Where log records go when stderr is a terminal: each record is written above the board.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let screen = lock(&SCREEN);
        let mut out = erase(screen.lines).into_bytes();
        out.extend_from_slice(buf);
        if buf.ends_with(b"\n") {
            out.extend_from_slice(screen.frame.as_bytes());
        }
        let mut err = std::io::stderr().lock();
        err.write_all(&out)?;
        err.flush()?;
        drop(err);
        if !buf.ends_with(b"\n") {
            // A partial line: the board is drawn again at the next tick.
            drop(screen);
            let mut s = lock(&SCREEN);
            s.lines = 0;
            s.frame.clear();
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
    fn formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(count_of(5, 0), "5 messages");
        assert_eq!(count_of(250, 1000), "250/1,000 messages (25%)");
        assert_eq!(count_of(1200, 1000), "1,200/1,000 messages (100%)");
        assert_eq!(eta(500, 1000, 100.0).as_deref(), Some("5s"));
        assert_eq!(eta(500, 0, 100.0), None);
        assert_eq!(eta(500, 1000, 0.0), None);
        assert_eq!(elapsed(Duration::from_secs(185)), "3m05s");
        assert_eq!(elapsed(Duration::from_secs(7620)), "2h07m");
    }

    #[test]
    fn board_lines() {
        let t0 = Instant::now();
        let board = Board {
            title: "backup b".into(),
            queues: 2,
            total: 3000,
            started: t0,
            rows: Mutex::new(Vec::new()),
        };
        let (m, b) = (Counter::default(), Counter::default());
        m.add(1000);
        b.add(2048);
        board.rows.lock().unwrap().push(Arc::new(Row {
            label: "orders (vhost /)".into(),
            total: 2000,
            messages: m,
            bytes: b,
            started: t0,
            done: AtomicBool::new(false),
        }));
        let now = t0 + Duration::from_secs(2);
        let text = board.render(now, &[(t0, 0), (now, 1000)], 200);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            "backup b: 0/2 queues, 1,000/3,000 messages (33%), 2.0 KiB, 500 msg/s, ETA 4s, 2s"
        );
        assert_eq!(
            lines[1],
            "  orders (vhost /): 1,000/2,000 messages (50%), 2.0 KiB, 500 msg/s, ETA 2s"
        );
        let narrow = board.render(now, &[], 30);
        assert!(narrow.lines().all(|l| l.chars().count() <= 29), "{narrow}");
    }
}
