//! AMQP 0-9-1 frames as a broker sends them: `parse_frame` over the whole input, frame after
//! frame, then each payload by its type (`Method::decode`, `decode_content_header`).
//!
//! Invariants beyond "no panic": every error is an `AMQP error:`; a frame never claims more
//! than the buffer or the negotiated maximum; a decoded method or content header re-encodes
//! to bytes that decode and re-encode to the same bytes (a fixed point after one round), and a
//! method keeps its class and method ids (a text read lossily may outgrow its short string:
//! encoding it is then an error, not a panic).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::amqp::codec::{
    decode_content_header, decode_properties, parse_frame, put_content_header_frame,
    put_properties, Decoder, Method, FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
};
use rmq_backup::Error;

/// The frame maximum the client negotiates (131072 on the wire, payload without 8 bytes).
const MAX_PAYLOAD: usize = 131_072 - 8;

fn amqp(e: &Error) {
    assert!(matches!(e, Error::Amqp(_)), "not an AMQP error: {e:?}");
    assert!(e.to_string().starts_with("AMQP error: "), "{e}");
}

fn check_method(payload: &[u8]) {
    let m = match Method::decode(payload) {
        Ok(m) => m,
        Err(e) => return amqp(&e),
    };
    let ids = (
        u16::from_be_bytes([payload[0], payload[1]]),
        u16::from_be_bytes([payload[2], payload[3]]),
    );
    if let Method::Unknown {
        class_id,
        method_id,
    } = m
    {
        assert_eq!((class_id, method_id), ids);
        return;
    }
    assert_eq!(m.ids(), ids, "{m:?}");
    let mut once = Vec::new();
    if let Err(e) = m.encode(&mut once) {
        // Decoded values fit their wire types again, but for the texts the decoder reads
        // lossily (each byte that is not UTF-8 becomes a 3-byte U+FFFD): those may outgrow a
        // short string, which encoding refuses with an error.
        amqp(&e);
        let lossy = matches!(
            m,
            Method::ConnectionClose { .. }
                | Method::ChannelClose { .. }
                | Method::ConnectionBlocked { .. }
        );
        assert!(lossy, "{m:?} decoded but does not encode: {e}");
        return;
    }
    let back = Method::decode(&once).unwrap_or_else(|e| panic!("{m:?} re-encoded: {e}"));
    let mut twice = Vec::new();
    back.encode(&mut twice).unwrap();
    assert_eq!(once, twice, "{m:?} vs {back:?}");
}

fn check_header(payload: &[u8]) {
    let h = match decode_content_header(payload) {
        Ok(h) => h,
        Err(e) => return amqp(&e),
    };
    let p = match h.properties {
        Ok(p) => p,
        Err(e) => return amqp(&e),
    };
    let mut once = Vec::new();
    put_properties(&mut once, &p).unwrap_or_else(|e| panic!("{p:?} does not encode: {e}"));
    let mut d = Decoder::new(&once);
    let back = decode_properties(&mut d).unwrap_or_else(|e| panic!("{p:?} re-encoded: {e}"));
    assert!(d.is_empty(), "{p:?}: bytes left over");
    let mut twice = Vec::new();
    put_properties(&mut twice, &back).unwrap();
    assert_eq!(once, twice, "{p:?} vs {back:?}");
    // The whole content header frame the client would write parses back to the same header.
    let mut frame = Vec::new();
    put_content_header_frame(&mut frame, 1, h.body_size, &back, 0).unwrap();
    let (f, n) = parse_frame(&frame, usize::MAX).unwrap().unwrap();
    assert_eq!(n, frame.len());
    let again = decode_content_header(f.payload).unwrap();
    assert_eq!(again.body_size, h.body_size);
    let mut thrice = Vec::new();
    put_properties(&mut thrice, &again.properties.unwrap()).unwrap();
    assert_eq!(once, thrice);
}

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    loop {
        match parse_frame(rest, MAX_PAYLOAD) {
            Ok(Some((frame, consumed))) => {
                assert!(consumed <= rest.len() && consumed == frame.payload.len() + 8);
                assert!(frame.payload.len() <= MAX_PAYLOAD);
                match frame.kind {
                    FRAME_METHOD => check_method(frame.payload),
                    FRAME_HEADER => check_header(frame.payload),
                    FRAME_BODY | FRAME_HEARTBEAT => {}
                    other => panic!("parse_frame let frame type {other} through"),
                }
                rest = &rest[consumed..];
            }
            Ok(None) => break,
            Err(e) => {
                amqp(&e);
                break;
            }
        }
    }
    // A payload on its own, whatever the frame around it would have said.
    check_method(data);
    check_header(data);
});
