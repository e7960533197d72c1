#!/usr/bin/env python3
"""An AMQP 1.0 implementation that is not ours (Apache Qpid Proton), for tests/amqp10_client.rs.

  proton_oracle.py publish URL VHOST ADDRESS COUNT SEED
      publishes COUNT messages of many shapes (data, amqp-value and amqp-sequence bodies,
      every property, application properties of many types, header fields, message and
      delivery annotations, a body larger than a frame) to ADDRESS, and prints, one line per
      message in order, the hex of the bytes proton encoded (Message.encode(): what it sends).
  proton_oracle.py receive URL VHOST ADDRESS COUNT OUTCOME
      receives COUNT messages from ADDRESS and prints, one line per message, a JSON object with
      the raw transferred bytes ("raw", hex) and what proton decodes of them ("body", "subject",
      "properties" as repr), then settles each with OUTCOME (accept: each as it comes;
      release: all together once COUNT are read, so that none comes back within the read).

Debian's python3-qpid-proton (0.37) or PyPI's python-qpid-proton.
"""
import datetime
import json
import random
import sys
import uuid

from proton import Delivery, Message, char, decimal32, int32, short, symbol, timestamp, ubyte, uint, ulong, ushort
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection


def message(i, rng):
    kind = i % 8
    props = dict(
        id=uuid.UUID(int=rng.getrandbits(128)),
        user_id=b"guest",
        subject="subject-%d" % i,
        reply_to="/queues/replies",
        correlation_id=ulong(i * 7),
        content_type=symbol("application/octet-stream"),
        content_encoding=symbol("identity"),
        expiry_time=timestamp(1_900_000_000_000 + i),
        creation_time=timestamp(1_800_000_000_000 + i),
        group_id="group-é-%d" % i,
        group_sequence=i,
        reply_to_group_id="rg",
    )
    app = {
        "seq": i,
        "long": 1 << 40,
        "neg": int32(-5),
        "short": short(-3),
        "ubyte": ubyte(200),
        "ushort": ushort(60000),
        "uint": uint(4000000000),
        "bool": i % 2 == 0,
        "float": 1.5,
        "string": "ünïcode ✓",
        "symbol": symbol("sym"),
        "binary": bytes([0, 255, 1, 254]),
        "timestamp": timestamp(1_700_000_000_123),
        "uuid": uuid.UUID(int=i),
        "char": char("x"),
        "null": None,
        "decimal": decimal32(7),
    }
    body_bytes = bytes(rng.getrandbits(8) for _ in range(1 + (i * 37) % 500))
    if kind == 0:
        return Message(body=body_bytes, inferred=True)
    if kind == 1:
        return Message(body="text body %d ✓" % i, properties=app, **props)
    if kind == 2:
        return Message(body=[1, "two", 3.0, None, True, symbol("s")], inferred=True,
                       properties={"seq": i})
    if kind == 3:
        return Message(body={"k": [1, 2, {"n": None}], symbol("s"): ulong(9), 5: b"bin"},
                       properties={"seq": i}, subject="map")
    if kind == 4:
        return Message(body=body_bytes, inferred=True, durable=True, priority=7, ttl=3_600_000,
                       annotations={symbol("x-opt-foo"): "bar", symbol("x-opt-n"): i},
                       instructions={symbol("x-opt-di"): "delivery annotation"},
                       properties={"seq": i}, **props)
    if kind == 5:
        return Message(body=b"", inferred=False, properties={"seq": i}, subject="empty binary amqp-value")
    if kind == 6:
        return Message(body=b"", inferred=True, properties={"seq": i, "empty": ""})
    # Larger than the frames of both sides (131072): several transfers.
    big = bytes(rng.getrandbits(8) for _ in range(300_000 + i))
    return Message(body=big, inferred=True, properties={"seq": i, "big": True}, **props)


def publish(url, vhost, address, count, seed):
    rng = random.Random(seed)
    conn = BlockingConnection(url, virtual_host="vhost:" + vhost, allowed_mechs="PLAIN")
    sender = conn.create_sender(address)
    for i in range(count):
        m = message(i, rng)
        print(m.encode().hex(), flush=True)
        sender.send(m)
    conn.close()


class Receive(MessagingHandler):
    def __init__(self, url, vhost, address, count, outcome):
        # Credit granted by hand, never more than the messages still to read: with Proton's
        # prefetch the link was given credit again as messages came, so the broker delivered
        # released messages again to this link before its detach, which gave them back once
        # more (RabbitMQ 4.0.5 quorum queue: one read counted 2 in x-delivery-count for 9 of
        # 16 messages, 1 for the others, under load).
        super().__init__(auto_accept=False, prefetch=0)
        self.url, self.vhost, self.address = url, vhost, address
        self.left = count
        self.held = []
        self.outcome = Delivery.ACCEPTED if outcome == "accept" else Delivery.RELEASED

    def on_start(self, event):
        conn = event.container.connect(self.url, virtual_host="vhost:" + self.vhost,
                                       allowed_mechs="PLAIN")
        receiver = event.container.create_receiver(conn, self.address)
        receiver.flow(min(self.left, 500))

    def on_delivery(self, event):
        d = event.delivery
        if not d.readable or d.partial or self.left <= 0:
            return
        raw = event.link.recv(d.pending)
        event.link.advance()
        m = Message()
        m.decode(raw)
        print(json.dumps({"raw": raw.hex(), "body": repr(m.body), "subject": m.subject,
                          "properties": repr(m.properties)}), flush=True)
        self.left -= 1
        if event.link.credit == 0 and self.left > 0:
            event.link.flow(min(self.left, 500))
        if self.outcome == Delivery.ACCEPTED:
            d.update(self.outcome)
            d.settle()
        else:
            # Released only once all COUNT are read: a message released while others were
            # still to come went back to the queue's head and, under load, was delivered again
            # in place of the last one (RabbitMQ 4.0.5 quorum queue), which then went unread.
            self.held.append(d)
        if self.left == 0:
            for h in self.held:
                h.update(self.outcome)
                h.settle()
            # The link first: the broker answers its detach after the dispositions before it,
            # so every outcome is applied before the connection closes (on_link_closed). A
            # close right after the dispositions left, once in the suite, the last released
            # message of a RabbitMQ 4.3.6 classic queue uncounted, as if it had never been
            # released.
            event.link.close()

    def on_link_closed(self, event):
        event.connection.close()


def main():
    cmd, url, vhost, address, count, extra = sys.argv[1:7]
    if cmd == "publish":
        publish(url, vhost, address, int(count), int(extra))
    elif cmd == "receive":
        Container(Receive(url, vhost, address, int(count), extra)).run()
    else:
        raise SystemExit("unknown command " + cmd)


if __name__ == "__main__":
    main()
