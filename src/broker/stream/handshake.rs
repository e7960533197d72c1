//! The stream-protocol handshake (PROTOCOL.adoc "Authentication"): TCP, PeerProperties,
//! SaslHandshake, SaslAuthenticate with PLAIN, Tune, Open, on the caller's thread, each step
//! bounded by `rpc_timeout`; and the frame helpers the client shares with its reader thread.

use super::protocol::{key, open_frame, response_text, Cursor, FrameBuf, RESPONSE_OK};
use super::reader::{Frame, MAX_FRAME};
use crate::broker::amqp::transport::Transport;
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// How to reach and log in to the broker's stream port.
#[derive(Clone)]
pub struct StreamOptions {
    pub host: String,
    /// Stream port (SPEC.md `source.stream_port`, default 5552).
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
    pub connect_timeout: Duration,
    pub rpc_timeout: Duration,
    /// Heartbeat asked for, seconds (the broker's proposal wins when it is lower; 0 = none).
    pub heartbeat_secs: u32,
    /// Shown in the management UI.
    pub connection_name: String,
    /// TLS for the stream port (`source.tls`, with an `amqps` source URL or `tls.enabled`).
    pub tls: Option<std::sync::Arc<crate::broker::tls::TlsClient>>,
}

impl std::fmt::Debug for StreamOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamOptions")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("vhost", &self.vhost)
            .finish_non_exhaustive()
    }
}

impl StreamOptions {
    /// Options from an AMQP URL's host, credentials and vhost, with the stream `port`.
    pub fn from_amqp_url(url: &crate::broker::amqp::AmqpUrl, port: u16) -> StreamOptions {
        StreamOptions {
            host: url.host.clone(),
            port,
            user: url.user.clone(),
            password: url.password.clone(),
            vhost: url.vhost.clone(),
            connect_timeout: Duration::from_millis(url.connection_timeout_ms.unwrap_or(30_000)),
            rpc_timeout: Duration::from_secs(30),
            heartbeat_secs: 60,
            connection_name: "rmq-backup".into(),
            tls: None,
        }
    }
}

pub(super) fn read_frame(io: &mut Transport, buf: &mut Vec<u8>, endpoint: &str) -> Result<Frame> {
    let mut size = [0u8; 4];
    io.read_exact(&mut size).map_err(|e| io_lost(endpoint, e))?;
    if crate::broker::tls::looks_like_tls(&size) {
        return Err(Error::Connection(format!(
            "{endpoint} answered with TLS: it is a TLS port (use an amqps:// source URL or source.tls.enabled)"
        )));
    }
    let size = u32::from_be_bytes(size) as usize;
    if !(4..=MAX_FRAME).contains(&size) {
        return Err(Error::Stream(format!(
            "{endpoint} sent a frame of {size} bytes (at least 4 and at most {MAX_FRAME} expected)"
        )));
    }
    buf.clear();
    // Grows as bytes arrive: a garbage size cannot allocate more than what was sent.
    let got = Read::by_ref(io)
        .take(size as u64)
        .read_to_end(buf)
        .map_err(|e| io_lost(endpoint, e))?;
    if got != size {
        return Err(Error::Connection(format!(
            "stream connection to {endpoint} closed in the middle of a frame"
        )));
    }
    Ok(std::mem::take(buf))
}

pub(super) fn io_lost(endpoint: &str, e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::Connection(format!(
            "stream connection to {endpoint} closed by the broker"
        )),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Connection(
            format!("stream connection to {endpoint}: no answer within the timeout"),
        ),
        _ => Error::Connection(format!("stream connection to {endpoint} lost: {e}")),
    }
}

/// Reads the next frame of the handshake, which must come before `deadline` (the whole
/// handshake's: heartbeats or other frames the broker sends meanwhile do not move it).
fn read_before(
    io: &mut Transport,
    buf: &mut Vec<u8>,
    endpoint: &str,
    deadline: Instant,
) -> Result<Frame> {
    let late = || {
        Error::Connection(format!(
            "the stream handshake with {endpoint} did not finish in time (the broker sent other frames, or nothing)"
        ))
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(late());
    }
    io.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
    read_frame(io, buf, endpoint).map_err(|e| {
        // The read timed out at the deadline: that is the deadline's error.
        if Instant::now() >= deadline {
            late()
        } else {
            e
        }
    })
}

/// Reads frames during the handshake until the response `want` with correlation `corr`,
/// before `deadline`.
fn handshake_response(
    io: &mut Transport,
    want: u16,
    corr: u32,
    endpoint: &str,
    deadline: Instant,
) -> Result<Frame> {
    let mut buf = Vec::new();
    loop {
        let f = read_before(io, &mut buf, endpoint, deadline)?;
        let (k, mut c) = open_frame(&f)?;
        if k == want | key::RESPONSE && c.u32()? == corr {
            return Ok(f);
        }
        if k == key::CLOSE {
            let _corr = c.u32()?;
            let code = c.u16()?;
            return Err(Error::Connection(format!(
                "{endpoint} closed the stream connection during the handshake: {} ({})",
                c.string()?,
                response_text(code)
            )));
        }
        // Anything else (a heartbeat) is ignored during the handshake.
    }
}

/// The response code of a response frame (after its correlation id).
pub(super) fn response_code(c: &mut Cursor) -> Result<u16> {
    c.u16()
}

pub(super) fn expect_ok(code: u16, what: &str, endpoint: &str) -> Result<()> {
    if code == RESPONSE_OK {
        Ok(())
    } else {
        Err(stream_refused(what, code, endpoint))
    }
}

pub(super) fn stream_refused(what: &str, code: u16, endpoint: &str) -> Error {
    let hint = if code == 0x10 {
        " (the user needs the read permission on a stream it subscribes to, write on one it \
         publishes to; see the book's \"Least privilege\")"
    } else {
        ""
    };
    Error::Stream(format!(
        "{what} refused by {endpoint}: {} (code {code:#04x}){hint}",
        response_text(code)
    ))
}

/// What the handshake agreed.
pub(super) struct Agreed {
    /// `host:port`.
    pub endpoint: String,
    /// Heartbeat interval, seconds (0 = none).
    pub heartbeat: u32,
    /// Largest frame the broker accepts, bytes (its Tune proposal, which the client takes;
    /// 0 = no limit). RabbitMQ's default `stream.frame_max` is 1 MiB, and 4.x closes the
    /// connection on a larger frame ("frame too large"; 3.10 accepted one).
    pub frame_max: u32,
    /// The broker's version, from its peer properties (`version`, e.g. `4.3.6`); empty when
    /// it sent none.
    pub server_version: String,
}

/// Connects to `o.host:o.port` and logs in; returns the socket and what was agreed.
///
/// No ExchangeCommandVersions (command 27, PROTOCOL.adoc) is sent: RabbitMQ 3.10 closes the
/// connection on it, and where it is known (3.11 and later, `rabbit_stream_utils:
/// command_versions/0`, 4.3: every command at version 1 but publish 1-2, and the broker's
/// Deliver 2 for a client that asks) the only later versions are Publish 2 (a filter value per
/// message, for stream filtering) and Deliver 2 (each chunk's committed offset): the tool
/// writes no filter values and finds a stream's end from its last chunk (`offsets.rs`), so the
/// exchange would bring it nothing on any version.
///
/// Errors: `Connection error: ...` when the port cannot be reached or the connection drops;
/// `Authentication error: ...` for refused credentials (the password is never printed);
/// `Stream protocol error: ...` for a refused vhost or a broker without PLAIN.
pub(super) fn handshake(o: &StreamOptions) -> Result<(Transport, Agreed)> {
    let endpoint = format!("{}:{}", o.host, o.port);
    let io = Transport::connect_tcp(&o.host, o.port, o.connect_timeout)
        .map_err(|e| Error::Connection(format!("cannot reach the stream port {endpoint}: {e}")))?;
    let mut io = match o.tls.as_deref() {
        Some(tls) => io
            .start_tls(&o.host, o.port, tls, o.connect_timeout)
            .map_err(|e| Error::Connection(e.to_string()))?,
        None => io,
    };
    io.set_read_timeout(Some(o.rpc_timeout))
        .and_then(|()| io.set_write_timeout(Some(o.rpc_timeout)))
        .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;
    // The whole login, however many frames the broker sends meanwhile.
    let deadline = Instant::now() + o.connect_timeout + o.rpc_timeout;
    let send = |io: &mut Transport, f: Vec<u8>| io.write_all(&f).map_err(|e| io_lost(&endpoint, e));

    let version = env!("CARGO_PKG_VERSION");
    send(
        &mut io,
        FrameBuf::new(key::PEER_PROPERTIES)
            .u32(1)
            .string_map(&[
                ("product", "rmq-backup"),
                ("version", version),
                ("connection_name", &o.connection_name),
            ])?
            .finish(),
    )?;
    let f = handshake_response(&mut io, key::PEER_PROPERTIES, 1, &endpoint, deadline)?;
    let (_, mut c) = open_frame(&f)?;
    let _ = c.u32()?;
    expect_ok(response_code(&mut c)?, "peer properties", &endpoint)?;
    let server_version = c
        .string_map()
        .unwrap_or_default()
        .into_iter()
        .find(|(k, _)| k == "version")
        .map(|(_, v)| v)
        .unwrap_or_default();

    send(&mut io, FrameBuf::new(key::SASL_HANDSHAKE).u32(2).finish())?;
    let f = handshake_response(&mut io, key::SASL_HANDSHAKE, 2, &endpoint, deadline)?;
    let (_, mut c) = open_frame(&f)?;
    let _ = c.u32()?;
    expect_ok(response_code(&mut c)?, "SASL handshake", &endpoint)?;
    let n = c.count(2)?;
    let mechanisms: Vec<String> = (0..n).map(|_| c.string()).collect::<Result<_>>()?;
    if !mechanisms.iter().any(|m| m == "PLAIN") {
        return Err(Error::Stream(format!(
            "{endpoint} does not offer SASL PLAIN (it offers {})",
            mechanisms.join(", ")
        )));
    }

    let mut plain = Vec::with_capacity(o.user.len() + o.password.len() + 2);
    plain.push(0);
    plain.extend_from_slice(o.user.as_bytes());
    plain.push(0);
    plain.extend_from_slice(o.password.as_bytes());
    send(
        &mut io,
        FrameBuf::new(key::SASL_AUTHENTICATE)
            .u32(3)
            .string("PLAIN")?
            .bytes(&plain)?
            .finish(),
    )?;
    let f = handshake_response(&mut io, key::SASL_AUTHENTICATE, 3, &endpoint, deadline)?;
    let (_, mut c) = open_frame(&f)?;
    let _ = c.u32()?;
    match response_code(&mut c)? {
        RESPONSE_OK => {}
        0x08 | 0x0b => {
            return Err(Error::Authentication(format!(
                "{endpoint} refused the login of user {} on the stream port",
                o.user
            )))
        }
        code => return Err(stream_refused("SASL authentication", code, &endpoint)),
    }

    // The broker proposes frame max and heartbeat; we answer with ours.
    let mut buf = Vec::new();
    let (frame_max, heartbeat) = loop {
        let f = read_before(&mut io, &mut buf, &endpoint, deadline)?;
        let (k, mut c) = open_frame(&f)?;
        if k == key::TUNE {
            break (c.u32()?, c.u32()?);
        }
    };
    let heartbeat = match (heartbeat, o.heartbeat_secs) {
        (0, h) | (h, 0) => h,
        (a, b) => a.min(b),
    };
    send(
        &mut io,
        FrameBuf::new(key::TUNE | key::RESPONSE)
            .u32(frame_max)
            .u32(heartbeat)
            .finish(),
    )?;

    send(
        &mut io,
        FrameBuf::new(key::OPEN).u32(4).string(&o.vhost)?.finish(),
    )?;
    let f = handshake_response(&mut io, key::OPEN, 4, &endpoint, deadline)?;
    let (_, mut c) = open_frame(&f)?;
    let _ = c.u32()?;
    match response_code(&mut c)? {
        RESPONSE_OK => {}
        0x0c => {
            return Err(Error::Authentication(format!(
                "user {} may not open vhost {} on the stream port {endpoint}",
                o.user, o.vhost
            )))
        }
        code => {
            return Err(stream_refused(
                &format!("open vhost {}", o.vhost),
                code,
                &endpoint,
            ))
        }
    }
    log::debug!(
            "stream connection to {endpoint} open (vhost {}, frame max {frame_max}, heartbeat {heartbeat} s, broker version {server_version})",
            o.vhost
        );
    io.set_read_timeout(Some(o.rpc_timeout))
        .map_err(|e| Error::Connection(format!("stream connection to {endpoint}: {e}")))?;

    Ok((
        io,
        Agreed {
            endpoint,
            heartbeat,
            frame_max,
            server_version,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that accepts the connection and sends heartbeats forever, answering nothing:
    /// the handshake ends at its deadline, however often frames come.
    #[test]
    fn heartbeats_do_not_keep_a_handshake_waiting() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let beat = FrameBuf::new(key::HEARTBEAT).finish();
            while s.write_all(&beat).is_ok() {
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let o = StreamOptions {
            host: "127.0.0.1".into(),
            port,
            user: "u".into(),
            password: "p".into(),
            vhost: "/".into(),
            connect_timeout: Duration::from_millis(500),
            rpc_timeout: Duration::from_millis(500),
            heartbeat_secs: 60,
            connection_name: "t".into(),
            tls: None,
        };
        let started = Instant::now();
        let Err(e) = handshake(&o) else {
            panic!("a handshake with a peer that only beats");
        };
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(
            e.to_string().starts_with(&format!(
                "Connection error: the stream handshake with 127.0.0.1:{port} did not finish in time"
            )),
            "{e}"
        );
    }
}
