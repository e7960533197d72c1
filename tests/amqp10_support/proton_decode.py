#!/usr/bin/env python3
"""Qpid Proton's reading of AMQP 1.0 messages, for tests/amqp10_backup.rs (an oracle that is
not rmq-backup's code).

  proton_decode.py < HEX_LINES
      reads one message per line (the hex of its encoded sections, or a JSON object with the
      hex under "raw" as proton_oracle.py receive prints it) and prints, one line per message, a
      JSON object of every field proton decodes, each value as its repr (which names the AMQP
      type: ulong(7), symbol('s'), timestamp(...), UUID(...), b'...'), and the footer.
"""
import json
import sys

from proton import Message


FIELDS = ["durable", "priority", "ttl", "first_acquirer", "delivery_count", "id", "user_id",
          "address", "subject", "reply_to", "correlation_id", "content_type", "content_encoding",
          "expiry_time", "creation_time", "group_id", "group_sequence", "reply_to_group_id",
          "instructions", "annotations", "properties", "body", "inferred"]


def describe(raw):
    m = Message()
    m.decode(raw)
    out = {f: repr(getattr(m, f)) for f in FIELDS}
    # Types of the values inside (repr of a dict shows the wrapper types proton keeps).
    out["body_type"] = type(m.body).__name__
    try:
        out["footer"] = repr(m.footer)
    except AttributeError:
        out["footer"] = "n/a"
    return out


def main():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            line = json.loads(line)["raw"]
        print(json.dumps(describe(bytes.fromhex(line)), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
