//! AMQP 1.0 messages as streams store them: `decode_message` (sections a record carries,
//! others stepped over) and `to_record`, the record a stream message is backed up as.
//!
//! Invariants beyond "no panic": errors are `Serialization error: Invalid AMQP 1.0 message:`;
//! a message that a record carries re-encodes (`encode_message`) to bytes that decode to the
//! same sections (arrays of nulls aside, see `has_null_array`); `to_record` never fails, stores a message it cannot map as its bytes, whole
//! (with the raw-body header), and the record it gives survives the record codec.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::repository::record::{decode_record, encode_record, BackupHeaderValue};
use rmq_backup::broker::stream::amqp10::{
    decode_message, encode_message, to_record, Conversion, Message, Origin, Value, RAW_BODY_HEADER,
    RAW_BODY_VALUE,
};
use rmq_backup::Error;

/// True when `v` holds an array of nulls. `encode_value` writes it as the AMQP 1.0 spec says,
/// a constructor and no bytes per element, but `decode_value` refuses, by design, a compound
/// announcing more elements than it has bytes (src/broker/stream/amqp10/tests.rs
/// `zero_width_elements_cannot_outnumber_the_bytes`): such an encoding may not read back.
fn has_null_array(v: &Value) -> bool {
    match v {
        Value::Array(d, items) => {
            items.first() == Some(&Value::Null)
                || d.as_deref().is_some_and(has_null_array)
                || items.iter().any(has_null_array)
        }
        Value::List(items) => items.iter().any(has_null_array),
        Value::Map(pairs) => pairs
            .iter()
            .any(|(k, v)| has_null_array(k) || has_null_array(v)),
        Value::Described(d, v) => has_null_array(d) || has_null_array(v),
        _ => false,
    }
}

fn message_has_null_array(m: &Message) -> bool {
    m.properties.iter().any(has_null_array)
        || m.header.iter().flatten().any(has_null_array)
        || m.message_annotations
            .iter()
            .chain(m.application_properties.iter())
            .any(|(k, v)| has_null_array(k) || has_null_array(v))
}

fuzz_target!(|data: &[u8]| {
    match decode_message(data) {
        Ok(m) if m.not_carried.is_none() => {
            let once = encode_message(&m);
            match decode_message(&once) {
                Ok(back) => {
                    assert_eq!(back.not_carried, None, "{m:?}");
                    assert_eq!(encode_message(&back), once, "{m:?} vs {back:?}");
                }
                Err(e)
                    if message_has_null_array(&m)
                        && e.message().contains("elements announced in") => {}
                Err(e) => panic!("{m:?} re-encoded: {e}"),
            }
        }
        Ok(_) => {}
        Err(e) => {
            assert!(matches!(e, Error::Serialization(_)), "{e:?}");
            assert!(
                e.to_string()
                    .starts_with("Serialization error: Invalid AMQP 1.0 message: "),
                "{e}"
            );
        }
    }
    // Every broker's mapping: before 3.13, 3.13 to 4.1, 4.2 and later.
    for conversion in [
        Conversion::MsgRecord,
        Conversion::Container,
        Conversion::ContainerQueueAddresses,
    ] {
        let at = Origin {
            conversion,
            stream: "s",
            vhost: "/",
            offset: 7,
            backed_up_at: 1_700_000_000_000,
        };
        let (record, why) = to_record(data, at);
        assert_eq!(record.delivery_tag, 7);
        if why.is_some() {
            assert_eq!(record.body, data, "a message stored whole keeps its bytes");
            assert_eq!(
                record.headers,
                vec![(
                    RAW_BODY_HEADER.to_string(),
                    BackupHeaderValue::LongString(RAW_BODY_VALUE.to_string())
                )]
            );
        }
        let mut json = Vec::new();
        encode_record(&record, &mut json);
        let back = decode_record(&json).unwrap_or_else(|e| panic!("{record:?}: {e}"));
        let mut again = Vec::new();
        encode_record(&back, &mut again);
        assert_eq!(json, again);
    }
});
