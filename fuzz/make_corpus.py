#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<target>/: a few small valid inputs per target.

Deterministic; needs the zstd and lz4 command-line tools for the compressed seeds. Run from
anywhere: `python3 fuzz/make_corpus.py`. Regression inputs (crashes found and fixed) are kept
beside the seeds under names starting with `regression-`; this script leaves them alone.
"""
import json
import os
import struct
import subprocess
import zlib

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(ROOT)
CORPUS = os.path.join(ROOT, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def zstd(data):
    return subprocess.run(["zstd", "-q", "-c", "-3"], input=data, check=True, capture_output=True).stdout


def lz4(data):
    return subprocess.run(["lz4", "-q", "-c"], input=data, check=True, capture_output=True).stdout


u8 = lambda v: struct.pack(">B", v)
u16 = lambda v: struct.pack(">H", v)
u32 = lambda v: struct.pack(">I", v)
u64 = lambda v: struct.pack(">Q", v)

# ---------------------------------------------------------------------------------------------
# AMQP 0-9-1
# ---------------------------------------------------------------------------------------------


def shortstr(s):
    s = s.encode() if isinstance(s, str) else s
    return u8(len(s)) + s


def longstr(s):
    s = s.encode() if isinstance(s, str) else s
    return u32(len(s)) + s


def table(pairs):
    return longstr(b"".join(shortstr(k) + v for k, v in pairs))


ALL_VALUES = [
    ("t", b"t\x01"),
    ("b", b"b\xfe"),
    ("B", b"B\xff"),
    ("s", b"s" + struct.pack(">h", -2)),
    ("u", b"u" + u16(65535)),
    ("I", b"I" + struct.pack(">i", -5)),
    ("i", b"i" + u32(7)),
    ("l", b"l" + struct.pack(">q", -9)),
    ("f", b"f" + struct.pack(">f", 1.5)),
    ("d", b"d" + struct.pack(">d", -2.25)),
    ("D", b"D\x02" + u32(314)),
    ("S", b"S" + longstr("text")),
    ("A", b"A" + longstr(b"I" + u32(1) + b"S" + longstr("a") + b"V")),
    ("T", b"T" + u64(1_700_000_000)),
    ("F", b"F" + table([("k", b"t\x00")])),
    ("V", b"V"),
    ("x", b"x" + longstr(b"\x00\xff")),
]


def frame(kind, channel, payload):
    return u8(kind) + u16(channel) + u32(len(payload)) + payload + b"\xce"


def method(cls, mid, args=b""):
    return frame(1, 1 if cls != 10 else 0, u16(cls) + u16(mid) + args)


def properties_all():
    flags = 0xFFFC
    return (
        u16(flags)
        + shortstr("text/plain")
        + shortstr("gzip")
        + table([("x-count", b"I" + u32(3)), ("flag", b"V")])
        + u8(2)
        + u8(7)
        + shortstr("corr")
        + shortstr("reply")
        + shortstr("60000")
        + shortstr("m-1")
        + u64(1_700_000_000)
        + shortstr("order")
        + shortstr("guest")
        + shortstr("shop")
        + shortstr("cluster")
    )


def content_header(body_size, props):
    return frame(2, 1, u16(60) + u16(0) + u64(body_size) + props)


def amqp_seeds():
    t = "amqp_frame"
    write(t, "connection-start", method(10, 10, b"\x00\x09" + table(ALL_VALUES) + longstr("PLAIN AMQPLAIN") + longstr("en_US")))
    write(t, "tune-open-ok-heartbeat", method(10, 30, u16(2047) + u32(131072) + u16(60)) + method(10, 41, shortstr("")) + frame(8, 0, b""))
    deliver = method(60, 60, shortstr("ctag") + u64(1) + u8(0) + shortstr("ex") + shortstr("rk"))
    write(t, "deliver-all-properties", deliver + content_header(5, properties_all()) + frame(3, 1, b"hello"))
    write(t, "deliver-no-properties-two-bodies", deliver + content_header(6, u16(0)) + frame(3, 1, b"abc") + frame(3, 1, b"def"))
    write(t, "channel-close", method(20, 40, u16(404) + shortstr("NOT_FOUND - no queue 'q' in vhost '/'") + u16(50) + u16(10)))
    write(t, "get-ok-get-empty", method(60, 71, u64(9) + u8(1) + shortstr("amq.topic") + shortstr("a.b") + u32(3)) + content_header(0, u16(0x9000) + shortstr("application/json") + u8(2)) + method(60, 72, shortstr("")))
    write(t, "queue-declare-ok-ack-nack", method(50, 11, shortstr("q") + u32(10) + u32(0)) + method(60, 80, u64(4) + u8(1)) + method(60, 120, u64(5) + u8(3)))
    write(t, "basic-return", method(60, 50, u16(312) + shortstr("NO_ROUTE") + shortstr("e") + shortstr(b"\xff")))

    t = "amqp_table"
    write(t, "every-type", table(ALL_VALUES))
    write(t, "nested", table([("outer", b"F" + table([("inner", b"A" + longstr(b"F" + table([("deep", b"S" + longstr("x"))])))]))]))
    write(t, "empty", table([]))
    write(t, "headers-of-a-quorum-queue", table([("x-queue-type", b"S" + longstr("quorum")), ("x-delivery-count", b"l" + u64(2)), ("x-death", b"A" + longstr(b"F" + table([("count", b"l" + u64(1)), ("reason", b"S" + longstr("expired")), ("queue", b"S" + longstr("q")), ("time", b"T" + u64(1_700_000_000))])))]))
    # Property lists (flags and properties), for the WireProperties check of the same target.
    write(t, "properties-all", properties_all())
    write(t, "properties-headers-only", u16(0x2000) + table(ALL_VALUES))


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------

# A chunk RabbitMQ 3.10.8 delivered for one message published over AMQP 0-9-1
# (src/broker/stream/amqp10/tests.rs CAPTURED_CHUNK).
CAPTURED_CHUNK = bytes.fromhex(
    "5000000100000001000001a21007421d00000000000000010000000000000000e0e7534d000000ec0000002d00000000000000e8005372c16b0aa30d782d726f7574696e672d6b6579a103636170a30a782d65786368616e6765a100a310782d62617369632d7072696f726974795003a315782d62617369632d64656c69766572792d6d6f64655002a312782d62617369632d65787069726174696f6ea1053630303030005373c0250da1036d2d314040404040a30a746578742f706c61696e4040830000018bcfe56800404040005374c13f0aa10c782d62617369632d74797065a1056f72646572a10e782d62617369632d6170702d6964a10473686f70a10173a10474657874a1016c55fba101625601005375a00568656c6c6f"
)
CAPTURED_MESSAGE = CAPTURED_CHUNK[48 + 4 : 48 + 4 + 0xE8]


def chunk(first_offset, data, entries, records, chunk_type=0):
    return (
        bytes([0x50, chunk_type])
        + u16(entries)
        + u32(records)
        + struct.pack(">q", 1_700_000_000_000)
        + u64(1)
        + u64(first_offset)
        + u32(zlib.crc32(data))
        + u32(len(data))
        + u32(0)
        + b"\x00\x00\x00\x00"
        + data
    )


def simple(m):
    return u32(len(m)) + m


def batch(messages, codec):
    plain = b"".join(simple(m) for m in messages)
    body = zstd(plain) if codec == 4 else plain
    return bytes([0x80 | (codec << 4)]) + u16(len(messages)) + u32(len(plain)) + u32(len(body)) + body


def amqp10_section(code, value):
    return b"\x00\x53" + u8(code) + value


def vbin8(b):
    return b"\xa0" + u8(len(b)) + b


def str8(s):
    return b"\xa1" + shortstr(s)


def sym8(s):
    return b"\xa3" + shortstr(s)


def list8(items):
    body = b"".join(items)
    return b"\xc0" + u8(len(body) + 1) + u8(len(items)) + body


def map8(items):
    body = b"".join(items)
    return b"\xc1" + u8(len(body) + 1) + u8(len(items)) + body


def stream_frame(key, fields):
    body = u16(key) + u16(1) + fields
    return u32(len(body)) + body


def sstr(s):
    s = s.encode()
    return u16(len(s)) + s


def stream_seeds():
    t = "stream_chunk"
    write(t, "captured-rabbitmq-3.10", CAPTURED_CHUNK)
    simple_data = simple(b"one") + simple(CAPTURED_MESSAGE) + simple(b"")
    write(t, "simple-entries", chunk(42, simple_data, 3, 3))
    write(t, "plain-batch", chunk(7, batch([b"a", b"bc", CAPTURED_MESSAGE], 0), 1, 3))
    write(t, "zstd-batch-and-simple", chunk(0, batch([b"x" * 100, b"y" * 50], 4) + simple(b"z"), 2, 3))
    write(t, "tracking-chunk", chunk(10, b"\x00\x01", 0, 0, chunk_type=1))

    t = "stream_frame"
    deliver = stream_frame(0x0008, u8(0) + CAPTURED_CHUNK)
    write(t, "deliver-captured-chunk", deliver)
    write(t, "confirms-and-error", stream_frame(0x0003, u8(0) + u32(2) + u64(1) + u64(2)) + stream_frame(0x0004, u8(0) + u32(1) + u64(3) + u16(0x12)))
    metadata = stream_frame(
        0x800F,
        u32(1) + u32(1) + u16(0) + sstr("rabbit") + u32(5552) + u32(2) + sstr("s1") + u16(1) + u16(0) + u32(1) + u16(0) + sstr("gone") + u16(2) + u16(0) + u32(0),
    )
    write(t, "metadata-response", metadata)
    write(t, "heartbeat-tune-credit-error", stream_frame(0x0017, b"") + stream_frame(0x0014, u32(1048576) + u32(60)) + stream_frame(0x8009, u16(4) + u8(0)))
    write(t, "metadata-update-then-close", stream_frame(0x0010, u16(6) + sstr("s1")) + stream_frame(0x0016, u32(9) + u16(1) + sstr("bye")))
    write(t, "responses", stream_frame(0x8007, u32(1) + u16(1)) + stream_frame(0x800B, u32(2) + u16(1) + u64(1234)) + stream_frame(0x8012, u32(3) + u16(1) + u32(1) + sstr("PLAIN")))

    t = "amqp10_value"
    write(t, "message-annotations", CAPTURED_MESSAGE[3 : 3 + 2 + 0x6B])
    write(t, "list-of-scalars", list8([b"\x40", b"\x41", b"\x50\x07", b"\x54\xfb", b"\x71" + u32(5), b"\x83" + u64(1_700_000_000_000), b"\x98" + bytes(range(16)), str8("héllo"), sym8("sym"), vbin8(b"\x00\xff")]))
    write(t, "array-with-descriptor", b"\xe0" + u8(2 + 2 + 1 + 3 * 8) + u8(3) + b"\x00\xa3\x01d" + b"\x81" + u64(1) + u64(2) + u64(3))
    write(t, "described-map", b"\x00\x53\x74" + map8([str8("k"), b"\x55\x05", sym8("s"), b"\x82" + struct.pack(">d", 0.5)]))
    write(t, "wide-compounds", b"\xd0" + u32(4 + 2) + u32(2) + b"\x40\x40" )

    t = "amqp10_message"
    write(t, "captured-0-9-1-message", CAPTURED_MESSAGE)
    write(t, "data-only", amqp10_section(0x75, vbin8(b"x")))
    write(t, "amqp-value-body", amqp10_section(0x77, str8("a value")))
    write(t, "header-and-footer", amqp10_section(0x70, list8([b"\x41"])) + amqp10_section(0x75, vbin8(b"body")) + amqp10_section(0x78, map8([])))

    # AMQP 1.0 frames as the AMQP 1.0 client's reader reads them (src/broker/amqp10/).
    t = "amqp10_frame"
    def f10(perf, payload=b"", kind=0, channel=0):
        body = perf + payload
        return u32(8 + len(body)) + b"\x02" + u8(kind) + u16(channel) + body
    uint = lambda n: b"\x70" + u32(n)
    err = amqp10_section(0x1D, list8([sym8("amqp:not-found"), str8("no queue 'q'")]))
    write(t, "open-begin-attach", f10(amqp10_section(0x10, list8([str8("c"), str8("vhost:/"), uint(131072), b"\x60" + u16(255), uint(30000)])))
          + f10(amqp10_section(0x11, list8([b"\x60" + u16(0), uint(0), uint(400), uint(0xFFFFFFFF)])))
          + f10(amqp10_section(0x12, list8([str8("l"), uint(0), b"\x42", b"\x50\x00", b"\x50\x00", amqp10_section(0x28, list8([str8("/queues/q")])), b"\x40", b"\x40", b"\x40", uint(0)])), channel=0))
    write(t, "flow-transfers-disposition", f10(amqp10_section(0x13, list8([uint(0), uint(2048), uint(0), uint(0xFFFFFFFF), uint(0), uint(0), uint(170)])))
          + f10(amqp10_section(0x14, list8([uint(0), uint(0), vbin8(b"\x00\x00\x00\x00"), uint(0), b"\x42", b"\x41"])), amqp10_section(0x75, vbin8(b"part one ")))
          + f10(amqp10_section(0x14, list8([uint(0), b"\x40", b"\x40", b"\x40", b"\x40", b"\x42"])), b"part two")
          + f10(amqp10_section(0x15, list8([b"\x41", uint(0), uint(3), b"\x41", amqp10_section(0x27, list8([b"\x41", b"\x42", map8([sym8("x-a"), b"\x55\x01"])]))]))))
    write(t, "heartbeat-detach-end-close", u32(8) + b"\x02\x00\x00\x00" + f10(amqp10_section(0x16, list8([uint(0), b"\x41", err]))) + f10(amqp10_section(0x17, list8([err]))) + f10(amqp10_section(0x18, list8([]))))
    write(t, "sasl", f10(amqp10_section(0x40, list8([sym8("PLAIN")])), kind=1) + f10(amqp10_section(0x44, list8([b"\x50\x00"])), kind=1))


# ---------------------------------------------------------------------------------------------
# Records, segments, manifests, definitions, configuration, storage URLs
# ---------------------------------------------------------------------------------------------

PROPS = ["content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type_field", "user_id", "app_id", "cluster_id"]


def record(body, headers, props=None, tag=1):
    p = {k: None for k in PROPS}
    p.update(props or {})
    return json.dumps(
        {
            "body": list(body) if body else None,
            "properties": p,
            "headers": headers,
            "exchange": "ex",
            "routing_key": "rk",
            "delivery_tag": tag,
            "redelivered": False,
            "backed_up_at": 1_700_000_000_000,
            "source_queue": "q",
            "source_vhost": "/",
        },
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


EVERY_HEADER = [
    ["s", {"LongString": "a"}],
    ["sb", {"LongStringBytes": [255, 0]}],
    ["ss", {"ShortString": "s"}],
    ["L", {"Long": -1}],
    ["S", {"Short": -2}],
    ["b", {"ShortShortInt": -3}],
    ["B", {"ShortShortUInt": 250}],
    ["si", {"ShortInt": -4}],
    ["u", {"ShortUInt": 65535}],
    ["I", {"LongInt": -5}],
    ["i", {"LongUInt": 4294967295}],
    ["l", {"LongLongInt": -9223372036854775808}],
    ["t", {"Bool": True}],
    ["x", {"Bytes": []}],
    ["T", {"Timestamp": 18446744073709551615}],
    ["f", {"Float": 1.5}],
    ["d", {"Double": -0.25}],
    ["nan", {"Double": "NaN"}],
    ["inf", {"Float": "-Infinity"}],
    ["D", {"Decimal": {"scale": 1, "value": 7}}],
    ["V", "Void"],
    ["F", {"Table": [["k", "Void"]]}],
    ["A", {"Array": [{"Bool": False}]}],
]


def segment(records, compression, with_footer=False):
    payload = b"".join(struct.pack("<I", len(r)) + r for r in records)
    body = {0: payload, 1: zstd(payload) if records else zstd(b""), 2: lz4(payload)}[compression]
    header = b"RBAK" + bytes([1, compression, 0, 0]) + struct.pack("<Qqq", len(records), 1_700_000_000_000 if records else 0, 1_700_000_000_000 if records else 0)
    data = header + body
    if with_footer:
        data += struct.pack("<I", zlib.crc32(data)) + b"KABR"
    return data


def segment_parts(version, records, compression):
    """A version 2 or 3 segment (header and payload): each record (metadata, body) as two
    length-prefixed parts."""
    payload = b"".join(struct.pack("<I", len(m)) + m + struct.pack("<I", len(b)) + b for m, b in records)
    body = {0: payload, 1: zstd(payload)}[compression]
    header = b"RBAK" + bytes([version, compression, 0, 0]) + struct.pack("<Qqq", len(records), 1_700_000_000_000, 1_700_000_000_000)
    return header + body


def binary_meta(props, tag=1, redelivered=True):
    """Version 3 binary metadata (docs/segment-format.md): tag, flags, delivery_tag,
    backed_up_at, four u16-prefixed strings, then the AMQP property bytes."""
    out = b"\x00" + bytes([1 if redelivered else 0]) + struct.pack("<Qq", tag, 1_700_000_000_000)
    for s in ["ex", "rk", "orders", "/"]:
        out += struct.pack("<H", len(s)) + s.encode()
    return out + props


def storage_seeds():
    recs = [
        record(b"hi", [["x-count", {"LongInt": 3}], ["flag", "Void"]], {"content_type": "text/plain", "delivery_mode": 2}),
        record(b"", EVERY_HEADER, tag=2),
        record(bytes(range(256)), [], {"timestamp": -1, "priority": 9}, tag=3),
    ]
    t = "record_json"
    for i, r in enumerate(recs):
        write(t, f"record-{i}", r)
    write(t, "pretty-body-last", json.dumps({**json.loads(recs[0]), "body": [1, 2, 3]}, indent=2).encode())

    t = "segment_reader"
    # Header and payload: the target appends the footer (CRC32 and KABR).
    write(t, "none-3-records", segment(recs, 0))
    write(t, "zstd-3-records", segment(recs, 1))
    write(t, "lz4-3-records", segment(recs, 2))
    write(t, "zstd-empty", segment([], 1))
    write(t, "whole-file-with-footer", segment(recs[:1], 0, with_footer=True))
    # Version 3: binary metadata beside version 2's JSON metadata.
    meta_json = b"{" + recs[0][recs[0].index(b'"properties"'):]
    v3 = [(binary_meta(properties_all()), b"hi"), (binary_meta(u16(0), tag=2, redelivered=False), b""), (meta_json, b"hi")]
    write(t, "v3-none-binary-and-json", segment_parts(3, v3, 0))
    write(t, "v3-zstd-binary-and-json", segment_parts(3, v3, 1))

    t = "manifest_json"
    seg = {
        "key": "b1/queues/_default/orders/segment-0001.zst",
        "sequence": 1,
        "record_count": 10,
        "size_bytes": 500,
        "uncompressed_bytes": 5000,
        "first_timestamp": 1,
        "last_timestamp": 2,
        "checksum": "ab" * 32,
    }
    manifest = {
        "backup_id": "b1",
        "created_at": 1_700_000_000_000,
        "completed_at": 1_700_000_100_000,
        "source_cluster": "rabbit@host",
        "broker_version": "3.10.8",
        "backup_tool_version": "0.1.0",
        "definitions": {"key": "b1/definitions/definitions.json.zst", "vhost_count": 1, "queue_count": 1, "exchange_count": 7, "user_count": 1, "size_bytes": 999},
        "queues": [
            {"vhost": "/", "name": "orders", "queue_type": "quorum", "segments": [seg], "message_count": 10, "first_message_timestamp": 1, "last_message_timestamp": 2},
            {"vhost": "v", "name": "s", "queue_type": "stream", "segments": [], "message_count": 0, "first_message_timestamp": None, "last_message_timestamp": None, "messages_unacknowledged_at_start": 3, "messages_left_out": 1},
        ],
        "total_messages": 10,
        "total_bytes": 500,
        "total_segments": 1,
    }
    write(t, "manifest", json.dumps(manifest, indent=2))
    legacy = dict(manifest, completed_at=None, definitions=None, source_cluster=None)
    legacy["rabbitmq_version"] = legacy.pop("broker_version")
    write(t, "legacy-interrupted", json.dumps(legacy, indent=2))
    write(t, "outside-the-backup", json.dumps(dict(manifest, queues=[dict(manifest["queues"][0], segments=[dict(seg, key="b2/queues/x/segment-0001.zst")])])))

    t = "definitions"
    defs = {
        "rabbit_version": "3.10.8",
        "rabbitmq_version": "3.10.8",
        "users": [{"name": "guest"}],
        "vhosts": [{"name": "a"}, {"name": "b"}],
        "permissions": [{"user": "guest", "vhost": "a"}, {"user": "guest", "vhost": "b"}],
        "policies": [{"name": "p", "vhost": "b"}],
        "parameters": [],
        "global_parameters": [{"name": "cluster_name"}],
        "queues": [{"name": "q1", "vhost": "a"}, {"name": "q2", "vhost": "a"}, {"name": "q3", "vhost": "b"}],
        "exchanges": [{"name": "x1", "vhost": "a"}, {"name": "x2", "vhost": "a"}, {"name": "x3", "vhost": "b"}],
        "bindings": [
            {"source": "x1", "vhost": "a", "destination": "q1", "destination_type": "queue", "routing_key": "k"},
            {"source": "x2", "vhost": "a", "destination": "q2", "destination_type": "queue", "routing_key": "k"},
            {"source": "x1", "vhost": "a", "destination": "x2", "destination_type": "exchange", "routing_key": "k"},
            {"source": "x3", "vhost": "b", "destination": "q3", "destination_type": "queue", "routing_key": "k"},
        ],
    }
    raw = json.dumps(defs).encode()
    write(t, "plain", b"\x00" + raw)
    write(t, "zstd", b"\x01" + zstd(raw))
    write(t, "lz4", b"\x02" + lz4(raw))

    t = "config_yaml"
    for src, name in [("examples/config.yaml", "examples-config"), ("examples/restore.yaml", "examples-restore"), ("packaging/backup.yaml", "packaging-backup")]:
        with open(os.path.join(REPO, src), "rb") as f:
            write(t, name, f.read())

    t = "storage_url"
    for i, url in enumerate(
        [
            "s3://bucket/prefix/a?region=eu-west-1&endpoint=http://127.0.0.1:8333&path_style=true&allow_http=true",
            "s3a://b",
            "azure://account.blob.core.windows.net/container/prefix",
            "az://127.0.0.1:10000/devstoreaccount1/c/p",
            "gcs://bucket/p%20q",
            "gs://b",
            "file:///var/backups/rmq%20backup",
            "memory://",
            "memory://name",
        ]
    ):
        write(t, f"url-{i}", url)


if __name__ == "__main__":
    amqp_seeds()
    stream_seeds()
    storage_seeds()
