//! Definitions files as a restore reads them from storage: `definitions::decompress_at_most` (none,
//! zstd, lz4: the first input byte chooses), the JSON parse, then `definitions::select` with
//! an empty selection and with selections of a vhost, a queue and an exchange the file names,
//! and `definitions::rename` with mappings of those names; `definitions::prepare` for a
//! RabbitMQ 4.3 target with `convert_mirrored_queues` (policy patterns compiled by the `regex`
//! crate, queues converted).
//!
//! Invariants beyond "no panic": decompression errors are `Compression error:`; an empty
//! selection keeps the file as it is; selecting names the file holds succeeds, keeps no more
//! entries than there were and renames keep the counts; selecting a name it lacks is a
//! `Configuration error:`; the result serialises (it is what would be posted to the broker);
//! the 4.3 migration of a whole file succeeds, keeps no more entries than there were and
//! serialises.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rmq_backup::broker::BrokerVersion;
use rmq_backup::config::{ConvertMirroredQueues, DefinitionsSelection, RestoreOptions};
use rmq_backup::broker::definitions::{
    decompress_at_most, deprecated, prepare, rename, select,
};
use rmq_backup::repository::segment::Compression;
use rmq_backup::Error;
use serde_json::Value;

const KINDS: [&str; 9] = [
    "users",
    "vhosts",
    "permissions",
    "policies",
    "parameters",
    "global_parameters",
    "queues",
    "exchanges",
    "bindings",
];

fn count(doc: &Value, k: &str) -> usize {
    doc.get(k).and_then(Value::as_array).map_or(0, Vec::len)
}

fn first_name(doc: &Value, k: &str) -> Option<String> {
    doc.get(k)?
        .as_array()?
        .first()?
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn check(doc: &Value, sel: DefinitionsSelection, expect_ok: bool) {
    let mut opts = RestoreOptions::default();
    for name in sel.vhosts.iter() {
        opts.vhost_mapping
            .insert(name.clone(), format!("{name}-renamed"));
    }
    for name in sel.queues.iter() {
        opts.queue_mapping
            .insert(name.clone(), format!("{name}-renamed"));
    }
    for name in sel.exchanges.iter() {
        opts.exchange_mapping
            .insert(name.clone(), format!("{name}-renamed"));
    }
    let selected = match select(doc.clone(), &sel) {
        Ok(s) => s,
        Err(e) => {
            assert!(!expect_ok, "{sel:?}: {e}");
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            return;
        }
    };
    for k in KINDS {
        assert!(
            count(&selected, k) <= count(doc, k),
            "{k} grew under {sel:?}"
        );
    }
    let renamed = rename(selected.clone(), &opts);
    for k in KINDS {
        assert_eq!(
            count(&renamed, k),
            count(&selected, k),
            "{k} changed by rename"
        );
    }
    serde_json::to_vec(&renamed).expect("definitions serialise");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let compression = match mode % 3 {
        0 => Compression::None,
        1 => Compression::Zstd,
        _ => Compression::Lz4,
    };
    // 16 MiB instead of the production 128 MiB (`DEFINITIONS_MAX_BYTES`): parsing 128 MiB of
    // JSON would pass libFuzzer's RSS limit without being a fault.
    let raw = match decompress_at_most(rest, compression, 16 << 20) {
        Ok(raw) => raw,
        Err(e) => {
            assert!(matches!(e, Error::Compression(_)), "{e:?}");
            return;
        }
    };
    let Ok(doc) = serde_json::from_slice::<Value>(&raw) else {
        return;
    };
    let all = select(doc.clone(), &DefinitionsSelection::default()).expect("empty selection");
    assert_eq!(all, doc, "an empty selection changed the definitions");
    let convert = RestoreOptions {
        convert_mirrored_queues: Some(ConvertMirroredQueues::Quorum),
        ..Default::default()
    };
    // A 4.3 target that denies transient non-exclusive queues: the migration and
    // `deprecated::make_durable` both run.
    let denied = [deprecated::TRANSIENT_NONEXCL_QUEUES.to_string()];
    let (migrated, _changes) = prepare(doc.clone(), &convert, BrokerVersion::parse("4.3.6"), &denied)
        .expect("4.3 migration");
    for k in KINDS {
        assert!(
            count(&migrated, k) <= count(&doc, k),
            "{k} grew in the migration"
        );
    }
    serde_json::to_vec(&migrated).expect("migrated definitions serialise");
    let one = |names: Option<String>| names.into_iter().collect::<Vec<_>>();
    let vhost = one(first_name(&doc, "vhosts"));
    let queue = one(first_name(&doc, "queues"));
    let exchange = one(first_name(&doc, "exchanges"));
    check(
        &doc,
        DefinitionsSelection {
            vhosts: vhost,
            ..Default::default()
        },
        true,
    );
    check(
        &doc,
        DefinitionsSelection {
            queues: queue.clone(),
            exchanges: exchange,
            ..Default::default()
        },
        true,
    );
    check(
        &doc,
        DefinitionsSelection {
            queues: vec!["\u{0}absent".to_string()],
            ..Default::default()
        },
        false,
    );
});
