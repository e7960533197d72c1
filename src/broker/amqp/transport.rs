//! The byte stream under an AMQP connection, and the frame reader on top of it.
//!
//! [`Transport`] is plain TCP or TLS (`crate::broker::tls::TlsStream`); the AMQP and stream clients
//! use it alike.
//! [`FrameReader`] keeps its own buffer (at least 128 KiB and at least one whole frame), so a
//! read timeout in the middle of a frame loses nothing: the reader thread uses short timeouts
//! to keep heartbeats going.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::codec::{check_frame_head, Frame, FrameHead, FRAME_END, FRAME_HEADER_SIZE};
use crate::broker::tls::{TlsClient, TlsStream};
use crate::error::Error;

/// Smallest frame-reader buffer, bytes.
pub const MIN_READ_BUFFER: usize = 128 * 1024;

/// The socket of a connection.
#[derive(Debug)]
pub enum Transport {
    /// Plain TCP.
    Tcp(TcpStream),
    /// TLS over TCP.
    Tls(TlsStream),
}

impl Transport {
    /// Opens a connection to `host:port`: TCP as [`Transport::connect_tcp`], then, with `tls`,
    /// the TLS handshake as [`Transport::start_tls`].
    pub fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        tls: Option<&TlsClient>,
    ) -> io::Result<Transport> {
        let tcp = Self::connect_tcp(host, port, timeout)?;
        match tls {
            Some(tls) => tcp.start_tls(host, port, tls, timeout),
            None => Ok(tcp),
        }
    }

    /// Runs the TLS handshake on this TCP connection to `host:port` (server name `host`, each
    /// socket operation bounded by `timeout`); a connection that is TLS already is returned as
    /// it is.
    ///
    /// Errors: an `io::Error` whose message starts `TLS handshake with <host:port> failed:` and
    /// says why in plain words (`crate::broker::tls::TlsStream::connect`).
    pub fn start_tls(
        self,
        host: &str,
        port: u16,
        tls: &TlsClient,
        timeout: Duration,
    ) -> io::Result<Transport> {
        match self {
            Transport::Tcp(sock) => Ok(Transport::Tls(TlsStream::connect(
                sock,
                host,
                &format!("{host}:{port}"),
                tls,
                timeout,
            )?)),
            tls_already => Ok(tls_already),
        }
    }

    /// Opens a TCP connection to `host:port`, trying every resolved address, each bounded by
    /// `timeout`. Nagle is disabled.
    pub fn connect_tcp(host: &str, port: u16, timeout: Duration) -> io::Result<Transport> {
        let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
        let mut last = io::Error::new(
            io::ErrorKind::NotFound,
            format!("no address found for {host}"),
        );
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Transport::Tcp(s));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A second handle to the same socket (reader and writer halves).
    pub fn try_clone(&self) -> io::Result<Transport> {
        match self {
            Transport::Tcp(s) => Ok(Transport::Tcp(s.try_clone()?)),
            Transport::Tls(s) => Ok(Transport::Tls(s.try_clone()?)),
        }
    }

    /// Read timeout of the socket (shared by every handle).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => s.set_read_timeout(t),
            Transport::Tls(s) => s.socket().set_read_timeout(t),
        }
    }

    /// Write timeout of the socket (shared by every handle).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => s.set_write_timeout(t),
            Transport::Tls(s) => s.socket().set_write_timeout(t),
        }
    }

    /// Shuts both directions down; a blocked read returns at once. Errors are ignored.
    pub fn shutdown(&self) {
        match self {
            Transport::Tcp(s) => {
                let _ = s.shutdown(Shutdown::Both);
            }
            Transport::Tls(s) => s.shutdown(),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.read(buf),
            Transport::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Tcp(s) => s.write(buf),
            Transport::Tls(s) => s.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => s.write_all(buf),
            Transport::Tls(s) => s.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Tcp(s) => s.flush(),
            Transport::Tls(s) => s.flush(),
        }
    }
}

/// Why [`FrameReader::next_frame`] could not give a frame.
#[derive(Debug)]
pub enum ReadFail {
    /// The peer closed the socket.
    Eof,
    /// A socket error.
    Io(io::Error),
    /// Bytes that are not a valid frame.
    Protocol(Error),
}

/// Reads whole frames from a [`Transport`] through an internal buffer.
pub struct FrameReader {
    io: Transport,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    max_payload: usize,
}

impl FrameReader {
    /// A reader accepting frame payloads of at most `max_payload` bytes.
    pub fn new(io: Transport, max_payload: usize) -> Self {
        // Two frames of room, within [128 KiB, 1 MiB]; a bigger frame grows the buffer on demand.
        let size = (2 * (max_payload + FRAME_HEADER_SIZE + 1)).clamp(MIN_READ_BUFFER, 1 << 20);
        FrameReader {
            io,
            buf: vec![0; size],
            start: 0,
            end: 0,
            max_payload,
        }
    }

    /// Changes the largest accepted payload (after `connection.tune`).
    pub fn set_max_payload(&mut self, max_payload: usize) {
        self.max_payload = max_payload;
    }

    /// The socket handle, e.g. to set timeouts.
    pub fn transport(&self) -> &Transport {
        &self.io
    }

    /// True when a whole frame is buffered, i.e. [`FrameReader::next_frame`] will not read the
    /// socket.
    pub fn has_complete_frame(&self) -> bool {
        match FrameHead::parse(&self.buf[self.start..self.end]) {
            Some(h) => self.end - self.start >= h.total_len(),
            None => false,
        }
    }

    /// The next frame. `Ok(None)` when the socket's read timeout expired first (any partial
    /// frame stays buffered).
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, ReadFail> {
        loop {
            let mut need = FRAME_HEADER_SIZE;
            if let Some(head) = FrameHead::parse(&self.buf[self.start..self.end]) {
                check_frame_head(&head, self.max_payload).map_err(|e| {
                    if crate::broker::tls::looks_like_tls(&self.buf[self.start..self.end]) {
                        ReadFail::Protocol(Error::Amqp(
                            "the server answered with TLS: this is a TLS port (use amqps://)"
                                .to_string(),
                        ))
                    } else {
                        ReadFail::Protocol(e)
                    }
                })?;
                let total = head.total_len();
                if self.end - self.start >= total {
                    let s = self.start;
                    self.start += total;
                    if self.start == self.end {
                        self.start = 0;
                        self.end = 0;
                    }
                    if self.buf[s + total - 1] != FRAME_END {
                        return Err(ReadFail::Protocol(Error::Amqp(format!(
                            "malformed AMQP data: frame end octet is 0x{:02x}, expected 0xce",
                            self.buf[s + total - 1]
                        ))));
                    }
                    return Ok(Some(Frame {
                        kind: head.kind,
                        channel: head.channel,
                        payload: &self.buf[s + FRAME_HEADER_SIZE..s + total - 1],
                    }));
                }
                need = total;
            }
            // Make room: the whole pending frame must fit after `start`, and reads should not
            // be tiny.
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
            let room = self.buf.len() - self.end;
            if self.start > 0 && (self.buf.len() - self.start < need || room < 16 * 1024) {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match self.io.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(ReadFail::Eof),
                Ok(n) => self.end += n,
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => return Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof => return Err(ReadFail::Eof),
                    _ => return Err(ReadFail::Io(e)),
                },
            }
        }
    }
}
