//! `cat`'s view of an AMQP 1.0 record (`message_format` `amqp-1.0`, issue 39): its sections
//! decoded, each value with its AMQP type: `{"section":"properties","value":{"type":"list",
//! "value":[{"type":"ulong","value":7},...]}}`. Binary values are base64 (`"encoding":
//! "base64"`), timestamps epoch ms, uuids in their hyphenated form, decimals their IEEE 754
//! bytes in base64.

use base64::Engine as _;
use serde_json::{json, Value as Json};

use crate::broker::amqp10::codec::Value;
use crate::broker::amqp10::message::sections;

const NAMES: [&str; 9] = [
    "header",
    "delivery_annotations",
    "message_annotations",
    "properties",
    "application_properties",
    "data",
    "amqp_sequence",
    "amqp_value",
    "footer",
];

/// The sections of an AMQP 1.0 message, or `{"error": ...}` when it does not decode.
pub fn sections_json(body: &[u8]) -> Json {
    match sections(body) {
        Ok(s) => Json::Array(
            s.into_iter()
                .map(|(code, v, _)| {
                    let inner = match v {
                        Value::Described(_, b) => *b,
                        other => other,
                    };
                    json!({
                        "section": NAMES.get((code - 0x70) as usize).copied().unwrap_or("unknown"),
                        "value": typed(&inner),
                    })
                })
                .collect(),
        ),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// One value with its AMQP type.
pub fn typed(v: &Value) -> Json {
    let t = |ty: &str, value: Json| json!({"type": ty, "value": value});
    match v {
        Value::Null => t("null", Json::Null),
        Value::Bool(b) => t("boolean", json!(b)),
        Value::Ubyte(n) => t("ubyte", json!(n)),
        Value::Byte(n) => t("byte", json!(n)),
        Value::Ushort(n) => t("ushort", json!(n)),
        Value::Short(n) => t("short", json!(n)),
        Value::Uint(n) => t("uint", json!(n)),
        Value::Int(n) => t("int", json!(n)),
        Value::Ulong(n) => t("ulong", json!(n)),
        Value::Long(n) => t("long", json!(n)),
        Value::Float(f) if f.is_finite() => t("float", json!(f)),
        Value::Float(f) => t("float", json!(f.to_string())),
        Value::Double(f) if f.is_finite() => t("double", json!(f)),
        Value::Double(f) => t("double", json!(f.to_string())),
        Value::Decimal(b) => json!({"type": "decimal", "encoding": "base64", "value": b64(b)}),
        Value::Char(c) => t(
            "char",
            json!(char::from_u32(*c).map_or_else(|| c.to_string(), String::from)),
        ),
        Value::Timestamp(ms) => t("timestamp", json!(ms)),
        Value::Uuid(u) => {
            let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
            t(
                "uuid",
                json!(format!(
                    "{}-{}-{}-{}-{}",
                    &h[..8],
                    &h[8..12],
                    &h[12..16],
                    &h[16..20],
                    &h[20..]
                )),
            )
        }
        Value::Binary(b) => json!({"type": "binary", "encoding": "base64", "value": b64(b)}),
        Value::String(s) => t("string", json!(s)),
        Value::InvalidString(b) => json!({"type": "string", "encoding": "base64", "value": b64(b)}),
        Value::Symbol(s) => t("symbol", json!(s)),
        Value::List(items) => t("list", Json::Array(items.iter().map(typed).collect())),
        Value::Map(entries) => t(
            "map",
            Json::Array(
                entries
                    .iter()
                    .map(|(k, v)| json!([typed(k), typed(v)]))
                    .collect(),
            ),
        ),
        Value::Array(_, items) => t("array", Json::Array(items.iter().map(typed).collect())),
        Value::Described(d, b) => {
            json!({"type": "described", "descriptor": typed(d), "value": typed(b)})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::amqp10::codec::encode_value;

    #[test]
    fn sections_with_their_types() {
        let mut b = Vec::new();
        let d = |code: u64, v: Value| Value::Described(Box::new(Value::Ulong(code)), Box::new(v));
        encode_value(
            &d(
                0x73,
                Value::List(vec![
                    Value::Ulong(7),
                    Value::Null,
                    Value::String("to".into()),
                ]),
            ),
            &mut b,
        );
        encode_value(&d(0x75, Value::Binary(vec![0, 255])), &mut b);
        let j = sections_json(&b);
        assert_eq!(
            j.to_string(),
            r#"[{"section":"properties","value":{"type":"list","value":[{"type":"ulong","value":7},{"type":"null","value":null},{"type":"string","value":"to"}]}},{"section":"data","value":{"encoding":"base64","type":"binary","value":"AP8="}}]"#
        );
        assert!(sections_json(&[0x54, 1]).get("error").is_some());
    }
}
