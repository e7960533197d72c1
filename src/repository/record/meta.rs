//! A record's metadata in segment format version 2 (docs/segment-format.md): every BackupRecord
//! field but the body, as one compact JSON object in SPEC.md's key order,
//!
//! ```json
//! {"properties":{"content_type":null,...,"cluster_id":null},"headers":[["k",{"Bool":true}]],
//!  "exchange":"ex","routing_key":"rk","delivery_tag":1,"redelivered":false,
//!  "backed_up_at":1700000000000,"source_queue":"q","source_vhost":"/"}
//! ```
//!
//! exactly the bytes version 1 writes after its `"body":[...]` member, with `{` for the `,`.
//! A record whose body is not a 0-9-1 body adds one last key, `"message_format":"amqp-1.0"`
//! (only here: version 1 cannot hold it). A reader older than the key refuses such a record
//! (its compact path expects `}` after `source_vhost`, its serde_json path denies unknown
//! fields), never reads its body as a 0-9-1 body.
//! The body itself is stored beside it as raw bytes (`crate::repository::segment`), so neither side needs
//! the JSON number array.

use serde::Deserialize;

use super::binary::{read_binary, write_binary, BINARY_TAG};
use super::tail::parse_meta;
use super::write::write_fields;
use super::{BackupProperties, BackupRecord, HeaderTable, MessageFormat};
use crate::error::{Error, Result};

/// Appends the metadata JSON of `rec` (everything but its body) to `out`.
///
/// The bytes are `serde_json`'s compact output of those fields in SPEC.md's order (written by
/// `write.rs` without serde), the same bytes [`super::encode_record`] writes after the body.
pub fn encode_meta(rec: &BackupRecord, out: &mut Vec<u8>) {
    write_fields(rec, b'{', out);
}

/// Appends the metadata of `rec` in segment format version 3: binary (`binary.rs`) when the
/// record holds its properties as the broker sent them ([`BackupRecord::wire`]), else the
/// JSON of [`encode_meta`].
pub fn encode_meta_v3(rec: &BackupRecord, out: &mut Vec<u8>) {
    if !write_binary(rec, out) {
        encode_meta(rec, out);
    }
}

/// The metadata object as serde_json reads it when it is not in the compact form: the same
/// keys as BackupRecord without `body`, any order and whitespace; unknown keys (`body`
/// included) are refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    properties: BackupProperties,
    headers: HeaderTable,
    exchange: String,
    routing_key: String,
    delivery_tag: u64,
    redelivered: bool,
    backed_up_at: i64,
    source_queue: String,
    source_vhost: String,
    #[serde(default)]
    message_format: Option<MessageFormat>,
}

/// Parses a version 2 or 3 record: its metadata, JSON (as [`encode_meta`] writes it, or any
/// JSON object of those keys) or binary (its first byte 0x00, as [`encode_meta_v3`] writes
/// it), and its body, which becomes the record's body as it is (not copied).
///
/// Errors: `Error::Serialization` (`Invalid backup record metadata: {serde_json's message}`,
/// or what is wrong with binary metadata) when `meta` is neither.
pub fn decode_meta(meta: &[u8], body: Vec<u8>) -> Result<BackupRecord> {
    if meta.first() == Some(&BINARY_TAG) {
        return read_binary(meta, body);
    }
    if let Some(mut rec) = parse_meta(meta) {
        rec.body = body;
        return Ok(rec);
    }
    let m: Meta = serde_json::from_slice(meta)
        .map_err(|e| Error::Serialization(format!("Invalid backup record metadata: {e}")))?;
    Ok(BackupRecord {
        body,
        properties: m.properties,
        headers: m.headers,
        exchange: m.exchange,
        routing_key: m.routing_key,
        delivery_tag: m.delivery_tag,
        redelivered: m.redelivered,
        backed_up_at: m.backed_up_at,
        source_queue: m.source_queue,
        source_vhost: m.source_vhost,
        message_format: m.message_format,
        wire: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::record::{encode_record, BackupHeaderValue};

    fn full() -> BackupRecord {
        BackupRecord {
            body: vec![0, 1, 2, 255],
            properties: BackupProperties {
                content_type: Some("application/json".into()),
                content_encoding: Some("gzip".into()),
                delivery_mode: Some(2),
                priority: Some(9),
                correlation_id: Some("corr \"quoted\"".into()),
                reply_to: Some("amq.rabbitmq.reply-to".into()),
                expiration: Some("60000".into()),
                message_id: Some("m-1".into()),
                timestamp: Some(-1),
                type_field: Some("t".into()),
                user_id: Some("guest".into()),
                app_id: Some("app é".into()),
                cluster_id: Some("c".into()),
            },
            headers: vec![
                ("s".into(), BackupHeaderValue::LongString("v".into())),
                ("n".into(), BackupHeaderValue::Long(-5)),
                ("d".into(), BackupHeaderValue::Double(1.5)),
                ("f".into(), BackupHeaderValue::Float(f32::NAN)),
                ("b".into(), BackupHeaderValue::Bytes(vec![1, 2])),
                ("v".into(), BackupHeaderValue::Void),
                (
                    "t".into(),
                    BackupHeaderValue::Table(vec![("x".into(), BackupHeaderValue::Bool(true))]),
                ),
                (
                    "a".into(),
                    BackupHeaderValue::Array(vec![BackupHeaderValue::Timestamp(7)]),
                ),
            ],
            exchange: "ex".into(),
            routing_key: "rk/é".into(),
            delivery_tag: u64::MAX,
            redelivered: true,
            backed_up_at: 1_700_000_000_123,
            source_queue: "q".into(),
            source_vhost: "/".into(),
            message_format: None,
            wire: None,
        }
    }

    /// Compares two records, NaN headers by their being NaN.
    fn same(a: &BackupRecord, b: &BackupRecord) {
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn metadata_is_version_1s_tail_with_a_brace() {
        let rec = full();
        let mut v1 = Vec::new();
        encode_record(&rec, &mut v1);
        let mut meta = Vec::new();
        encode_meta(&rec, &mut meta);
        let tail = v1.iter().position(|&b| b == b']').unwrap() + 1;
        assert_eq!(meta[0], b'{');
        assert_eq!(&meta[1..], &v1[tail + 1..]);
        // Every field but the body, in SPEC.md's order.
        let text = std::str::from_utf8(&meta).unwrap();
        assert!(text.starts_with("{\"properties\":{\"content_type\":\"application/json\""));
        assert!(text.ends_with(",\"source_queue\":\"q\",\"source_vhost\":\"/\"}"));
        assert!(!text.contains("\"body\""));
    }

    #[test]
    fn round_trip_of_every_field_empty_and_big_bodies() {
        for body in [
            Vec::new(),
            vec![7u8],
            (0..=255u8).cycle().take(5 << 20).collect(),
        ] {
            let rec = BackupRecord { body, ..full() };
            let mut meta = Vec::new();
            encode_meta(&rec, &mut meta);
            same(&decode_meta(&meta, rec.body.clone()).unwrap(), &rec);
        }
        let plain = BackupRecord {
            properties: BackupProperties::default(),
            headers: Vec::new(),
            ..full()
        };
        let mut meta = Vec::new();
        encode_meta(&plain, &mut meta);
        assert_eq!(decode_meta(&meta, plain.body.clone()).unwrap(), plain);
    }

    #[test]
    fn other_forms_go_through_serde_json_with_the_same_result() {
        let rec = full();
        let mut meta = Vec::new();
        encode_meta(&rec, &mut meta);
        let v: serde_json::Value = serde_json::from_slice(&meta).unwrap();
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        same(&decode_meta(&pretty, rec.body.clone()).unwrap(), &rec);
    }

    #[test]
    fn damaged_metadata_is_an_error_not_a_panic() {
        let mut meta = Vec::new();
        encode_meta(&full(), &mut meta);
        for cut in 0..meta.len() {
            let e = decode_meta(&meta[..cut], Vec::new()).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("Serialization error: Invalid backup record metadata"),
                "{e}"
            );
        }
        let mut flipped = meta.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0x5a;
            let _ = decode_meta(&flipped, Vec::new());
            flipped[i] ^= 0x5a;
        }
        // A body member has no place in the metadata.
        let with_body = [b"{\"body\":[1],".as_slice(), &meta[1..]].concat();
        assert!(decode_meta(&with_body, Vec::new()).is_err());
        assert!(decode_meta(b"", Vec::new()).is_err());
        assert!(decode_meta(b"[]", Vec::new()).is_err());
    }
}
