//! The performatives of AMQP 1.0 (OASIS AMQP 1.0, part 2 "Transport", 2.7) and the delivery
//! states and error they carry (2.8.14, part 3 "Messaging" 3.4), as Rust types, encoded to and
//! decoded from the type system of [`super::codec`].
//!
//! A performative is a described list: its descriptor a `ulong` code (or the symbolic name,
//! accepted when decoding), its fields positional, a missing or `null` field taking its
//! default. Decoding never trusts the input: a field of the wrong type, a missing mandatory
//! field or bytes that do not decode give `Error::Amqp("malformed AMQP 1.0 frame: ...")`.

use super::codec::{decode_value, encode_value, Value};
pub(crate) use super::fields::{descriptor_code, Fields, NAMES};
use crate::error::{Error, Result};

fn malformed(detail: impl std::fmt::Display) -> Error {
    Error::Amqp(format!("malformed AMQP 1.0 frame: {detail}"))
}

/// An error a peer sends (part 2, 2.8.14): its condition (a symbol such as `amqp:not-found`)
/// and description.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpError {
    /// The error condition, e.g. `amqp:unauthorized-access`.
    pub condition: String,
    /// The peer's description, when it gave one.
    pub description: Option<String>,
}

impl std::fmt::Display for AmqpError {
    /// `condition: description`, or the condition alone.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.description {
            Some(d) => write!(f, "{}: {d}", self.condition),
            None => f.write_str(&self.condition),
        }
    }
}

/// A terminal delivery state, an outcome (part 3, 3.4).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `accepted` (3.4.2): the message is done with (a receiver: the broker removes it).
    Accepted,
    /// `rejected` (3.4.3): the message is invalid; the error says why.
    Rejected(Option<AmqpError>),
    /// `released` (3.4.4): the message was not processed and goes back to the node.
    Released,
    /// `modified` (3.4.5): given back, marked as failed (`delivery_failed`: the node raises
    /// its delivery count), not to be redelivered to this link (`undeliverable_here`), with
    /// message annotations to merge into it.
    Modified {
        /// Count this delivery as a failed attempt.
        delivery_failed: bool,
        /// Do not deliver it to this link again.
        undeliverable_here: bool,
        /// Annotations to merge into the message's message-annotations (symbol keys).
        message_annotations: Vec<(Value, Value)>,
    },
}

impl Outcome {
    /// The outcome's name: `accepted`, `rejected`, `released` or `modified`.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected(_) => "rejected",
            Outcome::Released => "released",
            Outcome::Modified { .. } => "modified",
        }
    }
}

/// A delivery state as a disposition or transfer carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryState {
    /// A terminal outcome.
    Outcome(Outcome),
    /// `received` (3.4.1) or another non-terminal state, by its descriptor code.
    Other(u64),
}

/// `open` (2.7.1).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Open {
    /// The container id.
    pub container_id: String,
    /// The hostname: RabbitMQ takes the vhost from `vhost:NAME`.
    pub hostname: Option<String>,
    /// Largest frame the sender of this open accepts, bytes (absent: no limit, `u32::MAX`).
    pub max_frame_size: u32,
    /// Highest channel number the sender of this open accepts.
    pub channel_max: u16,
    /// Idle time-out, milliseconds: half the time after which the sender of this open gives
    /// up on a silent peer (absent: none).
    pub idle_time_out: Option<u32>,
    /// Connection properties (symbol keys), e.g. RabbitMQ's `product` and `version`.
    pub properties: Vec<(Value, Value)>,
}

/// `begin` (2.7.2).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Begin {
    /// The channel of the begin this one answers (absent in a begin that starts a session).
    pub remote_channel: Option<u16>,
    /// Transfer id of the next transfer the sender of this begin sends.
    pub next_outgoing_id: u32,
    /// Transfers the sender of this begin accepts before it widens the window.
    pub incoming_window: u32,
    /// Transfers the sender of this begin may send before it waits.
    pub outgoing_window: u32,
    /// Highest link handle (absent: `u32::MAX`).
    pub handle_max: u32,
}

/// `attach` (2.7.3), with the terminus addresses this client uses. `source`/`target`:
/// `None` is a null terminus (what a refusing peer answers with), `Some(None)` a terminus
/// without an address.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Attach {
    /// The link name.
    pub name: String,
    /// The handle the sender of this attach gives the link.
    pub handle: u32,
    /// The sender of this attach is the link's receiver (true) or sender (false).
    pub role_receiver: bool,
    /// 0 unsettled, 1 settled, 2 mixed.
    pub snd_settle_mode: u8,
    /// 0 first, 1 second.
    pub rcv_settle_mode: u8,
    /// The source terminus and its address.
    pub source: Option<Option<String>>,
    /// The target terminus and its address.
    pub target: Option<Option<String>>,
    /// The sender's initial delivery count (set by a link's sender).
    pub initial_delivery_count: Option<u32>,
    /// Largest message accepted, bytes (absent: no limit).
    pub max_message_size: Option<u64>,
}

/// `flow` (2.7.4): session flow state, and a link's when `handle` is set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Flow {
    /// The next transfer id expected from the peer.
    pub next_incoming_id: Option<u32>,
    /// Transfers accepted from the peer.
    pub incoming_window: u32,
    /// The next transfer id to be sent.
    pub next_outgoing_id: u32,
    /// Transfers that may be sent.
    pub outgoing_window: u32,
    /// The link the rest is about.
    pub handle: Option<u32>,
    /// The link's delivery count.
    pub delivery_count: Option<u32>,
    /// The link's credit: deliveries the receiver accepts after `delivery_count`.
    pub link_credit: Option<u32>,
    /// Deliveries the sender could send.
    pub available: Option<u32>,
    /// Use all credit, then advance the delivery count past what is left.
    pub drain: bool,
    /// Ask the peer for its flow state.
    pub echo: bool,
}

/// `transfer` (2.7.5); its payload follows it in the frame.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Transfer {
    /// The link.
    pub handle: u32,
    /// The delivery id (first frame of a delivery).
    pub delivery_id: Option<u32>,
    /// The delivery tag (first frame of a delivery).
    pub delivery_tag: Option<Vec<u8>>,
    /// The message format (first frame; absent: 0).
    pub message_format: Option<u32>,
    /// Settled by the sender.
    pub settled: Option<bool>,
    /// More frames of this delivery follow.
    pub more: bool,
    /// The delivery's state.
    pub state: Option<DeliveryState>,
    /// The delivery is abandoned: discard what arrived of it.
    pub aborted: bool,
}

/// `disposition` (2.7.6): deliveries `first..=last` (serial numbers) reach a state.
#[derive(Debug, Clone, PartialEq)]
pub struct Disposition {
    /// The sender of this disposition is the receiver (true) of those deliveries.
    pub role_receiver: bool,
    /// First delivery id.
    pub first: u32,
    /// Last delivery id (absent: `first`).
    pub last: Option<u32>,
    /// The deliveries are settled.
    pub settled: bool,
    /// Their state.
    pub state: Option<DeliveryState>,
}

/// A performative: the body of an AMQP frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Performative {
    Open(Open),
    Begin(Begin),
    Attach(Attach),
    Flow(Flow),
    Transfer(Transfer),
    Disposition(Disposition),
    /// `detach` (2.7.7): handle, closed, error.
    Detach {
        handle: u32,
        closed: bool,
        error: Option<AmqpError>,
    },
    /// `end` (2.7.8).
    End(Option<AmqpError>),
    /// `close` (2.7.9).
    Close(Option<AmqpError>),
}

fn described(code: u64, mut fields: Vec<Value>) -> Value {
    while matches!(fields.last(), Some(Value::Null)) {
        fields.pop();
    }
    Value::Described(Box::new(Value::Ulong(code)), Box::new(Value::List(fields)))
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> Value) -> Value {
    v.map(f).unwrap_or(Value::Null)
}

fn error_value(e: &Option<AmqpError>) -> Value {
    opt(e.as_ref(), |e| {
        described(
            0x1d,
            vec![
                Value::Symbol(e.condition.clone()),
                opt(e.description.clone(), Value::String),
            ],
        )
    })
}

fn decode_error(f: &Fields, i: usize) -> Result<Option<AmqpError>> {
    let Some((code, v)) = f.described(i, "error")? else {
        return Ok(None);
    };
    if code != 0x1d {
        return Err(malformed(format_args!(
            "error field with descriptor {code:#x}"
        )));
    }
    let e = Fields::of("error", v)?;
    let condition = e.string(0, "condition")?;
    Ok(Some(AmqpError {
        condition: e.required(0, "condition", condition)?,
        description: e.string(1, "description")?,
    }))
}

/// The value of a delivery state.
pub(crate) fn state_value(s: &DeliveryState) -> Value {
    match s {
        DeliveryState::Outcome(Outcome::Accepted) => described(0x24, vec![]),
        DeliveryState::Outcome(Outcome::Rejected(e)) => described(0x25, vec![error_value(e)]),
        DeliveryState::Outcome(Outcome::Released) => described(0x26, vec![]),
        DeliveryState::Outcome(Outcome::Modified {
            delivery_failed,
            undeliverable_here,
            message_annotations,
        }) => described(
            0x27,
            vec![
                Value::Bool(*delivery_failed),
                Value::Bool(*undeliverable_here),
                if message_annotations.is_empty() {
                    Value::Null
                } else {
                    Value::Map(message_annotations.clone())
                },
            ],
        ),
        DeliveryState::Other(code) => described(*code, vec![]),
    }
}

fn decode_state(f: &Fields, i: usize) -> Result<Option<DeliveryState>> {
    let Some((code, v)) = f.described(i, "state")? else {
        return Ok(None);
    };
    Ok(Some(match code {
        0x24 => DeliveryState::Outcome(Outcome::Accepted),
        0x25 => DeliveryState::Outcome(Outcome::Rejected(decode_error(
            &Fields::of("rejected", v)?,
            0,
        )?)),
        0x26 => DeliveryState::Outcome(Outcome::Released),
        0x27 => {
            let m = Fields::of("modified", v)?;
            DeliveryState::Outcome(Outcome::Modified {
                delivery_failed: m.boolean(0, "delivery-failed")?.unwrap_or(false),
                undeliverable_here: m.boolean(1, "undeliverable-here")?.unwrap_or(false),
                message_annotations: m.map(2, "message-annotations")?,
            })
        }
        other => DeliveryState::Other(other),
    }))
}

fn terminus_value(code: u64, t: &Option<Option<String>>) -> Value {
    opt(t.as_ref(), |addr| {
        described(code, vec![opt(addr.clone(), Value::String)])
    })
}

fn decode_terminus(f: &Fields, i: usize, field: &str) -> Result<Option<Option<String>>> {
    let Some((_, v)) = f.described(i, field)? else {
        return Ok(None);
    };
    Ok(Some(Fields::of("terminus", v)?.string(0, "address")?))
}

impl Performative {
    /// The performative's name (`open`, `transfer`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Performative::Open(_) => "open",
            Performative::Begin(_) => "begin",
            Performative::Attach(_) => "attach",
            Performative::Flow(_) => "flow",
            Performative::Transfer(_) => "transfer",
            Performative::Disposition(_) => "disposition",
            Performative::Detach { .. } => "detach",
            Performative::End(_) => "end",
            Performative::Close(_) => "close",
        }
    }

    /// Appends the performative's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let u = Value::Uint;
        let v = match self {
            Performative::Open(o) => described(
                0x10,
                vec![
                    Value::String(o.container_id.clone()),
                    opt(o.hostname.clone(), Value::String),
                    u(o.max_frame_size),
                    Value::Ushort(o.channel_max),
                    opt(o.idle_time_out, u),
                    Value::Null,
                    Value::Null,
                    Value::Null,
                    Value::Null,
                    Value::Map(o.properties.clone()),
                ],
            ),
            Performative::Begin(b) => described(
                0x11,
                vec![
                    opt(b.remote_channel, Value::Ushort),
                    u(b.next_outgoing_id),
                    u(b.incoming_window),
                    u(b.outgoing_window),
                    u(b.handle_max),
                ],
            ),
            Performative::Attach(a) => described(
                0x12,
                vec![
                    Value::String(a.name.clone()),
                    u(a.handle),
                    Value::Bool(a.role_receiver),
                    Value::Ubyte(a.snd_settle_mode),
                    Value::Ubyte(a.rcv_settle_mode),
                    terminus_value(0x28, &a.source),
                    terminus_value(0x29, &a.target),
                    Value::Null,
                    Value::Null,
                    opt(a.initial_delivery_count, u),
                    opt(a.max_message_size, Value::Ulong),
                ],
            ),
            Performative::Flow(f) => described(
                0x13,
                vec![
                    opt(f.next_incoming_id, u),
                    u(f.incoming_window),
                    u(f.next_outgoing_id),
                    u(f.outgoing_window),
                    opt(f.handle, u),
                    opt(f.delivery_count, u),
                    opt(f.link_credit, u),
                    opt(f.available, u),
                    Value::Bool(f.drain),
                    Value::Bool(f.echo),
                ],
            ),
            Performative::Transfer(t) => described(
                0x14,
                vec![
                    u(t.handle),
                    opt(t.delivery_id, u),
                    opt(t.delivery_tag.clone(), Value::Binary),
                    opt(t.message_format, u),
                    opt(t.settled, Value::Bool),
                    Value::Bool(t.more),
                    Value::Null,
                    opt(t.state.as_ref(), state_value),
                    Value::Null,
                    Value::Bool(t.aborted),
                ],
            ),
            Performative::Disposition(d) => described(
                0x15,
                vec![
                    Value::Bool(d.role_receiver),
                    u(d.first),
                    opt(d.last, u),
                    Value::Bool(d.settled),
                    opt(d.state.as_ref(), state_value),
                ],
            ),
            Performative::Detach {
                handle,
                closed,
                error,
            } => described(
                0x16,
                vec![u(*handle), Value::Bool(*closed), error_value(error)],
            ),
            Performative::End(e) => described(0x17, vec![error_value(e)]),
            Performative::Close(e) => described(0x18, vec![error_value(e)]),
        };
        encode_value(&v, out);
    }

    /// Decodes the performative at the start of a frame body; returns it and the payload
    /// after it (a transfer's message bytes; empty for the others).
    ///
    /// Errors: `Error::Amqp("malformed AMQP 1.0 frame: ...")`: bytes that do not decode, a
    /// descriptor that is not a performative, a field of the wrong type, a mandatory field
    /// missing.
    pub fn decode(body: &[u8]) -> Result<(Performative, &[u8])> {
        let (v, used) = decode_value(body).map_err(|e| malformed(e.message()))?;
        let payload = body.get(used..).unwrap_or_default();
        let Value::Described(d, list) = &v else {
            return Err(malformed("the frame body is not a described performative"));
        };
        let code = descriptor_code(d)
            .filter(|c| (0x10..=0x18).contains(c))
            .ok_or_else(|| malformed(format_args!("unknown performative {d:?}")))?;
        let what = NAMES
            .iter()
            .find(|(c, _)| *c == code)
            .map_or("performative", |(_, n)| *n);
        let f = Fields::of(what, list)?;
        let p = match code {
            0x10 => {
                let id = f.string(0, "container-id")?;
                Performative::Open(Open {
                    container_id: f.required(0, "container-id", id)?,
                    hostname: f.string(1, "hostname")?,
                    max_frame_size: f.uint(2, "max-frame-size")?.unwrap_or(u32::MAX),
                    channel_max: f.ushort(3, "channel-max")?.unwrap_or(u16::MAX),
                    idle_time_out: f.uint(4, "idle-time-out")?,
                    properties: f.map(9, "properties")?,
                })
            }
            0x11 => {
                let next = f.uint(1, "next-outgoing-id")?;
                let inw = f.uint(2, "incoming-window")?;
                let outw = f.uint(3, "outgoing-window")?;
                Performative::Begin(Begin {
                    remote_channel: f.ushort(0, "remote-channel")?,
                    next_outgoing_id: f.required(1, "next-outgoing-id", next)?,
                    incoming_window: f.required(2, "incoming-window", inw)?,
                    outgoing_window: f.required(3, "outgoing-window", outw)?,
                    handle_max: f.uint(4, "handle-max")?.unwrap_or(u32::MAX),
                })
            }
            0x12 => {
                let name = f.string(0, "name")?;
                let handle = f.uint(1, "handle")?;
                let role = f.boolean(2, "role")?;
                Performative::Attach(Attach {
                    name: f.required(0, "name", name)?,
                    handle: f.required(1, "handle", handle)?,
                    role_receiver: f.required(2, "role", role)?,
                    snd_settle_mode: f.ubyte(3, "snd-settle-mode")?.unwrap_or(2),
                    rcv_settle_mode: f.ubyte(4, "rcv-settle-mode")?.unwrap_or(0),
                    source: decode_terminus(&f, 5, "source")?,
                    target: decode_terminus(&f, 6, "target")?,
                    initial_delivery_count: f.uint(9, "initial-delivery-count")?,
                    max_message_size: f.ulong(10, "max-message-size")?,
                })
            }
            0x13 => {
                let inw = f.uint(1, "incoming-window")?;
                let next = f.uint(2, "next-outgoing-id")?;
                let outw = f.uint(3, "outgoing-window")?;
                Performative::Flow(Flow {
                    next_incoming_id: f.uint(0, "next-incoming-id")?,
                    incoming_window: f.required(1, "incoming-window", inw)?,
                    next_outgoing_id: f.required(2, "next-outgoing-id", next)?,
                    outgoing_window: f.required(3, "outgoing-window", outw)?,
                    handle: f.uint(4, "handle")?,
                    delivery_count: f.uint(5, "delivery-count")?,
                    link_credit: f.uint(6, "link-credit")?,
                    available: f.uint(7, "available")?,
                    drain: f.boolean(8, "drain")?.unwrap_or(false),
                    echo: f.boolean(9, "echo")?.unwrap_or(false),
                })
            }
            0x14 => {
                let handle = f.uint(0, "handle")?;
                Performative::Transfer(Transfer {
                    handle: f.required(0, "handle", handle)?,
                    delivery_id: f.uint(1, "delivery-id")?,
                    delivery_tag: f.binary(2, "delivery-tag")?,
                    message_format: f.uint(3, "message-format")?,
                    settled: f.boolean(4, "settled")?,
                    more: f.boolean(5, "more")?.unwrap_or(false),
                    state: decode_state(&f, 7)?,
                    aborted: f.boolean(9, "aborted")?.unwrap_or(false),
                })
            }
            0x15 => {
                let role = f.boolean(0, "role")?;
                let first = f.uint(1, "first")?;
                Performative::Disposition(Disposition {
                    role_receiver: f.required(0, "role", role)?,
                    first: f.required(1, "first", first)?,
                    last: f.uint(2, "last")?,
                    settled: f.boolean(3, "settled")?.unwrap_or(false),
                    state: decode_state(&f, 4)?,
                })
            }
            0x16 => {
                let handle = f.uint(0, "handle")?;
                Performative::Detach {
                    handle: f.required(0, "handle", handle)?,
                    closed: f.boolean(1, "closed")?.unwrap_or(false),
                    error: decode_error(&f, 2)?,
                }
            }
            0x17 => Performative::End(decode_error(&f, 0)?),
            _ => Performative::Close(decode_error(&f, 0)?),
        };
        let payload = if matches!(p, Performative::Transfer(_)) {
            payload
        } else {
            &[]
        };
        Ok((p, payload))
    }
}
