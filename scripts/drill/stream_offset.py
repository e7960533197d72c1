"""Stores or queries a stream consumer offset over the RabbitMQ stream protocol (python3 standard
library only): `store HOST PORT USER PASSWORD VHOST STREAM REFERENCE OFFSET` or
`query HOST PORT USER PASSWORD VHOST STREAM REFERENCE` (prints the offset, exit 2 when none)."""
import socket, struct, sys

def s16(b): return struct.pack(">h", len(b)) + b
def string(x): return s16(x.encode())

class Conn:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.corr = 0
    def send(self, key, body, corr=True):
        payload = struct.pack(">HH", key, 1)
        if corr:
            self.corr += 1
            payload += struct.pack(">I", self.corr)
        payload += body
        self.sock.sendall(struct.pack(">I", len(payload)) + payload)
    def recv_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk: raise SystemExit("stream connection closed by the broker")
            out += chunk
        return out
    def frame(self):
        size, = struct.unpack(">I", self.recv_exact(4))
        data = self.recv_exact(size)
        key, _ = struct.unpack(">HH", data[:4])
        return key, data[4:]
    def expect(self, key):
        """The next frame of `key` (a response: key | 0x8000); answers Tune and skips heartbeats."""
        while True:
            k, body = self.frame()
            if k == 0x0014:  # Tune from the server: answer with the same values
                self.send(0x0014, body[:8], corr=False)
                if key == 0x0014: return body
                continue
            if k == 0x0017:  # heartbeat
                continue
            if k == key:
                return body
    def call(self, key, body):
        self.send(key, body)
        resp = self.expect(key | 0x8000)
        corr, code = struct.unpack(">IH", resp[:6])
        return code, resp[6:]

def connect(host, port, user, password, vhost):
    c = Conn(host, port)
    code, _ = c.call(0x0011, struct.pack(">i", 1) + string("product") + string("rmq-backup-drill"))
    assert code == 1, f"peer properties: code {code}"
    code, _ = c.call(0x0012, b"")
    assert code == 1, f"sasl handshake: code {code}"
    opaque = b"\0" + user.encode() + b"\0" + password.encode()
    code, _ = c.call(0x0013, string("PLAIN") + struct.pack(">i", len(opaque)) + opaque)
    if code != 1: raise SystemExit(f"stream login refused (code {code})")
    c.expect(0x0014)
    code, _ = c.call(0x0015, string(vhost))
    if code != 1: raise SystemExit(f"stream open of vhost {vhost} refused (code {code})")
    return c

def main(argv):
    op, host, port, user, password, vhost, stream, ref = argv[:8]
    c = connect(host, port, user, password, vhost)
    if op == "store":
        c.send(0x000a, string(ref) + string(stream) + struct.pack(">Q", int(argv[8])), corr=False)
    code, rest = c.call(0x000b, string(ref) + string(stream))
    if code == 1:
        offset, = struct.unpack(">Q", rest[:8])
        print(offset)
        return 0
    if op == "store":
        raise SystemExit(f"the stored offset cannot be read back (code {code})")
    return 2

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
