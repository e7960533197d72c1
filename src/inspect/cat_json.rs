//! The JSON line `cat --format jsonl` writes for one record: where it came from, its
//! properties, its headers each with its AMQP type, and its body as text or base64.
//!
//! ```json
//! {"vhost":"/","queue":"orders","exchange":"","routing_key":"orders","delivery_tag":1,
//!  "redelivered":false,"backed_up_at":1764068286123,"backed_up_at_utc":"2026-11-25T10:58:06.123Z",
//!  "properties":{"content_type":"application/json",...},
//!  "headers":[{"name":"x-count","type":"LongInt","value":3}],
//!  "body_encoding":"utf8","body_bytes":13,"body":"{\"id\": 42}"}
//! ```
//!
//! Header types are the variant names of the record format (SPEC.md BackupHeaderValue and
//! `crate::repository::record::BackupHeaderValue`: `LongString`, `ShortShortInt`, `LongInt`, `Timestamp`,
//! `Decimal`, `Table`, `Array`, ...). Byte values (`Bytes`, and long strings that are not valid
//! UTF-8) carry `"encoding":"base64"`; a `Table`'s value is a list of such header objects, an
//! `Array`'s a list of `{"type","value"}` objects; `Void`'s value is null; `Decimal`'s is
//! `{"scale","value"}` (value / 10^scale); non-finite floats are the strings `NaN`, `Infinity`,
//! `-Infinity`.

use crate::repository::record::{BackupHeaderValue, BackupProperties, BackupRecord};
use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Value};
use std::borrow::Cow;

/// One record as `cat` writes it (see the module documentation for the shape).
#[derive(Serialize)]
pub struct CatLine<'a> {
    vhost: &'a str,
    queue: &'a str,
    exchange: &'a str,
    routing_key: &'a str,
    delivery_tag: u64,
    redelivered: bool,
    /// Epoch ms.
    backed_up_at: i64,
    /// The same instant, RFC 3339 UTC with milliseconds.
    backed_up_at_utc: String,
    properties: &'a BackupProperties,
    headers: Vec<Header<'a>>,
    /// `utf8` or `base64` ([`body_is_text`]).
    body_encoding: &'static str,
    /// Body length in bytes.
    body_bytes: usize,
    body: Cow<'a, str>,
    /// `amqp-1.0` for a record holding an AMQP 1.0 message (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    message_format: Option<&'static str>,
    /// Such a record's sections decoded, each value with its AMQP type
    /// (`super::cat_amqp10`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    sections: Option<Value>,
}

impl<'a> CatLine<'a> {
    /// The line of `r`.
    pub fn of(r: &'a BackupRecord) -> CatLine<'a> {
        let text = body_is_text(&r.properties)
            .then(|| std::str::from_utf8(&r.body).ok())
            .flatten();
        let (body_encoding, body) = match text {
            Some(t) => ("utf8", Cow::Borrowed(t)),
            None => ("base64", Cow::Owned(b64(&r.body))),
        };
        CatLine {
            vhost: &r.source_vhost,
            queue: &r.source_queue,
            exchange: &r.exchange,
            routing_key: &r.routing_key,
            delivery_tag: r.delivery_tag,
            redelivered: r.redelivered,
            backed_up_at: r.backed_up_at,
            backed_up_at_utc: crate::run::units::rfc3339_ms(r.backed_up_at),
            properties: &r.properties,
            headers: r.headers.iter().map(|(k, v)| header(Some(k), v)).collect(),
            body_encoding,
            body_bytes: r.body.len(),
            body,
            message_format: r.message_format.map(|f| f.as_str()),
            sections: r
                .message_format
                .map(|_| super::cat_amqp10::sections_json(&r.body)),
        }
    }
}

/// True when the content type says text or JSON (`text/*`, `application/json`, `*+json`,
/// parameters such as `; charset=utf-8` ignored, case-insensitive) and no content encoding
/// other than `identity` is set. Such a body is written as text when it is valid UTF-8; every
/// other body as base64.
pub fn body_is_text(p: &BackupProperties) -> bool {
    let encoded = p
        .content_encoding
        .as_deref()
        .is_some_and(|e| !e.trim().is_empty() && !e.trim().eq_ignore_ascii_case("identity"));
    let Some(ct) = p.content_type.as_deref() else {
        return false;
    };
    let mime = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    !encoded && (mime.starts_with("text/") || mime == "application/json" || mime.ends_with("+json"))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One header as `cat` writes it: `{"name","type"[,"encoding"],"value"}`, in this key order
/// (no name inside an array).
#[derive(Serialize)]
struct Header<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
    /// `base64` for byte values.
    #[serde(skip_serializing_if = "Option::is_none")]
    encoding: Option<&'static str>,
    value: HeaderValue<'a>,
}

/// A header's value: a JSON scalar, or the headers of a table or an array.
#[derive(Serialize)]
#[serde(untagged)]
enum HeaderValue<'a> {
    Json(Value),
    List(Vec<Header<'a>>),
}

fn header<'a>(name: Option<&'a str>, v: &'a BackupHeaderValue) -> Header<'a> {
    use BackupHeaderValue as H;
    use HeaderValue::{Json, List};
    let (kind, value, base64) = match v {
        H::LongString(s) => ("LongString", Json(json!(s)), false),
        H::LongStringBytes(b) => ("LongString", Json(json!(b64(b))), true),
        H::ShortString(s) => ("ShortString", Json(json!(s)), false),
        H::Long(n) => ("Long", Json(json!(n)), false),
        H::Short(n) => ("Short", Json(json!(n)), false),
        H::ShortShortInt(n) => ("ShortShortInt", Json(json!(n)), false),
        H::ShortShortUInt(n) => ("ShortShortUInt", Json(json!(n)), false),
        H::ShortInt(n) => ("ShortInt", Json(json!(n)), false),
        H::ShortUInt(n) => ("ShortUInt", Json(json!(n)), false),
        H::LongInt(n) => ("LongInt", Json(json!(n)), false),
        H::LongUInt(n) => ("LongUInt", Json(json!(n)), false),
        H::LongLongInt(n) => ("LongLongInt", Json(json!(n)), false),
        H::Bool(b) => ("Bool", Json(json!(b)), false),
        H::Bytes(b) => ("Bytes", Json(json!(b64(b))), true),
        H::Timestamp(t) => ("Timestamp", Json(json!(t)), false),
        // Shortest text of the f32 (1.1, not 1.100000023841858).
        H::Float(f) => (
            "Float",
            Json(float(f64::from(*f), format!("{f}").parse().ok())),
            false,
        ),
        H::Double(f) => ("Double", Json(float(*f, Some(*f))), false),
        H::Decimal { scale, value } => (
            "Decimal",
            Json(json!({"scale": scale, "value": value})),
            false,
        ),
        H::Void => ("Void", Json(Value::Null), false),
        H::Table(t) => (
            "Table",
            List(t.iter().map(|(k, v)| header(Some(k), v)).collect()),
            false,
        ),
        H::Array(a) => (
            "Array",
            List(a.iter().map(|v| header(None, v)).collect()),
            false,
        ),
    };
    Header {
        name,
        kind,
        encoding: base64.then_some("base64"),
        value,
    }
}

/// A float as a JSON number, or the string `NaN` / `Infinity` / `-Infinity`.
fn float(f: f64, shortest: Option<f64>) -> Value {
    if f.is_nan() {
        json!("NaN")
    } else if f.is_infinite() {
        json!(if f > 0.0 { "Infinity" } else { "-Infinity" })
    } else {
        json!(shortest.unwrap_or(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(ct: Option<&str>, enc: Option<&str>) -> BackupProperties {
        BackupProperties {
            content_type: ct.map(String::from),
            content_encoding: enc.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn text_rule() {
        assert!(body_is_text(&props(
            Some("text/plain; charset=utf-8"),
            None
        )));
        assert!(body_is_text(&props(
            Some("Application/JSON"),
            Some("identity")
        )));
        assert!(body_is_text(&props(Some("application/vnd.api+json"), None)));
        assert!(!body_is_text(&props(
            Some("application/json"),
            Some("gzip")
        )));
        assert!(!body_is_text(&props(
            Some("application/octet-stream"),
            None
        )));
        assert!(!body_is_text(&props(None, None)));
    }

    #[test]
    fn headers_keep_their_types() {
        let table = BackupHeaderValue::Table(vec![
            ("f".into(), BackupHeaderValue::Float(1.1)),
            ("n".into(), BackupHeaderValue::Double(f64::NAN)),
            ("b".into(), BackupHeaderValue::LongStringBytes(vec![0xff])),
            (
                "a".into(),
                BackupHeaderValue::Array(vec![BackupHeaderValue::Void]),
            ),
        ]);
        let h = header(Some("t"), &table);
        assert_eq!(
            serde_json::to_string(&h).unwrap(),
            r#"{"name":"t","type":"Table","value":[{"name":"f","type":"Float","value":1.1},{"name":"n","type":"Double","value":"NaN"},{"name":"b","type":"LongString","encoding":"base64","value":"/w=="},{"name":"a","type":"Array","value":[{"type":"Void","value":null}]}]}"#
        );
    }

    #[test]
    fn utc_with_millis() {
        use crate::run::units::rfc3339_ms;
        assert_eq!(rfc3339_ms(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }
}
