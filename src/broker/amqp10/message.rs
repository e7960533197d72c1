//! A delivered AMQP 1.0 message made into what a backup record keeps (issue 39;
//! docs/segment-format.md "Record kinds"): the message as its publisher sent it, without what
//! the broker owns.
//!
//! A delivery is a sequence of sections (part 3, 3.2), each a described value: header
//! (0x70), delivery-annotations (0x71), message-annotations (0x72), then the bare message:
//! properties (0x73), application-properties (0x74), data (0x75) / amqp-sequence (0x76) /
//! amqp-value (0x77), footer (0x78). What [`split`] keeps:
//! - the header without `first-acquirer` and `delivery-count` (the broker's delivery state),
//!   re-encoded, trailing nulls dropped; no header section when nothing is left;
//! - no delivery-annotations (they are for this delivery only);
//! - the message annotations without the ones the broker adds on routing (`x-exchange`,
//!   `x-routing-key`, whose values are returned apart), re-encoded only when one was removed;
//!   no section when nothing is left;
//! - the bare message byte for byte (every byte from the first bare section to the end).

use super::codec::{decode_value, encode_value, Value};
use crate::error::{Error, Result};

/// Section descriptor codes (part 3, 3.2).
pub const HEADER: u64 = 0x70;
/// delivery-annotations.
pub const DELIVERY_ANNOTATIONS: u64 = 0x71;
/// message-annotations.
pub const MESSAGE_ANNOTATIONS: u64 = 0x72;
/// properties (the first section of the bare message).
pub const PROPERTIES: u64 = 0x73;
/// footer (the last section).
pub const FOOTER: u64 = 0x78;

/// Message annotations RabbitMQ adds when it routes a message (`mc_amqp.erl`): kept as the
/// record's exchange and routing key, not in the message.
const ROUTING_ANNOTATIONS: [&str; 2] = ["x-exchange", "x-routing-key"];

/// Message annotations a quorum queue adds on delivery (measured on 4.0.5 and 4.3.6,
/// tests/amqp10_client.rs `quorum_give_back_counts_and_order`): its count of failed
/// deliveries (on 4.0-4.2 every give-back raises it while the header's delivery-count stays)
/// and of acquisitions. The broker's delivery state: not kept.
const DELIVERY_STATE_ANNOTATIONS: [&str; 2] = ["x-delivery-count", "x-acquired-count"];

/// A delivered message split into what a record keeps and the broker's delivery state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Split {
    /// The message as its publisher sent it (see the module documentation).
    pub message: Vec<u8>,
    /// The `x-exchange` annotation (empty when absent).
    pub exchange: String,
    /// The `x-routing-key` annotation (empty when absent).
    pub routing_key: String,
    /// Failed deliveries so far: the larger of the header's `delivery-count` and the
    /// `x-delivery-count` annotation (0 when both are absent), the count a quorum queue's
    /// delivery limit is applied to.
    pub delivery_count: u64,
    /// The header's `first-acquirer` (false when absent).
    pub first_acquirer: bool,
}

/// The descriptor code of a section (`None` when it is not a described value with a ulong
/// or a known symbolic descriptor).
pub fn section_code(v: &Value) -> Option<u64> {
    let Value::Described(d, _) = v else {
        return None;
    };
    match d.as_ref() {
        Value::Ulong(c) => Some(*c),
        Value::Symbol(s) => {
            let names = [
                "amqp:header:list",
                "amqp:delivery-annotations:map",
                "amqp:message-annotations:map",
                "amqp:properties:list",
                "amqp:application-properties:map",
                "amqp:data:binary",
                "amqp:amqp-sequence:list",
                "amqp:amqp-value:*",
                "amqp:footer:map",
            ];
            names.iter().position(|n| n == s).map(|i| HEADER + i as u64)
        }
        _ => None,
    }
}

/// Decodes every section of `bytes` with its byte span, in order.
///
/// Errors: `Error::Serialization` (`Invalid AMQP 1.0 message: ...`) when a section does not
/// decode or is not a section.
pub fn sections(bytes: &[u8]) -> Result<Vec<(u64, Value, std::ops::Range<usize>)>> {
    let mut out = Vec::new();
    let mut p = 0;
    while p < bytes.len() {
        let (v, n) = decode_value(&bytes[p..])?;
        let code = section_code(&v)
            .filter(|c| (HEADER..=FOOTER).contains(c))
            .ok_or_else(|| {
                Error::Serialization(format!(
                    "Invalid AMQP 1.0 message: the value at byte {p} is not a message section"
                ))
            })?;
        if out.last().is_some_and(|(last, _, _)| *last > code)
            || (code < PROPERTIES && out.iter().any(|(c, _, _)| *c == code))
        {
            return Err(Error::Serialization(format!(
                "Invalid AMQP 1.0 message: section 0x{code:x} at byte {p} is out of order"
            )));
        }
        out.push((code, v, p..p + n));
        p += n;
    }
    Ok(out)
}

fn as_u64(v: &Value) -> u64 {
    match v {
        Value::Uint(n) => u64::from(*n),
        Value::Ulong(n) => *n,
        Value::Ubyte(n) => u64::from(*n),
        Value::Ushort(n) => u64::from(*n),
        _ => 0,
    }
}

fn string_of(v: &Value) -> String {
    match v {
        Value::String(s) | Value::Symbol(s) => s.clone(),
        Value::InvalidString(b) | Value::Binary(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    }
}

fn described(code: u64, body: Value) -> Value {
    Value::Described(Box::new(Value::Ulong(code)), Box::new(body))
}

/// Splits a delivered message (its bytes as transferred) as the module documentation says.
///
/// Errors: `Error::Serialization` when it does not decode as AMQP 1.0 sections.
pub fn split(bytes: &[u8]) -> Result<Split> {
    let mut out = Split::default();
    let mut bare_from = bytes.len();
    for (code, v, span) in sections(bytes)? {
        let Value::Described(_, body) = v else {
            continue;
        };
        match code {
            HEADER => {
                let Value::List(mut fields) = *body else {
                    return Err(Error::Serialization(
                        "Invalid AMQP 1.0 message: the header is not a list".into(),
                    ));
                };
                if let Some(c) = fields.get(4) {
                    out.delivery_count = as_u64(c);
                }
                out.first_acquirer = matches!(fields.get(3), Some(Value::Bool(true)));
                fields.truncate(3);
                while matches!(fields.last(), Some(Value::Null)) {
                    fields.pop();
                }
                if !fields.is_empty() {
                    encode_value(&described(HEADER, Value::List(fields)), &mut out.message);
                }
            }
            DELIVERY_ANNOTATIONS => {}
            MESSAGE_ANNOTATIONS => {
                let Value::Map(entries) = *body else {
                    return Err(Error::Serialization(
                        "Invalid AMQP 1.0 message: the message annotations are not a map".into(),
                    ));
                };
                let before = entries.len();
                let mut kept = Vec::with_capacity(before);
                for (k, v) in entries {
                    match k {
                        Value::Symbol(ref s) if s == ROUTING_ANNOTATIONS[0] => {
                            out.exchange = string_of(&v)
                        }
                        Value::Symbol(ref s) if s == ROUTING_ANNOTATIONS[1] => {
                            out.routing_key = string_of(&v)
                        }
                        Value::Symbol(ref s) if s == DELIVERY_STATE_ANNOTATIONS[0] => {
                            let n = match v {
                                Value::Long(n) => u64::try_from(n).unwrap_or(0),
                                Value::Int(n) => u64::try_from(n).unwrap_or(0),
                                ref other => as_u64(other),
                            };
                            out.delivery_count = out.delivery_count.max(n);
                        }
                        Value::Symbol(ref s) if s == DELIVERY_STATE_ANNOTATIONS[1] => {}
                        _ => kept.push((k, v)),
                    }
                }
                if kept.len() == before {
                    out.message.extend_from_slice(&bytes[span]);
                } else if !kept.is_empty() {
                    encode_value(
                        &described(MESSAGE_ANNOTATIONS, Value::Map(kept)),
                        &mut out.message,
                    );
                }
            }
            _ => {
                bare_from = span.start;
                break;
            }
        }
    }
    out.message.extend_from_slice(&bytes[bare_from..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        encode_value(v, &mut out);
        out
    }
    fn sym(s: &str) -> Value {
        Value::Symbol(s.into())
    }

    fn bare() -> Vec<u8> {
        let mut b = enc(&described(
            PROPERTIES,
            Value::List(vec![
                Value::Ulong(7),
                Value::Null,
                Value::String("to".into()),
            ]),
        ));
        b.extend(enc(&described(
            0x74,
            Value::Map(vec![(Value::String("k".into()), sym("v"))]),
        )));
        b.extend(enc(&described(0x75, Value::Binary(b"one".to_vec()))));
        b.extend(enc(&described(0x75, Value::Binary(b"two".to_vec()))));
        b.extend(enc(&described(
            FOOTER,
            Value::Map(vec![(sym("f"), Value::Int(1))]),
        )));
        b
    }

    #[test]
    fn broker_state_and_routing_are_taken_out_the_bare_message_kept() {
        let mut d = enc(&described(
            HEADER,
            Value::List(vec![
                Value::Bool(true),
                Value::Ubyte(6),
                Value::Null,
                Value::Bool(false),
                Value::Uint(3),
            ]),
        ));
        d.extend(enc(&described(
            DELIVERY_ANNOTATIONS,
            Value::Map(vec![(sym("x-opt-d"), Value::Int(1))]),
        )));
        d.extend(enc(&described(
            MESSAGE_ANNOTATIONS,
            Value::Map(vec![
                (sym("x-opt-mine"), Value::Long(-1)),
                (sym("x-delivery-count"), Value::Long(5)),
                (sym("x-acquired-count"), Value::Long(9)),
                (sym("x-exchange"), Value::String("ex".into())),
                (sym("x-routing-key"), Value::String("rk".into())),
            ]),
        )));
        d.extend(bare());
        let s = split(&d).unwrap();
        assert_eq!((s.exchange.as_str(), s.routing_key.as_str()), ("ex", "rk"));
        assert_eq!((s.delivery_count, s.first_acquirer), (5, false));
        let mut want = enc(&described(
            HEADER,
            Value::List(vec![Value::Bool(true), Value::Ubyte(6)]),
        ));
        want.extend(enc(&described(
            MESSAGE_ANNOTATIONS,
            Value::Map(vec![(sym("x-opt-mine"), Value::Long(-1))]),
        )));
        want.extend(bare());
        assert_eq!(s.message, want);
    }

    #[test]
    fn sections_left_empty_are_dropped() {
        let mut d = enc(&described(
            HEADER,
            Value::List(vec![
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Bool(true),
                Value::Uint(0),
            ]),
        ));
        d.extend(enc(&described(
            MESSAGE_ANNOTATIONS,
            Value::Map(vec![
                (sym("x-exchange"), Value::String(String::new())),
                (sym("x-routing-key"), Value::String("q".into())),
            ]),
        )));
        d.extend(bare());
        let s = split(&d).unwrap();
        assert_eq!(s.message, bare());
        assert!(s.first_acquirer);
        assert_eq!(s.routing_key, "q");
        // A bare message alone is kept as it is; an amqp-value body too.
        assert_eq!(split(&bare()).unwrap().message, bare());
        let v = enc(&described(0x77, Value::List(vec![Value::Int(1)])));
        assert_eq!(split(&v).unwrap().message, v);
    }

    #[test]
    fn annotations_without_routing_keep_their_bytes() {
        // map32 encoding of a small map: not re-encoded when nothing is removed.
        let mut d = vec![
            0x00, 0x53, 0x72, 0xd1, 0, 0, 0, 8, 0, 0, 0, 2, 0xa3, 1, b'a', 0x41,
        ];
        d.extend(bare());
        assert_eq!(split(&d).unwrap().message, d);
    }

    #[test]
    fn what_is_not_a_message_is_an_error_not_a_panic() {
        assert!(split(&enc(&Value::Int(1))).is_err());
        let mut wrong_order = bare();
        wrong_order.extend(enc(&described(HEADER, Value::List(vec![]))));
        assert!(split(&wrong_order).is_err());
        let b = bare();
        for cut in 1..b.len() {
            let _ = split(&b[..cut]);
        }
        assert!(split(&enc(&described(HEADER, Value::Int(1)))).is_err());
        assert_eq!(split(&[]).unwrap().message, Vec::<u8>::new());
    }
}
