//! [`TlsStream`]: one rustls client session over a `TcpStream`, shared by several handles.
//!
//! AMQP and stream connections read on a reader thread and write from others (channels,
//! publishers, heartbeats), each through its own handle (`try_clone`). The session state is
//! shared under a lock that is never held across socket I/O:
//! - a read takes plaintext rustls already decrypted; when there is none it reads ciphertext
//!   from the socket *without* the lock, then feeds and decrypts it under the lock;
//! - a write encrypts under the session lock into a buffer, then sends the buffer holding only
//!   the send lock, which keeps TLS records in the order they were sealed (their sequence
//!   numbers) without ever making the reader wait for the socket.
//!
//! Records the reader makes rustls queue (an alert, a TLS 1.3 KeyUpdate answer) go out at once
//! when no write is under way, else first in the next write (a heartbeat at the latest).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::ClientConnection;

use super::{Context, TlsClient};

/// Socket read size of a handle, bytes.
const READ_CHUNK: usize = 64 * 1024;

/// A TLS session over TCP (see the module doc); `Read`/`Write` carry plaintext.
pub struct TlsStream {
    sock: TcpStream,
    shared: Arc<Shared>,
    /// This handle's socket-read buffer (ciphertext, moved into the session under the lock).
    read_buf: Vec<u8>,
}

struct Shared {
    state: Mutex<State>,
    /// Held from sealing records to having sent them.
    send: Mutex<Vec<u8>>,
    /// `host:port`, for messages.
    endpoint: String,
    /// What messages name.
    context: Context,
    /// Set when the first application data arrived: failures before it are the handshake's
    /// (with TLS 1.3 a broker refuses a client certificate only after our side finished).
    established: AtomicBool,
}

struct State {
    conn: ClientConnection,
    /// Ciphertext read from the socket that rustls has not taken yet.
    pending: Vec<u8>,
    taken: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TlsStream {
    /// Runs the TLS handshake on the connected `sock` with the server name `host` (a DNS name
    /// or an IP address, checked against the certificate), each socket read and write bounded
    /// by `timeout`, the whole handshake by twice it.
    ///
    /// Errors (`io::Error`, the message starting `TLS handshake with <endpoint> failed:` in
    /// plain words, see `Context::describe`): kind `InvalidData` for a refused certificate, an
    /// alert or a non-TLS server, `UnexpectedEof` when the server closed the connection,
    /// `TimedOut` when it did not answer in time, `InvalidInput` for a host that is no valid
    /// server name.
    pub fn connect(
        sock: TcpStream,
        host: &str,
        endpoint: &str,
        tls: &TlsClient,
        timeout: Duration,
    ) -> io::Result<TlsStream> {
        let failed = |kind: io::ErrorKind, what: &dyn std::fmt::Display| {
            io::Error::new(
                kind,
                format!("TLS handshake with {endpoint} failed: {what}"),
            )
        };
        let name = ServerName::try_from(host.to_string()).map_err(|_| {
            failed(
                io::ErrorKind::InvalidInput,
                &format_args!("{host:?} is not a valid TLS server name"),
            )
        })?;
        let mut conn = ClientConnection::new(tls.rustls_config(), name)
            .map_err(|e| failed(io::ErrorKind::InvalidInput, &e))?;
        // A write seals the caller's whole buffer at once (then sends it): no 64 KiB cap.
        conn.set_buffer_limit(None);
        sock.set_read_timeout(Some(timeout))?;
        sock.set_write_timeout(Some(timeout))?;
        let deadline = Instant::now() + 2 * timeout;
        let mut io = &sock;
        while conn.is_handshaking() || conn.wants_write() {
            if Instant::now() > deadline {
                return Err(failed(
                    io::ErrorKind::TimedOut,
                    &format_args!("no answer within {} s", (2 * timeout).as_secs()),
                ));
            }
            if let Err(e) = conn.complete_io(&mut io) {
                let what = match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                        "no answer within {} s (a plain, non-TLS port waiting for its client to speak first?)",
                        timeout.as_secs()
                    ),
                    io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted => {
                        "the server closed the connection (a plain, non-TLS port?)".to_string()
                    }
                    _ => match rustls_error(&e) {
                        Some(r) => tls.context().describe(r),
                        None => e.to_string(),
                    },
                };
                let kind = match e.kind() {
                    io::ErrorKind::WouldBlock => io::ErrorKind::TimedOut,
                    io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                        io::ErrorKind::UnexpectedEof
                    }
                    k @ (io::ErrorKind::UnexpectedEof | io::ErrorKind::TimedOut) => k,
                    _ => io::ErrorKind::InvalidData,
                };
                return Err(failed(kind, &what));
            }
        }
        Ok(TlsStream {
            sock,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    conn,
                    pending: Vec::new(),
                    taken: 0,
                }),
                send: Mutex::new(Vec::new()),
                endpoint: endpoint.to_string(),
                context: tls.context().clone(),
                established: AtomicBool::new(false),
            }),
            read_buf: Vec::new(),
        })
    }

    /// A second handle to the same session and socket.
    pub fn try_clone(&self) -> io::Result<TlsStream> {
        Ok(TlsStream {
            sock: self.sock.try_clone()?,
            shared: self.shared.clone(),
            read_buf: Vec::new(),
        })
    }

    /// The socket, e.g. to set timeouts (shared by every handle).
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Sends close_notify when no write is under way, then shuts both directions down; a
    /// blocked read returns at once. Errors are ignored.
    pub fn shutdown(&self) {
        if let Ok(mut out) = self.shared.send.try_lock() {
            {
                let mut st = lock(&self.shared.state);
                st.conn.send_close_notify();
                seal(&mut st.conn, &mut out);
            }
            let _ = (&self.sock).write_all(&out);
            out.clear();
        }
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// The error of a failed session, in plain words (see the module doc).
    fn session_error(&self, e: &rustls::Error) -> io::Error {
        let s = &self.shared;
        let what = s.context.describe(e);
        let message = if s.established.load(Ordering::Relaxed) {
            format!("TLS session with {} failed: {what}", s.endpoint)
        } else {
            format!("TLS handshake with {} failed: {what}", s.endpoint)
        };
        io::Error::new(io::ErrorKind::InvalidData, message)
    }

    /// `e` (a socket reset, a broken pipe, or EOF without close_notify) as it reads before any
    /// application data: a broker that refuses our client certificate after a TLS 1.3 handshake may close
    /// the connection before its alert can be read.
    fn cut_early(&self, e: io::Error) -> io::Error {
        let s = &self.shared;
        let cut = matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof
        );
        if !cut || s.established.load(Ordering::Relaxed) {
            return e;
        }
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "TLS handshake with {} failed: the broker closed the connection right after the handshake: {}",
                s.endpoint,
                s.context.closed_early()
            ),
        )
    }

    /// Sends what rustls queued while reading (an alert, a KeyUpdate answer) unless a write is
    /// under way (which sends it first). Best effort.
    fn send_queued(&self) {
        if let Ok(mut out) = self.shared.send.try_lock() {
            seal(&mut lock(&self.shared.state).conn, &mut out);
            if !out.is_empty() {
                let _ = (&self.sock).write_all(&out);
                out.clear();
            }
        }
    }
}

/// Moves every record rustls has sealed into `out`.
fn seal(conn: &mut ClientConnection, out: &mut Vec<u8>) {
    while conn.wants_write() {
        if conn.write_tls(out).is_err() {
            break;
        }
    }
}

/// The rustls error inside an `io::Error` from rustls, if any.
fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

impl Read for TlsStream {
    /// Plaintext; `Ok(0)` after the server's close_notify, `UnexpectedEof` when the socket
    /// closed without it, `WouldBlock`/`TimedOut` when the socket's read timeout expired.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let queued = {
                let mut st = lock(&self.shared.state);
                match st.conn.reader().read(buf) {
                    Ok(n) => {
                        if n > 0 {
                            self.shared.established.store(true, Ordering::Relaxed);
                        }
                        return Ok(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if st.taken == st.pending.len() {
                    None
                } else {
                    let State {
                        conn,
                        pending,
                        taken,
                    } = &mut *st;
                    *taken += conn.read_tls(&mut &pending[*taken..])?;
                    if *taken == pending.len() {
                        pending.clear();
                        *taken = 0;
                    }
                    let processed = conn.process_new_packets();
                    Some((processed, conn.wants_write()))
                }
            };
            match queued {
                Some((processed, wants_write)) => {
                    if wants_write {
                        self.send_queued();
                    }
                    if let Err(e) = processed {
                        return Err(self.session_error(&e));
                    }
                }
                None => {
                    // Nothing buffered: read the socket without holding the session.
                    self.read_buf.resize(READ_CHUNK, 0);
                    let n = match self.sock.read(&mut self.read_buf) {
                        Ok(n) => n,
                        Err(e) => return Err(self.cut_early(e)),
                    };
                    let mut st = lock(&self.shared.state);
                    if n == 0 {
                        // EOF: rustls tells a clean close (close_notify) from a cut one.
                        st.conn.read_tls(&mut &[][..])?;
                        if let Err(e) = st.conn.process_new_packets() {
                            drop(st);
                            return Err(self.session_error(&e));
                        }
                        let read = st.conn.reader().read(buf);
                        drop(st);
                        return match read {
                            Ok(n) => Ok(n),
                            Err(e) => Err(self.cut_early(e)),
                        };
                    } else {
                        let State { pending, taken, .. } = &mut *st;
                        if *taken > 0 {
                            pending.drain(..*taken);
                            *taken = 0;
                        }
                        pending.extend_from_slice(&self.read_buf[..n]);
                    }
                }
            }
        }
    }
}

impl Write for TlsStream {
    /// Seals all of `buf` and sends it (bounded by the socket's write timeout).
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let mut out = lock(&self.shared.send);
        {
            let mut st = lock(&self.shared.state);
            st.conn.writer().write_all(buf)?;
            seal(&mut st.conn, &mut out);
        }
        let sent = (&self.sock).write_all(&out);
        out.clear();
        sent.map_err(|e| self.cut_early(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsStream")
            .field("endpoint", &self.shared.endpoint)
            .finish_non_exhaustive()
    }
}
