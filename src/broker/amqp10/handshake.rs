//! Opening a [`Connection`]: the TCP (or TLS) connect, the protocol headers (part 2, 2.2),
//! SASL PLAIN (part 5, 5.3) and the `open` exchange (part 2, 2.4.1), all on the caller's
//! thread within one deadline; then the reader thread starts.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;

use super::codec::Value;
use super::connection::{ConnShared, ConnectOptions, Connection, CHANNEL_MAX};
use super::frame::*;
use super::performative::{Open, Performative};
use super::sasl::{decode_sasl, outcome_words, put_plain_init, SaslFrame};
use super::secs;
use crate::broker::amqp::transport::{ReadFail, Transport};
use crate::broker::tls::TlsClient;
use crate::error::{Error, Result};

/// Why the handshake stopped.
enum HsFail {
    Eof,
    Timeout,
    Io(std::io::Error),
    Protocol(Error),
}

fn read_until<T>(
    frames: &mut FrameReader<Transport>,
    deadline: Instant,
    mut f: impl FnMut(&mut FrameReader<Transport>) -> std::result::Result<Option<T>, ReadFail>,
) -> std::result::Result<T, HsFail> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(HsFail::Timeout);
        }
        frames
            .get_ref()
            .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))
            .map_err(HsFail::Io)?;
        match f(frames) {
            Ok(Some(t)) => return Ok(t),
            Ok(None) => continue,
            Err(ReadFail::Eof) => return Err(HsFail::Eof),
            Err(ReadFail::Io(e)) => return Err(HsFail::Io(e)),
            Err(ReadFail::Protocol(e)) => return Err(HsFail::Protocol(e)),
        }
    }
}

/// The next non-empty frame of type `kind` on channel 0, as its body.
fn next_body(
    frames: &mut FrameReader<Transport>,
    deadline: Instant,
    kind: u8,
) -> std::result::Result<Vec<u8>, HsFail> {
    read_until(frames, deadline, |fr| match fr.next_frame()? {
        Some(f) if f.body.is_empty() => Ok(None),
        Some(f) if f.kind == kind && f.channel == 0 => Ok(Some(f.body.to_vec())),
        Some(f) => Err(ReadFail::Protocol(Error::Amqp(format!(
            "unexpected frame of type {} on channel {} during the handshake",
            f.kind, f.channel
        )))),
        None => Ok(None),
    })
}

fn header_words(h: &[u8; 8]) -> String {
    if h == &AMQP_PROTOCOL_HEADER {
        "AMQP 1.0 without SASL".to_string()
    } else if &h[..4] == b"AMQP" {
        format!("AMQP {}-{}-{}-{}", h[4], h[5], h[6], h[7])
    } else {
        format!("{h:02x?}")
    }
}

impl Connection {
    /// Opens a connection: TCP connect (bounded by `connect_timeout`; TLS for `amqps`), SASL
    /// PLAIN with the URL's user and password, `open` with the hostname `vhost:<vhost>`
    /// (bounded together by `connect_timeout + rpc_timeout`), then starts the reader thread.
    ///
    /// Errors:
    /// - `Error::Connection("Failed to connect to <masked url>: <detail>")`: TCP or TLS
    ///   failed or timed out, the server does not speak AMQP 1.0 with SASL PLAIN, or the
    ///   handshake broke off;
    /// - `Error::Authentication("AMQP authentication failed for user <user>")`: the broker
    ///   refused the credentials (SASL outcome `auth`);
    /// - `Error::Authentication("AMQP 1.0 connection refused for user <user> on vhost <vhost>:
    ///   ...")`: the broker closed the connection after our `open` (the vhost does not exist,
    ///   or the user has no access to it), or refused it with `amqp:unauthorized-access`;
    /// - `Error::Config` for an `amqps` URL without `tls` when the system CA store is empty.
    pub fn open(opts: &ConnectOptions) -> Result<Connection> {
        let url = &opts.url;
        let masked = url.masked();
        let failed = |detail: &dyn std::fmt::Display| {
            Error::Connection(format!("Failed to connect to {masked}: {detail}"))
        };
        let auth_failed =
            || Error::Authentication(format!("AMQP authentication failed for user {}", url.user));
        let refused = |detail: &dyn std::fmt::Display| {
            Error::Authentication(format!(
                "AMQP 1.0 connection refused for user {} on vhost {}: {detail}",
                url.user, url.vhost
            ))
        };
        let tls = match (url.tls, &opts.tls) {
            (false, _) => None,
            (true, Some(tls)) => Some(tls.clone()),
            (true, None) => Some(Arc::new(TlsClient::load(None, "tls")?)),
        };
        let addr = url.host_port();
        let transport =
            Transport::connect(&url.host, url.port, opts.connect_timeout, tls.as_deref())
                .map_err(|e| failed(&e))?;
        let mut writer = transport.try_clone().map_err(|e| failed(&e))?;
        let control = transport.try_clone().map_err(|e| failed(&e))?;
        writer
            .set_write_timeout(Some(opts.rpc_timeout.max(Duration::from_millis(1))))
            .map_err(|e| failed(&e))?;
        let our_max_frame = opts.max_frame_size.max(MIN_MAX_FRAME_SIZE);
        let mut frames = FrameReader::new(transport, our_max_frame as usize);
        let deadline = Instant::now() + opts.connect_timeout + opts.rpc_timeout;
        let hs = |f: HsFail| {
            match f {
            HsFail::Eof if url.tls => {
                failed(&"connection closed by the server during the AMQP 1.0 handshake")
            }
            HsFail::Eof => failed(
                &"connection closed by the server during the AMQP 1.0 handshake (a TLS port? then use amqps://)",
            ),
            HsFail::Timeout => failed(&format_args!(
                "timed out during the AMQP 1.0 handshake ({})",
                secs(opts.connect_timeout + opts.rpc_timeout)
            )),
            HsFail::Io(e) => failed(&e),
            HsFail::Protocol(e) => failed(&e.message()),
        }
        };
        let write = |w: &mut Transport, b: &[u8]| w.write_all(b).map_err(|e| failed(&e));

        // SASL (part 5, 5.3.2): header, mechanisms, init, outcome.
        write(&mut writer, &SASL_PROTOCOL_HEADER)?;
        let header = read_until(&mut frames, deadline, |f| f.protocol_header()).map_err(hs)?;
        if header != SASL_PROTOCOL_HEADER {
            if crate::broker::tls::looks_like_tls(&header) {
                return Err(failed(
                    &"the server answered with TLS: this is a TLS port (use amqps://)",
                ));
            }
            return Err(failed(&format_args!(
                "the server answered with protocol header {}, not AMQP 1.0 with SASL",
                header_words(&header)
            )));
        }
        let sasl = |b: Vec<u8>| decode_sasl(&b).map_err(|e| failed(&e.message()));
        match sasl(next_body(&mut frames, deadline, TYPE_SASL).map_err(hs)?)? {
            SaslFrame::Mechanisms(m) if m.iter().any(|m| m == "PLAIN") => {}
            SaslFrame::Mechanisms(m) => {
                return Err(failed(&format_args!(
                    "the server offers the SASL mechanisms {m:?}, not PLAIN"
                )))
            }
            other => {
                return Err(failed(&format_args!(
                    "expected sasl-mechanisms, got {other:?}"
                )))
            }
        }
        let mut buf = Vec::with_capacity(256);
        put_plain_init(&mut buf, &url.user, &url.password);
        write(&mut writer, &buf)?;
        match next_body(&mut frames, deadline, TYPE_SASL).map_err(|f| match f {
            HsFail::Eof => auth_failed(),
            f => hs(f),
        }) {
            Err(e) => return Err(e),
            Ok(b) => match sasl(b)? {
                SaslFrame::Outcome(0) => {}
                SaslFrame::Outcome(1) => return Err(auth_failed()),
                SaslFrame::Outcome(code) => {
                    return Err(failed(&format_args!(
                        "SASL outcome {code}: {}",
                        outcome_words(code)
                    )))
                }
                other => {
                    return Err(failed(&format_args!(
                        "expected sasl-outcome, got {other:?}"
                    )))
                }
            },
        }

        // AMQP (part 2, 2.2 and 2.4.1): header, open both ways.
        let idle_ms = opts.idle_time_out.as_millis().min(u32::MAX as u128) as u32;
        let open = Performative::Open(Open {
            container_id: format!("rmq-backup-{}-{}", std::process::id(), crate::now_ms()),
            hostname: Some(format!("vhost:{}", url.vhost)),
            max_frame_size: our_max_frame,
            channel_max: CHANNEL_MAX,
            idle_time_out: (idle_ms > 0).then_some(idle_ms.max(1000)),
            properties: client_properties(&opts.connection_name),
        });
        buf.clear();
        buf.extend_from_slice(&AMQP_PROTOCOL_HEADER);
        put_frame(&mut buf, TYPE_AMQP, 0, |b| open.encode(b));
        write(&mut writer, &buf)?;
        let after_open = |f: HsFail| {
            match f {
            HsFail::Eof => refused(&"the broker closed the connection after our open (the vhost may not exist, or the user has no access to it)"),
            f => hs(f),
        }
        };
        let header =
            read_until(&mut frames, deadline, |f| f.protocol_header()).map_err(after_open)?;
        if header != AMQP_PROTOCOL_HEADER {
            return Err(failed(&format_args!(
                "the server answered with protocol header {} after SASL, not AMQP 1.0",
                header_words(&header)
            )));
        }
        let body = next_body(&mut frames, deadline, TYPE_AMQP).map_err(after_open)?;
        let (p, _) = Performative::decode(&body).map_err(|e| failed(&e.message()))?;
        let their = match p {
            Performative::Open(o) => o,
            Performative::Close(Some(e)) if e.condition == "amqp:unauthorized-access" => {
                return Err(refused(&e))
            }
            Performative::Close(e) => {
                return Err(failed(&format_args!(
                    "the broker closed the connection: {}",
                    e.map_or("no error given".to_string(), |e| e.to_string())
                )))
            }
            other => return Err(failed(&format_args!("expected open, got {}", other.name()))),
        };
        log::debug!(
            "AMQP 1.0 connection to {masked} open (container {}, max-frame-size {}, idle-time-out {:?} ms)",
            their.container_id,
            their.max_frame_size,
            their.idle_time_out
        );
        let silence_limit = (idle_ms > 0).then(|| opts.idle_time_out * 3);
        let heartbeat_every = their
            .idle_time_out
            .filter(|&ms| ms > 0)
            .map(|ms| Duration::from_millis(ms as u64 / 2));
        let shared = Arc::new(ConnShared {
            addr: addr.clone(),
            rpc_timeout: opts.rpc_timeout,
            blocked_timeout: opts.blocked_timeout,
            // "No limit" (u32::MAX) is taken as 1 MiB.
            peer_max_frame: their.max_frame_size.clamp(MIN_MAX_FRAME_SIZE, 1 << 20) as usize,
            heartbeat_every,
            silence_limit,
            channel_max: their.channel_max.min(CHANNEL_MAX),
            receiver_buffer: opts.receiver_buffer.max(1),
            started: Instant::now(),
            writer: Mutex::new(writer),
            control,
            last_write_ms: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            error: Mutex::new(None),
            sessions: Mutex::new(HashMap::new()),
            next_channel: std::sync::atomic::AtomicU16::new(0),
        });
        // The reader wakes this often to send heartbeats and notice a silent broker.
        let tick = heartbeat_every
            .map_or(Duration::from_millis(500), |h| h / 4)
            .clamp(Duration::from_millis(20), Duration::from_millis(500));
        frames
            .get_ref()
            .set_read_timeout(Some(tick))
            .map_err(|e| failed(&e))?;
        let (close_tx, close_rx) = bounded(1);
        let reader_shared = shared.clone();
        let reader = std::thread::Builder::new()
            .name("amqp10-reader".into())
            .spawn(move || super::reader::Reader::new(reader_shared, close_tx).run(frames))
            .map_err(|e| failed(&format_args!("cannot start the reader thread: {e}")))?;
        Ok(Connection {
            shared,
            reader: Some(reader),
            close_rx,
            masked_url: masked,
            closed: false,
            server_properties: their.properties,
            container_id: their.container_id,
        })
    }
}

fn client_properties(name: &str) -> Vec<(Value, Value)> {
    let p = |k: &str, v: &str| (Value::Symbol(k.to_string()), Value::String(v.to_string()));
    vec![
        p("product", "rmq-backup"),
        p("version", env!("CARGO_PKG_VERSION")),
        p("platform", "Rust"),
        p("connection_name", name),
    ]
}
