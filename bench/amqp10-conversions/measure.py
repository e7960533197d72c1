#!/usr/bin/python3
"""Measure what RabbitMQ 4.x keeps when it converts messages between AMQP 0-9-1 and AMQP 1.0.

Oracles that are not rmq-backup's code: pika (AMQP 0-9-1) and python3-qpid-proton (AMQP 1.0).
AMQP 1.0 messages are built and read section by section as raw bytes (proton.Data), so every
section (several data sections, footer, delivery annotations) and every AMQP type is visible.
0-9-1 header values are encoded and decoded with their field-type letter kept (pika's codec
wrapped), so `I:5` and `l:5` are told apart.

Usage: python3 bench/amqp10-conversions/measure.py --port 5692 --mgmt 15692 [--json OUT]
Makes its own vhost (amqp10-conv-<pid>) and deletes it at the end.
Prints: the facts (broker-added annotations, give-back outcomes and delivery counts, publish
outcomes) and the conversion table in markdown.
"""
import argparse
import base64
import datetime
import decimal
import json
import os
import struct
import sys
import time
import urllib.request
import uuid

import pika
import pika.data
from proton import (Data, Delivery, Described, symbol, ulong, uint, ushort, ubyte, byte, short,
                    int32, float32, decimal32, decimal64, decimal128, char, timestamp)
from proton.utils import BlockingConnection

# ---------------------------------------------------------------- 0-9-1 field codec with types


class Raw:
    """A 0-9-1 field value given as its type letter and encoded bytes (pika cannot make all)."""

    def __init__(self, kind, payload, shown):
        self.kind, self.payload, self.shown = kind, payload, shown


class Tagged:
    """A decoded 0-9-1 field value with its type letter."""

    def __init__(self, kind, value):
        self.kind, self.value = kind, value

    def __repr__(self):
        return "%s:%r" % (self.kind, self.value)


_orig_encode = pika.data.encode_value
_orig_decode = pika.data.decode_value


def _encode(pieces, value):
    if isinstance(value, Raw):
        pieces.append(value.kind + value.payload)
        return 1 + len(value.payload)
    return _orig_encode(pieces, value)


TAGGING = [False]


def _decode(encoded, offset):
    if not TAGGING[0]:
        return _orig_decode(encoded, offset)
    kind = encoded[offset:offset + 1].decode('latin1')
    # numbers decoded here as rabbit_binary_parser defines them (pika 1.2 reads b/B, l and f/d
    # differently from RabbitMQ)
    fixed = {'b': '>b', 'B': '>B', 's': '>h', 'u': '>H', 'I': '>i', 'i': '>I', 'l': '>q',
             'f': '>f', 'd': '>d', 'T': '>Q'}
    if kind in fixed:
        v = struct.unpack_from(fixed[kind], encoded, offset + 1)[0]
        return Tagged(kind, v), offset + 1 + struct.calcsize(fixed[kind])
    if kind == 'D':
        scale, unscaled = struct.unpack_from('>Bi', encoded, offset + 1)
        return Tagged('D', decimal.Decimal(unscaled).scaleb(-scale)), offset + 6
    value, off = _orig_decode(encoded, offset)
    return Tagged(kind, value), off


pika.data.encode_value = _encode
pika.data.decode_value = _decode


def raw(kind, fmt, v):
    return Raw(kind.encode(), struct.pack(fmt, v), "%s:%r" % (kind, v))


def hdr_table():
    """Every 0-9-1 field value type RabbitMQ parses (rabbit_binary_parser)."""
    return {
        "h-longstr": "longstr-1",                   # S
        "h-bytes": b"\x00\x01bytes",                # x
        "h-bool": True,                             # t
        "h-int8": raw('b', '>b', -11),
        "h-uint8": raw('B', '>B', 211),
        "h-int16": raw('s', '>h', -3011),
        "h-uint16": raw('u', '>H', 60011),
        "h-int32": raw('I', '>i', -70011),
        "h-uint32": raw('i', '>I', 4000000011),
        "h-int64": raw('l', '>q', -1099511627011),
        "h-float": raw('f', '>f', 1.5),
        "h-double": raw('d', '>d', 2.125),
        "h-decimal": decimal.Decimal("12.345"),    # D
        "h-timestamp": datetime.datetime(2023, 11, 14, 22, 13, 21, tzinfo=datetime.timezone.utc),  # T
        "h-void": None,                             # V
        "h-table": {"n-str": "nested-1", "n-int": raw('I', '>i', 7011),
                    "n-table": {"nn": "deep-1"}},
        "h-array": ["arr-1", raw('I', '>i', 8011), {"at": "arrtbl-1"}, ["inner-1"]],
    }


def pub091_props():
    return pika.BasicProperties(
        content_type="text/plain-091", content_encoding="enc-091", headers=hdr_table(),
        delivery_mode=2, priority=5, correlation_id="corr-091", reply_to="reply-091",
        expiration="3600000", message_id="mid-091", timestamp=1700000021, type="type-091",
        user_id="guest", app_id="app-091", cluster_id="cluster-091")


PROP_NAMES_091 = ["content_type", "content_encoding", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                  "user_id", "app_id", "cluster_id"]


def flat091(props, body):
    out = {}
    for n in PROP_NAMES_091:
        v = getattr(props, n)
        if v is not None:
            out["prop." + n] = v
    for k, v in (props.headers or {}).items():
        out["hdr." + k] = v
    out["body"] = body
    return out

# ---------------------------------------------------------------- AMQP 1.0 sections


SECTION = {0x70: "header", 0x71: "delivery-annotations", 0x72: "message-annotations",
           0x73: "properties", 0x74: "application-properties", 0x75: "data",
           0x76: "amqp-sequence", 0x77: "amqp-value", 0x78: "footer"}
HEADER_F = ["durable", "priority", "ttl", "first-acquirer", "delivery-count"]
PROPS_F = ["message-id", "user-id", "to", "subject", "reply-to", "correlation-id", "content-type",
           "content-encoding", "absolute-expiry-time", "creation-time", "group-id",
           "group-sequence", "reply-to-group-id"]


def sec(code, value):
    d = Data()
    d.put_object(Described(ulong(code), value))
    return d.encode()


def encode_msg(sections):
    """sections: list of (code, value) -> bytes of a bare+annotated message."""
    return b"".join(sec(c, v) for c, v in sections)


def decode_msg(raw_bytes):
    """bytes -> list of (section name, value) in wire order."""
    out = []
    while raw_bytes:
        d = Data()
        n = d.decode(raw_bytes)
        d.rewind()
        d.next()
        o = d.get_object()
        out.append((SECTION.get(int(o.descriptor), str(o.descriptor)), o.value))
        raw_bytes = raw_bytes[n:]
    return out


def t10(v):
    """A 1.0 value with its AMQP type name."""
    if v is None:
        return "null"
    names = {bool: "boolean", int: "long", float: "double", str: "string", bytes: "binary",
             uuid.UUID: "uuid", dict: "map", list: "list"}
    n = names.get(type(v), type(v).__name__)
    if isinstance(v, dict):
        return "map{%s}" % ", ".join("%s: %s" % (t10(k), t10(x)) for k, x in v.items())
    if isinstance(v, list):
        return "list[%s]" % ", ".join(t10(x) for x in v)
    if isinstance(v, bytes):
        return "binary:%r" % v
    return "%s:%r" % (n, v if not isinstance(v, (str,)) else str(v))


def flat10(sections):
    out = {}
    ndata = 0
    for name, v in sections:
        if name == "header":
            for i, x in enumerate(v):
                if x is not None:
                    out["header." + HEADER_F[i]] = x
        elif name == "properties":
            for i, x in enumerate(v):
                if x is not None:
                    out["properties." + PROPS_F[i]] = x
        elif name in ("delivery-annotations", "message-annotations", "application-properties",
                      "footer"):
            short_name = {"delivery-annotations": "da", "message-annotations": "ma",
                          "application-properties": "ap", "footer": "footer"}[name]
            for k, x in (v or {}).items():
                out["%s.%s" % (short_name, k)] = x
        elif name == "data":
            out["body.data[%d]" % ndata] = v
            ndata += 1
        else:
            out["body." + name + ("" if ("body." + name) not in out else "+")] = v
    return out


NOW_MS = int(time.time() * 1000)


def app_props():
    """One application-property of every simple AMQP 1.0 type."""
    return {"a-null": None, "a-bool": True, "a-ubyte": ubyte(201), "a-ushort": ushort(60001),
            "a-uint": uint(4000000001), "a-ulong": ulong(18000000000000000001),
            "a-ulong-small": ulong(12345678903),
            "a-byte": byte(-101), "a-short": short(-30001), "a-int": int32(-2000000001),
            "a-long": -9000000000001, "a-float": float32(0.75), "a-double": 3.0625,
            "a-decimal32": decimal32(0x22000001), "a-decimal64": decimal64(0x2200000000000002),
            "a-decimal128": decimal128(b"\x22" + b"\x00" * 14 + b"\x03"),
            "a-char": char("Z"), "a-timestamp": timestamp(1700000000456),
            "a-uuid": uuid.UUID("11111111-2222-3333-4444-555555555555"),
            "a-binary": b"\x00\x02bin", "a-string": "string-1", "a-symbol": symbol("symbol-1")}


def base10(body=None, mid="mid-10", cid="corr-10", header=None, ma=None, ap=None):
    header = header if header is not None else [True, ubyte(7), uint(3600000), True, uint(0)]
    ma = ma if ma is not None else {symbol("x-opt-ma-str"): "ma-str-1",
                                    symbol("x-opt-ma-long"): 9000000001,
                                    symbol("x-opt-ma-sym"): symbol("ma-sym-1")}
    props = [mid, b"guest", "to-10", "subject-10", "reply-10", cid, symbol("text/plain-10"),
             symbol("enc-10"), timestamp(NOW_MS + 86400000), timestamp(1700000000123),
             "group-10", uint(4000000044), "rgroup-10"]
    ap = ap if ap is not None else {"a-string": "string-1"}
    s = [(0x70, header), (0x71, {symbol("x-opt-da"): "da-1"}), (0x72, ma), (0x73, props),
         (0x74, ap)]
    s += body if body is not None else [(0x75, b"body-data-1")]
    s += [(0x78, {symbol("x-opt-footer"): "footer-1"})]
    return s


def cases10():
    """(name, sections) of the AMQP 1.0 messages measured."""
    return [
        ("full, message-id/correlation-id string", base10()),
        ("message-id/correlation-id ulong", base10(mid=ulong(12345678901), cid=ulong(12345678902))),
        ("message-id/correlation-id uuid",
         base10(mid=uuid.UUID("aaaaaaaa-0000-0000-0000-000000000001"),
                cid=uuid.UUID("aaaaaaaa-0000-0000-0000-000000000002"))),
        ("message-id/correlation-id binary", base10(mid=b"mid-bin-1", cid=b"cid-bin-1")),
        ("body: 3 data sections", base10(body=[(0x75, b"d-1"), (0x75, b"d-2"), (0x75, b"d-3")])),
        ("body: 2 amqp-sequence sections",
         base10(body=[(0x76, ["seq-1", 5]), (0x76, [symbol("seq-sym")])])),
        ("body: amqp-value string", base10(body=[(0x77, "value-string-1")])),
        ("body: amqp-value map", base10(body=[(0x77, {"k": "value-map-1", symbol("s"): 7})])),
        ("body: amqp-value list", base10(body=[(0x77, ["value-list-1", ulong(8)])])),
        ("body: amqp-value null", base10(body=[(0x77, None)])),
    ] + [("application-property " + k, base10(ap={k: v})) for k, v in app_props().items()]

# ---------------------------------------------------------------- plumbing


class Env:
    def __init__(self, host, port, mgmt):
        self.host, self.port, self.mgmt = host, port, mgmt
        self.vhost = "amqp10-conv-%d" % os.getpid()
        self.auth = "Basic " + base64.b64encode(b"guest:guest").decode()

    def api(self, method, path, body=None):
        req = urllib.request.Request("http://%s:%d/api%s" % (self.host, self.mgmt, path),
                                     method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": self.auth,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            data = r.read()
            return json.loads(data) if data else None

    def version(self):
        return self.api("GET", "/overview")["rabbitmq_version"]

    def setup(self):
        v = urllib.parse.quote(self.vhost, safe="")
        self.api("PUT", "/vhosts/" + v, {})
        self.api("PUT", "/permissions/%s/guest" % v, {"configure": ".*", "write": ".*", "read": ".*"})

    def teardown(self):
        self.api("DELETE", "/vhosts/" + urllib.parse.quote(self.vhost, safe=""))

    def ch(self):
        c = pika.BlockingConnection(pika.ConnectionParameters(
            self.host, self.amqp091_port, self.vhost, pika.PlainCredentials("guest", "guest"),
            socket_timeout=10, blocked_connection_timeout=30))
        return c, c.channel()

    def c10(self):
        return BlockingConnection("amqp://guest:guest@%s:%d" % (self.host, self.port), timeout=10,
                                  virtual_host="vhost:" + self.vhost)

    def declare(self, name, qtype, extra=None):
        c, ch = self.ch()
        args = {"x-queue-type": qtype}
        args.update(extra or {})
        ch.queue_declare(name, durable=True, arguments=args)
        c.close()


class RawReceiver:
    """Link handler: keeps (delivery, raw bytes) of each complete transfer, settles nothing."""

    def __init__(self):
        self.got = []

    def on_delivery(self, event):
        d = event.delivery
        if d.readable and not d.partial:
            data = d.link.recv(d.pending)
            d.link.advance()
            self.got.append((d, data))


def send10(conn, address, messages, settle=True):
    """Publish raw messages unsettled; returns the remote outcome name of each."""
    snd = conn.create_sender(address)
    link = snd.link
    outcomes = []
    for i, m in enumerate(messages):
        conn.wait(lambda: link.credit > 0, timeout=10, msg="credit")
        d = link.delivery(str(i))
        link.stream(m)
        link.advance()
        conn.wait(lambda: d.remote_state != 0 or d.settled, timeout=10, msg="outcome")
        outcomes.append(outcome_name(d))
        d.settle()
    snd.close()
    return outcomes


def outcome_name(d):
    s = d.remote_state
    names = {Delivery.ACCEPTED: "accepted", Delivery.REJECTED: "rejected",
             Delivery.RELEASED: "released", Delivery.MODIFIED: "modified"}
    n = names.get(s, "state-%s" % s)
    if s == Delivery.REJECTED and d.remote.condition is not None:
        n += " (%s)" % d.remote.condition.name
    if s == Delivery.MODIFIED:
        n += " (failed=%s, undeliverable=%s)" % (d.remote.failed, d.remote.undeliverable)
    return n


def recv10(conn, address, n, settle="accept"):
    """Read n messages over AMQP 1.0; returns (handler, receiver) and the decoded list."""
    h = RawReceiver()
    r = conn.create_receiver(address, credit=n, handler=h)
    conn.wait(lambda: len(h.got) >= n, timeout=15, msg="receive %d" % n)
    msgs = [decode_msg(b) for _, b in h.got]
    if settle == "accept":
        for d, _ in h.got:
            d.update(Delivery.ACCEPTED)
            d.settle()
        pump(conn)
        r.close()
    return msgs, h, r


def pump(conn, secs=0.3):
    end = time.time() + secs
    try:
        conn.wait(lambda: time.time() > end, timeout=secs + 5)
    except Exception:
        pass


def get091(env, queue, n, ack=True):
    c, ch = env.ch()
    out = []
    TAGGING[0] = True
    try:
        out = _get(ch, queue, n, ack)
    finally:
        TAGGING[0] = False
    c.close()
    return out


def _get(ch, queue, n, ack):
    out = []
    for _ in range(n):
        for _ in range(100):
            m, props, body = ch.basic_get(queue, auto_ack=ack)
            if m is not None:
                out.append((props, body))
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("queue %s: message not there" % queue)
    return out


def pub091(env, exchange, key, props, body):
    c, ch = env.ch()
    ch.confirm_delivery()
    ch.basic_publish(exchange, key, body, props, mandatory=False)
    c.close()

# ---------------------------------------------------------------- comparisons


def leaves(v, path):
    """(path, leaf) pairs of a nested value, Tagged unwrapped."""
    if isinstance(v, Tagged):
        v = v.value
    if isinstance(v, dict):
        r = []
        for k, x in v.items():
            r += leaves(x, "%s.%s" % (path, k))
        return r
    if isinstance(v, list):
        r = []
        for i, x in enumerate(v):
            r += leaves(x, "%s[%d]" % (path, i))
        return r
    return [(path, v)]


def norms(v):
    """Renderings of a value under which the other protocol may carry it."""
    if isinstance(v, Tagged):
        v = v.value
    if isinstance(v, Raw):
        v = v.shown.split(":", 1)[1]
    s = set()
    if v is None or isinstance(v, bool):
        return s
    if isinstance(v, bytes):
        s.add(v.decode("latin1"))
    elif isinstance(v, datetime.datetime):
        sec_ = int(v.timestamp())
        s |= {str(sec_), str(sec_ * 1000)}
    elif isinstance(v, uuid.UUID):
        s |= {str(v), v.bytes.decode("latin1"), "urn:uuid:" + str(v)}
    elif isinstance(v, timestamp):
        s |= {str(int(v)), str(int(v) // 1000)}
    elif isinstance(v, (decimal32, decimal64)):
        s.add("dec:%d" % int(v))
    elif isinstance(v, decimal128):
        s.add("dec:%r" % bytes(v))
    else:
        s.add(str(v))
    return s


ALIASES = {  # the other protocol's place for a field (mc_amqpl.erl), looked at besides values
    "header.durable": ["prop.delivery_mode"], "header.ttl": ["prop.expiration"],
    "header.priority": ["prop.priority"], "properties.creation-time": ["prop.timestamp"],
    "properties.message-id": ["prop.message_id", "hdr.x-message-id"],
    "properties.correlation-id": ["prop.correlation_id", "hdr.x-correlation-id"],
    "prop.delivery_mode": ["header.durable"], "prop.expiration": ["header.ttl"],
    "prop.priority": ["header.priority"], "prop.timestamp": ["properties.creation-time"],
    "prop.message_id": ["properties.message-id"],
    "prop.correlation_id": ["properties.correlation-id"], "prop.user_id": ["properties.user-id"],
    "prop.reply_to": ["properties.reply-to"], "prop.content_type": ["properties.content-type"],
    "prop.content_encoding": ["properties.content-encoding"], "body": ["body.data[0]"],
}


def find(sent_key, sent_val, got):
    """Where a sent field shows up in the flattened received message."""
    base = sent_key.split(".", 1)[1] if "." in sent_key else sent_key
    hits = [k for k in ALIASES.get(sent_key, []) if k in got]
    same_name = [k for k in got if k.split(".", 1)[-1] == base]
    if same_name and not sent_key.startswith("body"):
        return hits + [k for k in same_name if k not in hits]
    if sent_key.startswith("body") and "body" in got:
        hits.append("body")
    want = norms(sent_val)
    for k, v in got.items():
        kb = k.split(".", 1)[1] if "." in k else k
        if k in hits:
            continue
        if kb == base or (want and any(norms(x) & want for _, x in leaves(v, k))):
            hits.append(k)
    return hits


def show(v):
    if isinstance(v, Tagged):
        if isinstance(v.value, list):
            return "A:[%s]" % ", ".join(show(x) for x in v.value)
        if isinstance(v.value, dict):
            return "F:{%s}" % ", ".join("%s: %s" % (k, show(x)) for k, x in v.value.items())
        return repr(v)
    if isinstance(v, Raw):
        return v.shown
    if isinstance(v, (str, int)) and not isinstance(v, bool) and type(v) in (str, int):
        return repr(v)
    return t10(v)


def sent091_show(v):
    """The typed rendering of a value as pika sends it."""
    if isinstance(v, Raw):
        return v.shown
    if isinstance(v, str):
        return "S:%r" % v
    if isinstance(v, bytes):
        return "x:%r" % v
    if isinstance(v, bool):
        return "t:%r" % v
    if isinstance(v, decimal.Decimal):
        return "D:%s" % v
    if isinstance(v, datetime.datetime):
        return "T:%d" % int(v.timestamp())
    if v is None:
        return "V:None"
    if isinstance(v, dict):
        return "F:{%s}" % ", ".join("%s: %s" % (k, sent091_show(x)) for k, x in v.items())
    if isinstance(v, list):
        return "A:[%s]" % ", ".join(sent091_show(x) for x in v)
    return repr(v)


def cell(sent_key, sent_repr, got, got_show):
    hits = find(sent_key, None if sent_repr is None else sent_repr[1], got)
    if not hits:
        return "lost"
    parts = []
    for h in hits:
        r = got_show(got[h])
        if h == sent_key and r == sent_repr[0]:
            parts.append("same")
        else:
            parts.append("%s = %s" % (h, r))
    return "; ".join(parts)

# ---------------------------------------------------------------- experiments


def conversions(env, qtype, report):
    q10, q091 = "conv10-" + qtype, "conv091-" + qtype
    cases = cases10()
    env.declare(q10 + "-a", qtype)
    for i in range(len(cases)):
        env.declare("%s-b%d" % (q10, i), qtype)
    conn = env.c10()
    report["publish10-outcomes-" + qtype] = send10(conn, "/queues/%s-a" % q10,
                                                   [encode_msg(s) for _, s in cases])
    for i, (_, s) in enumerate(cases):
        send10(conn, "/queues/%s-b%d" % (q10, i), [encode_msg(s)])
    got10, _, _ = recv10(conn, "/queues/%s-a" % q10, len(cases))
    conn.close()
    got091 = []
    for i in range(len(cases)):
        try:
            got091.append(get091(env, "%s-b%d" % (q10, i), 1)[0])
        except Exception as e:  # the broker may fail the conversion
            got091.append(("error", "%s: %s" % (type(e).__name__, e)))
    rows10 = []
    for (name, s), g10, (p, b) in zip(cases, got10, got091):
        sent = flat10([(SECTION[c], v) for c, v in s])
        r10 = flat10(g10)
        if isinstance(p, str):
            r091, cells091 = {"error": b}, {k: "conversion failed: " + b for k in sent}
        else:
            r091 = flat091(p, b)
            cells091 = {k: cell(k, (t10(v), v), r091, show) for k, v in sent.items()}
        rows10.append({"case": name, "sent": {k: t10(v) for k, v in sent.items()},
                       "got10": {k: t10(v) for k, v in r10.items()},
                       "got091": {k: show(v) for k, v in r091.items()},
                       "cells": {k: (cell(k, (t10(v), v), r10, t10), cells091[k])
                                 for k, v in sent.items()},
                       "added10": [k for k in r10 if not any(
                           k in find(sk, sv, r10) for sk, sv in sent.items())]})
    report["rows10-" + qtype] = rows10
    # 0-9-1 published: one message with every property, then one per header type (one bad
    # header value type must not hide the others: a conversion failure ends the 1.0 session)
    full = hdr_table()
    cases = [("properties", None)] + [(k, k) for k in full]
    rows = []
    for i, (name, hk) in enumerate(cases):
        props = pub091_props()
        props.headers = None if hk is None else {hk: full[hk]}
        qa, qb = "%s-a%d" % (q091, i), "%s-b%d" % (q091, i)
        env.declare(qa, qtype)
        env.declare(qb, qtype)
        for q in (qa, qb):
            pub091(env, "", q, props, b"body-091")
        sent = flat091(props, b"body-091")
        row = {"case": name, "sent": {k: sent091_show(v) for k, v in sent.items()}}
        try:
            conn = env.c10()
            g10, _, _ = recv10(conn, "/queues/" + qa, 1)
            conn.close()
            r10 = flat10(g10[0])
            row["got10"] = {k: t10(v) for k, v in r10.items()}
            c10 = {k: cell(k, (sent091_show(v), v), r10, t10) for k, v in sent.items()}
        except Exception as e:
            msg = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])
            row["got10"] = {"error": msg}
            c10 = {k: "read failed: " + msg for k in sent}
        (p, b), = get091(env, qb, 1)
        r091 = flat091(p, b)
        row["got091"] = {k: show(v) for k, v in r091.items()}
        row["cells"] = {k: (c10[k], cell(k, (sent091_show(v), v), r091, show))
                        for k, v in sent.items()}
        rows.append(row)
    report["rows091-" + qtype] = rows


def added_annotations(env, qtype, report):
    """Fact a: what the broker adds on delivery over 1.0, by publish address."""
    q = "ann-" + qtype
    env.declare(q, qtype)
    c, ch = env.ch()
    ch.exchange_declare("ann-x", "direct", durable=True)
    ch.queue_bind(q, "amq.direct", "k-" + qtype)
    ch.queue_bind(q, "ann-x", "kx-" + qtype)
    c.close()
    minimal = encode_msg([(0x75, b"m")])
    spoof = encode_msg([(0x70, [True, None, None, True, uint(3)]),
                        (0x72, {symbol("x-exchange"): "spoof-x",
                                symbol("x-routing-key"): "spoof-k",
                                symbol("x-opt-own"): "own-1"}),
                        (0x75, b"m")])
    conn = env.c10()
    plan = [("1.0 minimal -> /queues/" + q, "/queues/" + q, minimal),
            ("1.0 minimal -> /exchanges/amq.direct/k", "/exchanges/amq.direct/k-" + qtype, minimal),
            ("1.0 minimal -> /exchanges/ann-x/kx (declared direct)", "/exchanges/ann-x/kx-" + qtype,
             minimal),
            ("1.0 with header delivery-count=3, first-acquirer=true, ma x-exchange/x-routing-key "
             "-> /queues/" + q, "/queues/" + q, spoof),
            ("same -> /exchanges/amq.direct/k", "/exchanges/amq.direct/k-" + qtype, spoof)]
    for name, addr, m in plan:
        send10(conn, addr, [m])
    got, _, _ = recv10(conn, "/queues/" + q, len(plan))
    conn.close()
    out = []
    for (name, _, _), g in zip(plan, got):
        out.append({"case": name, "got10": [(n, t10(v)) for n, v in g]})
    # 0-9-1 published, read over 1.0 (basic minimal and with a header)
    pub091(env, "", q, pika.BasicProperties(), b"m")
    pub091(env, "amq.direct", "k-" + qtype, pika.BasicProperties(delivery_mode=2), b"m")
    conn = env.c10()
    got, _, _ = recv10(conn, "/queues/" + q, 2)
    conn.close()
    out.append({"case": "0-9-1 no properties -> default exchange", "got10": [(n, t10(v)) for n, v in got[0]]})
    out.append({"case": "0-9-1 delivery_mode=2 -> amq.direct", "got10": [(n, t10(v)) for n, v in got[1]]})
    # 1.0 published minimal, read over 0-9-1
    conn = env.c10()
    send10(conn, "/queues/" + q, [minimal])
    conn.close()
    (p, b), = get091(env, q, 1)
    out.append({"case": "1.0 minimal -> read over 0-9-1",
                "got091": {k: show(v) for k, v in flat091(p, b).items()}})
    report["added-" + qtype] = out


GIVEBACKS = ["released", "modified(failed=false)", "modified(failed=true)",
             "modified(failed=false, undeliverable=true)", "detach link unsettled",
             "close connection unsettled", "0-9-1 nack requeue", "0-9-1 close unacked"]


def giveback(env, qtype, report):
    """Fact b: delivery count and order after each kind of give-back."""
    res = []
    for gi, kind in enumerate(GIVEBACKS):
        row = {"give-back": kind}
        for readback in ("1.0", "0-9-1"):
            q = "gb-%s-%d-%s" % (qtype, gi, readback.replace(".", ""))
            env.declare(q, qtype)
            for i in range(3):
                pub091(env, "", q, pika.BasicProperties(message_id="m%d" % i), b"m%d" % i)
            if kind.startswith("0-9-1"):
                c, ch = env.ch()
                tags = []
                for _ in range(3):
                    for _ in range(100):
                        m, _, _ = ch.basic_get(q, auto_ack=False)
                        if m:
                            tags.append(m.delivery_tag)
                            break
                        time.sleep(0.05)
                if kind == "0-9-1 nack requeue":
                    for t in tags:
                        ch.basic_nack(t, requeue=True)
                c.close()
            else:
                conn = env.c10()
                _, h, r = recv10(conn, "/queues/" + q, 3, settle=None)
                if kind.startswith("released") or kind.startswith("modified"):
                    for d, _ in h.got:
                        if kind == "released":
                            d.update(Delivery.RELEASED)
                        else:
                            d.local.failed = "failed=true" in kind
                            d.local.undeliverable = "undeliverable=true" in kind
                            d.update(Delivery.MODIFIED)
                        d.settle()
                    pump(conn)
                    r.close()
                    conn.close()
                elif kind == "detach link unsettled":
                    r.close()
                    pump(conn)
                    conn.close()
                else:
                    conn.close()
            time.sleep(0.3)
            if readback == "1.0":
                conn = env.c10()
                try:
                    got, _, _ = recv10(conn, "/queues/" + q, 3)
                    seen = []
                    for g in got:
                        f = flat10(g)
                        seen.append("%s dc=%s fa=%s" % (
                            f.get("properties.message-id"), f.get("header.delivery-count"),
                            f.get("header.first-acquirer")))
                    row["1.0 read"] = seen
                except Exception as e:  # e.g. dead-lettered / dropped by undeliverable
                    row["1.0 read"] = "error: %s" % e
                conn.close()
            else:
                try:
                    got = get091(env, q, 3)
                    row["0-9-1 read"] = ["%s x-delivery-count=%s" % (
                        p.message_id, (p.headers or {}).get("x-delivery-count")) for p, _ in got]
                except Exception as e:
                    row["0-9-1 read"] = "error: %s" % e
        res.append(row)
    report["giveback-" + qtype] = res


def publish_outcomes(env, report):
    """Fact d: outcome of unsettled 1.0 publishes to unroutable/missing targets."""
    out = {}
    c, ch = env.ch()
    ch.exchange_declare("nobind-x", "direct", durable=True)
    c.close()
    for name, addr in [("amq.direct, no binding", "/exchanges/amq.direct/nobody"),
                       ("declared direct exchange, no binding", "/exchanges/nobind-x/nobody"),
                       ("missing queue", "/queues/does-not-exist"),
                       ("missing exchange", "/exchanges/does-not-exist/k"),
                       ("default exchange via /exchanges/amq.default/q", "/exchanges/amq.default/x")]:
        conn = env.c10()
        try:
            out[name] = send10(conn, addr, [encode_msg([(0x75, b"m")])])
        except Exception as e:
            out[name] = "%s: %s" % (type(e).__name__, e)
        try:
            conn.close()
        except Exception:
            pass
    report["publish-outcomes"] = out


def hatch(env, qtype, report):
    """A 1.0 message republished over 0-9-1 with the x-amqp-1.0-* headers (mc_amqpl.erl
    amqp10_section_header) and type "amqp-1.0": what a 1.0 reader then sees, against the original."""
    q = "hatch-" + qtype
    env.declare(q, qtype)
    ap = {k: v for k, v in app_props().items() if k != "a-null"}  # a null crashes the reader
    secs = base10(body=[(0x77, {"k": "v"})], mid=ulong(77), cid=uuid.UUID(int=5), ap=ap)
    by = dict(secs)
    hdrs = {"x-amqp-1.0-properties": sec(0x73, by[0x73]),
            "x-amqp-1.0-app-properties": sec(0x74, by[0x74]),
            "x-amqp-1.0-message-annotations": sec(0x72, by[0x72]),
            "x-amqp-1.0-footer": sec(0x78, by[0x78])}
    pub091(env, "", q, pika.BasicProperties(type="amqp-1.0", headers=hdrs, delivery_mode=2,
                                            priority=7, expiration="3600000"),
           sec(0x77, {"k": "v"}))
    conn = env.c10()
    try:
        got, _, _ = recv10(conn, "/queues/" + q, 1)
        conn.close()
    except Exception as e:
        report["hatch-" + qtype] = "read failed: %s" % str(e).splitlines()[0][:300]
        return
    sent = flat10([(SECTION[c], v) for c, v in secs])
    g = flat10(got[0])
    report["hatch-" + qtype] = {
        "differ": {k: [t10(v), t10(g[k]) if k in g else "MISSING"] for k, v in sent.items()
                   if k not in g or t10(v) != t10(g[k])},
        "added": {k: t10(v) for k, v in g.items() if k not in sent}}


def markdown(report):
    """The conversion tables of one broker version, as markdown."""
    out = ["## RabbitMQ %s" % report["version"], ""]
    for qtype in ("classic", "quorum"):
        if "rows10-" + qtype not in report:
            continue
        out += ["### AMQP 1.0 published (%s queue)" % qtype, "",
                "| case | field: sent | 1.0 -> 1.0 | 1.0 -> 0-9-1 |", "|---|---|---|---|"]
        for row in report["rows10-" + qtype]:
            for k, (a, b) in row["cells"].items():
                if row["case"].startswith("full") or (
                        row["case"].startswith("message-id") and "-id" in k) or (
                        row["case"].startswith("body") and k.startswith("body")) or (
                        row["case"].startswith("application") and k.startswith("ap.")):
                    out.append("| %s | `%s`: `%s` | %s | %s |" % (
                        row["case"], k, row["sent"][k], md(a), md(b)))
            if row["case"].startswith("full"):
                out.append("| %s | added by the broker | %s | |" % (
                    row["case"], ", ".join("`%s`=`%s`" % (k, row["got10"][k])
                                           for k in row["added10"])))
        out += ["", "### AMQP 0-9-1 published (%s queue)" % qtype, "",
                "| case | field: sent | 0-9-1 -> 1.0 | 0-9-1 -> 0-9-1 |", "|---|---|---|---|"]
        for row in report["rows091-" + qtype]:
            for k, (a, b) in row["cells"].items():
                if row["case"] == "properties" or k == "hdr." + row["case"]:
                    out.append("| %s | `%s`: `%s` | %s | %s |" % (
                        row["case"], k, row["sent"][k], md(a), md(b)))
            if row["case"] == "properties":
                out.append("| properties | 1.0 sections seen | %s | |" % md(", ".join(
                    "%s=%s" % (k, row["got10"][k]) for k in row["got10"])))
        out.append("")
    return "\n".join(out)


def md(x):
    x = x if len(x) < 400 else x[:400] + "..."
    return "`%s`" % x.replace("|", "\\|").replace("`", "'") if x not in ("same", "lost") else (
        "**lost**" if x == "lost" else "same")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5692, help="AMQP port (0-9-1 and 1.0)")
    ap.add_argument("--mgmt", type=int, default=15692)
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--only", default="added,giveback,publish,conversions,hatch")
    ap.add_argument("--markdown", help="render the tables of a --json file and exit")
    a = ap.parse_args()
    if a.markdown:
        with open(a.markdown) as f:
            print(markdown(json.load(f)))
        return 0
    env = Env(a.host, a.port, a.mgmt)
    env.amqp091_port = a.port
    report = {"version": env.version()}
    env.setup()
    try:
        for part in a.only.split(","):
            for qtype in ("classic", "quorum"):
                if part == "added":
                    added_annotations(env, qtype, report)
                elif part == "giveback":
                    giveback(env, qtype, report)
                elif part == "conversions":
                    conversions(env, qtype, report)
                elif part == "hatch":
                    hatch(env, qtype, report)
            if part == "publish":
                publish_outcomes(env, report)
    finally:
        env.teardown()
    text = json.dumps(report, indent=1, default=str)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    print(text)
    if "rows10-classic" in report:
        print(markdown(report))


if __name__ == "__main__":
    sys.exit(main())
