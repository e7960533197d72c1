//! Opening a connection: TCP (or TLS later) connect with a timeout, protocol header,
//! start/start-ok (PLAIN), tune/tune-ok (frame max, heartbeat, channel max), open, and the
//! errors that name what failed without the password.

use super::*;
use crate::broker::amqp::codec::{
    frame_kind_name, put_method_frame, Method, FRAME_HEARTBEAT, FRAME_METHOD, FRAME_MIN_SIZE,
    FRAME_OVERHEAD, PROTOCOL_HEADER,
};
use crate::broker::amqp::transport::{FrameReader, ReadFail, Transport};
use crate::broker::amqp::types::{FieldTable, FieldValue};
use crate::error::{Error, Result};
use crossbeam_channel::bounded;
use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Handshake failures before the reader thread runs.
pub(super) enum HsFail {
    Eof,
    Timeout,
    Io(std::io::Error),
    Protocol(Error),
}

pub(super) fn client_properties(name: &str) -> FieldTable {
    let s = |v: &str| FieldValue::LongString(v.as_bytes().to_vec());
    let capabilities: FieldTable = [
        "publisher_confirms",
        "consumer_cancel_notify",
        "basic.nack",
        "connection.blocked",
        "authentication_failure_close",
        "exchange_exchange_bindings",
    ]
    .iter()
    .map(|c| (c.to_string(), FieldValue::Bool(true)))
    .collect();
    vec![
        ("product".into(), s("rmq-backup")),
        ("version".into(), s(env!("CARGO_PKG_VERSION"))),
        ("platform".into(), s("Rust")),
        ("connection_name".into(), s(name)),
        ("capabilities".into(), FieldValue::Table(capabilities)),
    ]
}

/// Negotiates a tune value: 0 on one side means "no preference", else the smaller one.
pub(super) fn negotiate<T: Ord + Default + Copy>(ours: T, theirs: T) -> T {
    if ours == T::default() || theirs == T::default() {
        ours.max(theirs)
    } else {
        ours.min(theirs)
    }
}

pub(super) fn table_str(t: &FieldTable, key: &str) -> String {
    match t.iter().find(|(k, _)| k == key) {
        Some((_, FieldValue::LongString(v))) => String::from_utf8_lossy(v).into_owned(),
        _ => "?".to_string(),
    }
}

/// Reads the next method on channel 0 during the handshake, skipping heartbeats.
pub(super) fn handshake_method(
    frames: &mut FrameReader,
    deadline: Instant,
) -> std::result::Result<Method, HsFail> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(HsFail::Timeout);
        }
        frames
            .transport()
            .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))
            .map_err(HsFail::Io)?;
        match frames.next_frame() {
            Ok(Some(f)) => {
                log::trace!(
                    "amqp handshake received {} frame channel={} size={}",
                    frame_kind_name(f.kind),
                    f.channel,
                    f.payload.len()
                );
                match f.kind {
                    FRAME_HEARTBEAT => continue,
                    FRAME_METHOD if f.channel == 0 => {
                        return Method::decode(f.payload).map_err(HsFail::Protocol)
                    }
                    _ => {
                        return Err(HsFail::Protocol(Error::Amqp(format!(
                            "unexpected {} frame on channel {} during the handshake",
                            frame_kind_name(f.kind),
                            f.channel
                        ))))
                    }
                }
            }
            Ok(None) => continue,
            Err(ReadFail::Eof) => return Err(HsFail::Eof),
            Err(ReadFail::Io(e)) => return Err(HsFail::Io(e)),
            Err(ReadFail::Protocol(e)) => return Err(HsFail::Protocol(e)),
        }
    }
}

impl Connection {
    /// Opens a connection: TCP connect (bounded by `connect_timeout`), the AMQP handshake
    /// (PLAIN authentication, tune, open vhost; bounded by `connect_timeout + rpc_timeout`),
    /// then starts the reader thread.
    ///
    /// Errors (SPEC.md "Errors"):
    /// - `Error::Config(...)` for an `amqps` URL without `opts.tls` when the system CA store is
    ///   empty (see `crate::broker::tls::TlsClient::load`);
    /// - `Error::Connection("Failed to connect to <url>: TLS handshake with <host:port>
    ///   failed: <why>")` for a TLS handshake that failed (`crate::broker::tls::Context::describe`);
    /// - `Error::Connection("Failed to connect to <masked url>: <detail>")` when the TCP connect
    ///   fails or times out, or the handshake fails for another reason;
    /// - `Error::Authentication("AMQP authentication failed for user <user>")` when the broker
    ///   refuses the credentials (403 or socket closed after start-ok);
    /// - `Error::Authentication("AMQP authentication failed for user <user>: <reply text>")` when
    ///   the vhost is refused (530/403 on connection.open).
    ///
    /// Metrics (`crate::metrics`): an open connection counts in
    /// `broker_backup_amqp_connections_active` until its reader thread ends; a connection error
    /// marks the broker connection lost for `/health`, a successful open marks it recovered.
    pub fn open(opts: &ConnectOptions) -> Result<Connection> {
        let m = crate::metrics::global();
        match Self::open_inner(opts) {
            Ok(conn) => {
                m.health.connection_ok();
                Ok(conn)
            }
            Err(e) => {
                if matches!(e, Error::Connection(_)) {
                    m.health.connection_lost(e.to_string(), m.progress());
                }
                Err(e)
            }
        }
    }

    pub(super) fn open_inner(opts: &ConnectOptions) -> Result<Connection> {
        let url = &opts.url;
        let masked = url.masked();
        let tls = match (url.tls, &opts.tls) {
            (false, _) => None,
            (true, Some(tls)) => Some(tls.clone()),
            (true, None) => Some(std::sync::Arc::new(crate::broker::tls::TlsClient::load(
                None, "tls",
            )?)),
        };
        let failed = |detail: &dyn std::fmt::Display| {
            Error::Connection(format!("Failed to connect to {masked}: {detail}"))
        };
        let auth_failed =
            || Error::Authentication(format!("AMQP authentication failed for user {}", url.user));
        let addr = url.host_port();
        let transport =
            Transport::connect(&url.host, url.port, opts.connect_timeout, tls.as_deref())
                .map_err(|e| failed(&e))?;
        let mut writer = transport.try_clone().map_err(|e| failed(&e))?;
        let control = transport.try_clone().map_err(|e| failed(&e))?;
        writer
            .set_write_timeout(Some(opts.rpc_timeout.max(Duration::from_millis(1))))
            .map_err(|e| failed(&e))?;
        let ours_frame_max = if opts.frame_max == 0 {
            0
        } else {
            opts.frame_max.max(FRAME_MIN_SIZE)
        };
        let initial_payload = if ours_frame_max == 0 {
            UNLIMITED_FRAME_CAP
        } else {
            ours_frame_max as usize - FRAME_OVERHEAD
        };
        let mut frames = FrameReader::new(transport, initial_payload);
        let deadline = Instant::now() + opts.connect_timeout + opts.rpc_timeout;
        let mut buf = Vec::with_capacity(1024);

        let hs_err = |f: HsFail, after_auth: bool| -> Error {
            match f {
                HsFail::Eof if after_auth => auth_failed(),
                HsFail::Eof if url.tls => {
                    failed(&"connection closed by the server during the AMQP handshake")
                }
                HsFail::Eof => failed(
                    &"connection closed by the server during the AMQP handshake (a TLS port? then use amqps://)",
                ),
                HsFail::Timeout => failed(&format_args!(
                    "timed out during the AMQP handshake ({})",
                    secs(opts.connect_timeout + opts.rpc_timeout)
                )),
                HsFail::Io(e) => failed(&e),
                HsFail::Protocol(e) => failed(&e.message()),
            }
        };
        let write = |w: &mut Transport, bytes: &[u8], after_auth: bool| -> Result<()> {
            w.write_all(bytes).map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                    if after_auth =>
                {
                    auth_failed()
                }
                _ => failed(&e),
            })
        };
        let send = |w: &mut Transport, buf: &mut Vec<u8>, m: &Method, after_auth: bool| {
            buf.clear();
            put_method_frame(buf, 0, m, 0)?;
            log::trace!("amqp {addr} sent {} channel=0 size={}", m.name(), buf.len());
            write(w, buf, after_auth)
        };

        write(&mut writer, PROTOCOL_HEADER, false)?;
        let server_properties = match handshake_method(&mut frames, deadline) {
            Ok(Method::ConnectionStart {
                version_major,
                version_minor,
                server_properties,
                mechanisms,
                ..
            }) => {
                if (version_major, version_minor) != (0, 9) {
                    return Err(failed(&format_args!(
                        "server speaks AMQP {version_major}-{version_minor}, not 0-9-1"
                    )));
                }
                let mechs = String::from_utf8_lossy(&mechanisms).into_owned();
                if !mechs.split_whitespace().any(|m| m == "PLAIN") {
                    return Err(failed(&format_args!(
                        "the broker does not offer PLAIN authentication (offers: {mechs})"
                    )));
                }
                server_properties
            }
            Ok(other) => {
                return Err(failed(&format_args!(
                    "expected connection.start, got {}",
                    other.name()
                )))
            }
            Err(e) => return Err(hs_err(e, false)),
        };

        let mut response = Vec::with_capacity(url.user.len() + url.password.len() + 2);
        response.push(0);
        response.extend_from_slice(url.user.as_bytes());
        response.push(0);
        response.extend_from_slice(url.password.as_bytes());
        send(
            &mut writer,
            &mut buf,
            &Method::ConnectionStartOk {
                client_properties: client_properties(&opts.connection_name),
                mechanism: "PLAIN".to_string(),
                response: crate::broker::amqp::codec::Secret(response),
                locale: "en_US".to_string(),
            },
            false,
        )?;

        let (channel_max, frame_max, heartbeat) = match handshake_method(&mut frames, deadline) {
            Ok(Method::ConnectionTune {
                channel_max,
                frame_max,
                heartbeat,
            }) => (
                negotiate(CHANNEL_MAX, channel_max),
                negotiate(ours_frame_max, frame_max),
                negotiate(opts.heartbeat_secs, heartbeat),
            ),
            Ok(Method::ConnectionClose {
                reply_code,
                reply_text,
                ..
            }) => {
                let _ = send(&mut writer, &mut buf, &Method::ConnectionCloseOk, true);
                log::debug!("amqp {addr} refused login: {reply_code} {reply_text}");
                return Err(if reply_code == 403 {
                    auth_failed()
                } else {
                    failed(&format_args!("connection closed by broker: {reply_text}"))
                });
            }
            Ok(other) => {
                return Err(failed(&format_args!(
                    "expected connection.tune, got {}",
                    other.name()
                )))
            }
            Err(e) => return Err(hs_err(e, true)),
        };
        let frame_max = if frame_max != 0 {
            frame_max.max(FRAME_MIN_SIZE)
        } else {
            0
        };
        let channel_max = if channel_max == 0 {
            u16::MAX
        } else {
            channel_max
        };
        frames.set_max_payload(if frame_max == 0 {
            UNLIMITED_FRAME_CAP
        } else {
            frame_max as usize - FRAME_OVERHEAD
        });
        send(
            &mut writer,
            &mut buf,
            &Method::ConnectionTuneOk {
                channel_max,
                frame_max,
                heartbeat,
            },
            true,
        )?;
        send(
            &mut writer,
            &mut buf,
            &Method::ConnectionOpen {
                vhost: url.vhost.clone(),
            },
            true,
        )?;
        match handshake_method(&mut frames, deadline) {
            Ok(Method::ConnectionOpenOk) => {}
            Ok(Method::ConnectionClose {
                reply_code,
                reply_text,
                ..
            }) => {
                let _ = send(&mut writer, &mut buf, &Method::ConnectionCloseOk, true);
                return Err(if reply_code == 530 || reply_code == 403 {
                    Error::Authentication(format!(
                        "AMQP authentication failed for user {}: {reply_text}",
                        url.user
                    ))
                } else {
                    failed(&format_args!("connection closed by broker: {reply_text}"))
                });
            }
            Ok(other) => {
                return Err(failed(&format_args!(
                    "expected connection.open-ok, got {}",
                    other.name()
                )))
            }
            Err(e) => return Err(hs_err(e, true)),
        }

        let heartbeat = (heartbeat > 0).then(|| Duration::from_secs(heartbeat as u64));
        let tick = match heartbeat {
            Some(hb) => (hb / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)),
            None => Duration::from_secs(1),
        };
        frames
            .transport()
            .set_read_timeout(Some(tick))
            .map_err(|e| failed(&e))?;
        let consumer_buffer = opts.consumer_buffer.max(1);
        let batch_max = (consumer_buffer / 4).clamp(1, 64);
        let shared = Arc::new(ConnShared {
            addr: addr.clone(),
            rpc_timeout: opts.rpc_timeout,
            blocked_timeout: opts.blocked_timeout,
            frame_max,
            channel_max,
            heartbeat,
            batch_max,
            consumer_batches: (consumer_buffer / batch_max).max(1),
            server_properties,
            started: Instant::now(),
            writer: Mutex::new(writer),
            control,
            last_write_ms: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            error: Mutex::new(None),
            closing: AtomicBool::new(false),
            channels: Mutex::new(HashMap::new()),
            highest_channel: std::sync::atomic::AtomicU16::new(0),
            blocked: Mutex::new(None),
            blocked_cond: Condvar::new(),
        });
        let (close_ok_tx, close_ok_rx) = bounded(1);
        let reader_state = ReaderState {
            shared: shared.clone(),
            assembling: HashMap::new(),
            last_read: Instant::now(),
            close_ok: close_ok_tx,
            buf: Vec::with_capacity(256),
            pending: Vec::new(),
        };
        // Down again when the reader thread ends (ReaderState::run).
        crate::metrics::global().amqp_connections.inc();
        let reader = std::thread::Builder::new()
            .name(format!("amqp-reader {addr}"))
            .spawn(move || reader_state.run(frames))
            .map_err(|e| {
                crate::metrics::global().amqp_connections.dec();
                failed(&format_args!("cannot start the reader thread: {e}"))
            })?;
        log::debug!(
            "AMQP connection to {masked} open (broker {} {}, heartbeat {}s, frame_max {frame_max}, channel_max {channel_max})",
            table_str(&shared.server_properties, "product"),
            table_str(&shared.server_properties, "version"),
            heartbeat.map(|h| h.as_secs()).unwrap_or(0)
        );
        Ok(Connection {
            shared,
            reader: Some(reader),
            close_ok: close_ok_rx,
            masked_url: masked,
            closed: false,
        })
    }
}
