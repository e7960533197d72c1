//! SASL for AMQP 1.0 (OASIS AMQP 1.0, part 5 "Security", 5.3): the frames of the exchange
//! (`sasl-mechanisms`, `sasl-init`, `sasl-outcome`) and the PLAIN mechanism (RFC 4616), the one
//! RabbitMQ offers for a user name and password.

use super::codec::Value;
use super::frame::{put_frame, TYPE_SASL};
use super::performative::{descriptor_code, Fields};
use crate::error::{Error, Result};

fn malformed(detail: impl std::fmt::Display) -> Error {
    Error::Amqp(format!("malformed AMQP 1.0 SASL frame: {detail}"))
}

/// A SASL frame from the server.
#[derive(Debug, Clone, PartialEq)]
pub enum SaslFrame {
    /// `sasl-mechanisms` (5.3.3.1): the mechanisms the server offers.
    Mechanisms(Vec<String>),
    /// `sasl-challenge` (5.3.3.3).
    Challenge,
    /// `sasl-outcome` (5.3.3.6): 0 ok, 1 auth (bad credentials), 2 sys, 3 sys-perm,
    /// 4 sys-temp.
    Outcome(u8),
}

/// Decodes the body of a SASL frame.
///
/// Errors: `Error::Amqp("malformed AMQP 1.0 SASL frame: ...")` for bytes that are not a SASL
/// frame the client understands.
pub fn decode_sasl(body: &[u8]) -> Result<SaslFrame> {
    let (v, _) = super::codec::decode_value(body).map_err(|e| malformed(e.message()))?;
    let Value::Described(d, list) = &v else {
        return Err(malformed("not a described list"));
    };
    match descriptor_code(d) {
        Some(0x40) => {
            let f = Fields::of("sasl-mechanisms", list)?;
            let mechanisms = match f.get(0) {
                Some(Value::Symbol(s)) => vec![s.clone()],
                Some(Value::Array(_, items)) => items
                    .iter()
                    .filter_map(|m| match m {
                        Value::Symbol(s) => Some(s.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => return Err(malformed("sasl-mechanisms without mechanisms")),
            };
            Ok(SaslFrame::Mechanisms(mechanisms))
        }
        Some(0x42) => Ok(SaslFrame::Challenge),
        Some(0x44) => {
            let f = Fields::of("sasl-outcome", list)?;
            let code = f.ubyte(0, "code")?;
            Ok(SaslFrame::Outcome(f.required(0, "code", code)?))
        }
        _ => Err(malformed(format_args!("unexpected descriptor {d:?}"))),
    }
}

/// Appends a `sasl-init` frame (5.3.3.2) for PLAIN with `user` and `password` to `out`.
pub fn put_plain_init(out: &mut Vec<u8>, user: &str, password: &str) {
    let mut response = Vec::with_capacity(user.len() + password.len() + 2);
    response.push(0);
    response.extend_from_slice(user.as_bytes());
    response.push(0);
    response.extend_from_slice(password.as_bytes());
    let init = Value::Described(
        Box::new(Value::Ulong(0x41)),
        Box::new(Value::List(vec![
            Value::Symbol("PLAIN".to_string()),
            Value::Binary(response),
        ])),
    );
    put_frame(out, TYPE_SASL, 0, |b| super::codec::encode_value(&init, b));
}

/// What a SASL outcome code means, in words.
pub fn outcome_words(code: u8) -> &'static str {
    match code {
        1 => "authentication failed (bad credentials)",
        2 => "a system error of the server",
        3 => "a permanent system error of the server",
        4 => "a transient system error of the server",
        _ => "an unknown outcome",
    }
}
