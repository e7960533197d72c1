//! AMQP 1.0 frames and performatives as the AMQP 1.0 client's reader thread reads them
//! (`broker::amqp10::frame::FrameReader`, `performative::Performative::decode`,
//! `sasl::decode_sasl`): frame headers, every performative, delivery states, errors.
//!
//! Invariants beyond "no panic": a bad frame is an `AMQP error: malformed AMQP 1.0 frame:`
//! (or the end of the input); a decoded performative re-encodes to bytes that decode to a
//! performative that re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::amqp::transport::ReadFail;
use rmq_backup::broker::amqp10::frame::FrameReader;
use rmq_backup::broker::amqp10::performative::Performative;
use rmq_backup::broker::amqp10::sasl::decode_sasl;

fuzz_target!(|data: &[u8]| {
    let mut frames = FrameReader::new(std::io::Cursor::new(data), 1 << 16);
    loop {
        let f = match frames.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) | Err(ReadFail::Eof) | Err(ReadFail::Io(_)) => return,
            Err(ReadFail::Protocol(e)) => {
                assert!(e.to_string().starts_with("AMQP error: "), "{e}");
                return;
            }
        };
        let _ = decode_sasl(f.body);
        let Ok((p, _payload)) = Performative::decode(f.body) else {
            continue;
        };
        let mut once = Vec::new();
        p.encode(&mut once);
        let (back, rest) = Performative::decode(&once).expect("re-encoded performative");
        assert!(rest.is_empty());
        let mut twice = Vec::new();
        back.encode(&mut twice);
        assert_eq!(once, twice, "{p:?} vs {back:?}");
    }
});
