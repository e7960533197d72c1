#!/usr/bin/env python3
"""Apache Qpid Proton as the oracle of tests/amqp10_restore.rs (an AMQP 1.0 implementation that
is not ours): it publishes messages that cover every AMQP 1.0 section and simple type, and reads
messages back, describing each section with the AMQP type of every value as proton decodes it.

  proton_restore.py publish URL VHOST ADDRESS
      publishes the set of messages (built section by section with proton's own encoder:
      several data sections, amqp-sequence and amqp-value bodies, a footer, header, publisher
      message annotations, properties with ulong/uuid/binary/string ids, application
      properties of every simple type) to ADDRESS, each settled `accepted` by the broker, and
      prints one JSON line per message: {"raw": hex, "bare": hex, "sections": typed}.
  proton_restore.py bulk URL VHOST ADDRESS COUNT SIZE
      publishes COUNT messages: properties (ulong message-id i, subject), application
      properties {"i": long i}, one data section of SIZE bytes; prints "published COUNT".
  proton_restore.py encode URL VHOST ADDRESS COUNT SIZE
      prints the hex of the messages `bulk` would publish, one per line, publishing nothing.
  proton_restore.py read URL VHOST ADDRESS COUNT
      receives COUNT messages, accepts them, and prints one JSON line per message as
      `publish` does ("raw" being the transferred bytes).

"sections" is a list of [descriptor, typed value]; a typed value is [type name, value] with
proton's names (ulong, ubyte, char, symbol, timestamp, uuid, int32, float32, ...); maps keep
their order as pairs. "bare" is the encoding of the bare message (properties onwards).

Debian's python3-qpid-proton (0.37).
"""
import json
import sys
import uuid

from proton import (UNDESCRIBED, Array, Data, Described, char, decimal32, decimal64, decimal128, byte, float32,
                    int32, short, symbol, timestamp, ubyte, uint, ulong, ushort)
from proton.handlers import MessagingHandler
from proton.reactor import Container

HEADER, DELIVERY_ANN, MESSAGE_ANN, PROPERTIES, APP_PROPS, DATA, SEQUENCE, VALUE, FOOTER = range(0x70, 0x79)


def section(code, value):
    d = Data()
    d.put_object(Described(ulong(code), value))
    return d.encode()


def props(message_id=None, user_id=None, to=None, subject=None, reply_to=None, correlation_id=None,
          content_type=None, content_encoding=None, absolute_expiry_time=None, creation_time=None,
          group_id=None, group_sequence=None, reply_to_group_id=None):
    return section(PROPERTIES, [message_id, user_id, to, subject, reply_to, correlation_id,
                                content_type, content_encoding, absolute_expiry_time,
                                creation_time, group_id, group_sequence, reply_to_group_id])


def every_simple_type(i):
    return {
        "i": i,
        "null": None,
        "bool": True,
        "ubyte": ubyte(200),
        "ushort": ushort(60000),
        "uint": uint(4_000_000_000),
        "ulong": ulong(2**63 + 5),
        "byte": byte(-7),
        "short": short(-300),
        "int": int32(-70000),
        "long": -(2**40),
        "float": float32(1.5),
        "double": 2.25,
        "decimal32": decimal32(7),
        "decimal64": decimal64(8),
        "decimal128": decimal128(b"\x01" * 16),
        "char": char("λ"),
        "timestamp": timestamp(1_700_000_000_123),
        "uuid": uuid.UUID(int=0x1234_5678_9ABC_DEF0 + i),
        "binary": bytes([0, 255, 1, 254]),
        "string": "ünïcode ✓",
        "symbol": symbol("sym-bol"),
    }


def message_set():
    """The messages, each a list of encoded sections."""
    ms = []
    # 0: ulong ids, to, subject, creation-time with ms, simple types, one data section.
    ms.append([
        props(message_id=ulong(2**40 + 1), user_id=b"guest", to="/queues/elsewhere",
              subject="subject with to", reply_to="/queues/replies",
              correlation_id=ulong(77), content_type=symbol("application/octet-stream"),
              content_encoding=symbol("identity"),
              absolute_expiry_time=timestamp(4_102_444_800_123),
              creation_time=timestamp(1_800_000_000_123), group_id="group-é",
              group_sequence=uint(9), reply_to_group_id="reply-group"),
        section(APP_PROPS, every_simple_type(0)),
        section(DATA, bytes(range(256)) * 3),
    ])
    # 1: uuid message-id, binary correlation-id, amqp-value string, footer.
    ms.append([
        props(message_id=uuid.UUID(int=0xDEADBEEF), correlation_id=b"\x00corr\xff",
              subject="amqp-value", creation_time=timestamp(1_800_000_000_001)),
        section(APP_PROPS, {"i": 1, "kind": symbol("value")}),
        section(VALUE, "a string body ✓"),
        section(FOOTER, {symbol("x-opt-checksum"): ulong(12345), symbol("x-opt-note"): "footer"}),
    ])
    # 2: binary message-id, uuid correlation-id, two amqp-sequence sections.
    ms.append([
        props(message_id=b"\x01\x02binary-id", correlation_id=uuid.UUID(int=42), to="somewhere"),
        section(APP_PROPS, {"i": 2}),
        section(SEQUENCE, [1, "two", 3.0, None, True, symbol("s"), ubyte(1)]),
        section(SEQUENCE, [[ulong(1), {"nested": b"\x00"}], timestamp(5)]),
    ])
    # 3: header (durable, priority, ttl), publisher message annotations, several data
    #    sections, footer; string ids.
    ms.append([
        section(HEADER, [True, ubyte(4), uint(3_600_000)]),
        section(MESSAGE_ANN, {symbol("x-opt-foo"): "bar", symbol("x-opt-n"): 3,
                              symbol("x-opt-sym"): symbol("v"), symbol("x-opt-ts"): timestamp(9)}),
        props(message_id="string-id", correlation_id="string-corr", subject="several data"),
        section(APP_PROPS, {"i": 3, "ubyte": ubyte(3), "char": char("x")}),
        section(DATA, b"first data section "),
        section(DATA, b""),
        section(DATA, bytes(range(200))),
        section(FOOTER, {symbol("x-opt-f"): True}),
    ])
    # 4: amqp-value map and a described value; header without durable; app properties again.
    ms.append([
        section(HEADER, [False, ubyte(2), None]),
        props(message_id=ulong(4), creation_time=timestamp(1_800_000_000_999)),
        section(APP_PROPS, every_simple_type(4)),
        section(VALUE, {"k": [1, 2, {"n": None}], symbol("s"): ulong(9), 5: b"bin",
                        "arr": Array(UNDESCRIBED, Data.INT, 1, 2, 3)}),
    ])
    # 5: amqp-value null, nothing else.
    ms.append([section(VALUE, None)])
    # 6: a body larger than a frame (several transfers both ways).
    ms.append([
        props(message_id=ulong(6), subject="big"),
        section(APP_PROPS, {"i": 6}),
        section(DATA, bytes((j * 7) % 251 for j in range(300_000))),
        section(DATA, b"tail"),
    ])
    # 7: only a data section.
    ms.append([section(DATA, b"just data")])
    return [b"".join(m) for m in ms]


def bulk_message(i, size):
    return (props(message_id=ulong(i), subject="bulk") + section(APP_PROPS, {"i": i})
            + section(DATA, bytes((i + j) % 256 for j in range(size))))


def typed(v):
    if v is None:
        return ["null", None]
    if isinstance(v, Described):
        return ["described", typed(v.descriptor), typed(v.value)]
    if isinstance(v, bool):
        return ["bool", v]
    name = type(v).__name__
    if isinstance(v, dict):
        return ["map", [[typed(k), typed(x)] for k, x in v.items()]]
    if isinstance(v, list):
        return ["list", [typed(x) for x in v]]
    if isinstance(v, Array):
        return ["array", repr(v.descriptor), str(v.type), [typed(x) for x in v.elements]]
    if isinstance(v, (bytes, bytearray)):
        return [name, bytes(v).hex()]
    if isinstance(v, uuid.UUID):
        return ["uuid", str(v)]
    if isinstance(v, (float, decimal32, decimal64, decimal128)):
        return [name, repr(v)]
    if isinstance(v, (int, str)):
        return [name, v if not isinstance(v, int) else str(v)]
    return [name, repr(v)]


def describe(raw):
    """The sections of an encoded message, typed, and the encoding of its bare message."""
    sections, bare, rest = [], b"", bytes(raw)
    while rest:
        d = Data()
        n = d.decode(rest)
        d.rewind()
        d.next()
        v = d.get_object()
        code = int(v.descriptor)
        if code >= PROPERTIES:
            bare += rest[:n]
        sections.append([code, typed(v.value)])
        rest = rest[n:]
    return {"raw": bytes(raw).hex(), "bare": bare.hex(), "sections": sections}


class Send(MessagingHandler):
    def __init__(self, url, vhost, address, messages):
        super().__init__(auto_settle=True)
        self.url, self.vhost, self.address, self.messages = url, vhost, address, messages
        self.sent = self.settled = 0
        self.failure = None

    def on_start(self, event):
        conn = event.container.connect(self.url, virtual_host="vhost:" + self.vhost,
                                       allowed_mechs="PLAIN")
        event.container.create_sender(conn, self.address)

    def on_sendable(self, event):
        s = event.sender
        while s.credit > 0 and self.sent < len(self.messages):
            s.delivery(str(self.sent))
            s.stream(self.messages[self.sent])
            s.advance()
            self.sent += 1

    def on_accepted(self, event):
        self.settled += 1
        if self.settled == len(self.messages):
            event.connection.close()

    def on_rejected(self, event):
        self.failure = "rejected: %r" % (event.delivery.remote.condition,)
        event.connection.close()

    def on_released(self, event):
        self.failure = "released"
        event.connection.close()


class Receive(MessagingHandler):
    def __init__(self, url, vhost, address, count):
        super().__init__(auto_accept=False, prefetch=min(count, 200))
        self.url, self.vhost, self.address, self.left = url, vhost, address, count

    def on_start(self, event):
        conn = event.container.connect(self.url, virtual_host="vhost:" + self.vhost,
                                       allowed_mechs="PLAIN")
        event.container.create_receiver(conn, self.address)

    def on_delivery(self, event):
        d = event.delivery
        if not d.readable or d.partial or self.left <= 0:
            return
        raw = event.link.recv(d.pending)
        event.link.advance()
        print(json.dumps(describe(raw)), flush=True)
        d.update(d.ACCEPTED)
        d.settle()
        self.left -= 1
        if self.left == 0:
            event.connection.close()


def send(url, vhost, address, messages):
    h = Send(url, vhost, address, messages)
    Container(h).run()
    if h.failure or h.settled != len(messages):
        raise SystemExit("publish failed: %s (%d of %d accepted)"
                         % (h.failure, h.settled, len(messages)))


def main():
    cmd, url, vhost, address = sys.argv[1:5]
    if cmd == "publish":
        messages = message_set()
        for m in messages:
            print(json.dumps(describe(m)), flush=True)
        send(url, vhost, address, messages)
    elif cmd in ("bulk", "encode"):
        count, size = int(sys.argv[5]), int(sys.argv[6])
        messages = [bulk_message(i, size) for i in range(count)]
        if cmd == "encode":
            for m in messages:
                print(m.hex())
            return
        send(url, vhost, address, messages)
        print("published %d" % count)
    elif cmd == "read":
        Container(Receive(url, vhost, address, int(sys.argv[5]))).run()
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main()
