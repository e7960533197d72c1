//! A TCP proxy for fault tests: it forwards a local port to an upstream address (a broker's
//! AMQP or stream port) and can stall every connection (bytes held, not refused: a network
//! partition), cut them (a reset), or refuse new ones (a broker that is down).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Forwards both ways.
    Pass = 0,
    /// Holds every byte, both ways (connections stay open, nothing moves).
    Stall = 1,
    /// Closes new connections at once.
    Refuse = 2,
    /// Forwards both ways at about 256 KiB/s (4 KiB per 16 ms): a transfer in flight takes
    /// long enough for a fault to land in its middle.
    Slow = 3,
}

struct Shared {
    mode: AtomicU8,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        match self.mode.load(Ordering::Relaxed) {
            1 => Mode::Stall,
            2 => Mode::Refuse,
            3 => Mode::Slow,
            _ => Mode::Pass,
        }
    }
}

/// The proxy; it stops (and closes everything) when dropped.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
}

impl TcpProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listen");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass as u8),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                let client = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                };
                if s.mode() == Mode::Refuse {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nonblocking(false);
                if let Ok(mut c) = s.conns.lock() {
                    c.push(client.try_clone().unwrap());
                    c.push(server.try_clone().unwrap());
                }
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let s = s.clone();
                    std::thread::spawn(move || pump(from, to, &s));
                }
            }
        });
        TcpProxy { port, shared }
    }

    /// The local port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sets what the proxy does from now on.
    pub fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Resets every connection open now (both ends see their socket closed).
    pub fn cut(&self) {
        if let Ok(mut c) = self.shared.conns.lock() {
            for s in c.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

/// Copies `from` to `to` while the proxy passes; holds while it stalls.
fn pump(mut from: TcpStream, mut to: TcpStream, s: &Shared) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0u8; 64 * 1024];
    while !s.stop.load(Ordering::Relaxed) {
        if s.mode() == Mode::Stall {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let chunk = if s.mode() == Mode::Slow {
            4096
        } else {
            buf.len()
        };
        match from.read(&mut buf[..chunk]) {
            Ok(0) => break,
            Ok(n) => {
                if s.mode() == Mode::Slow {
                    std::thread::sleep(Duration::from_millis(16));
                }
                // A stall that starts now still holds these bytes.
                while s.mode() == Mode::Stall && !s.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
