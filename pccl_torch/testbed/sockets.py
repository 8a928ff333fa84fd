"""Plain-socket measurements of a testbed link (stdlib only, run as a script inside node namespaces):
round-trip time by a TCP ping-pong of small messages and rate by a one-way TCP bulk transfer.

    ip netns exec pccl-n1 python pccl_torch/testbed/sockets.py serve --port 5201 --count 2 &
    ip netns exec pccl-n0 python pccl_torch/testbed/sockets.py rtt 10.77.0.2 --port 5201
    ip netns exec pccl-n0 python pccl_torch/testbed/sockets.py bulk 10.77.0.2 --port 5201 --seconds 3

``serve`` answers ``count`` connections one after the other (``--count 0``: until killed); the client's first
byte says what it wants: ``p`` ping-pong (every 64-byte message echoed), ``b`` bulk (everything read and thrown
away, the count of bytes sent back at the end). ``rtt`` and ``bulk`` print one JSON object.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time

PING_BYTES = 64
CHUNK = 1 << 20
DEFAULT_PORT = 5201


def _exact(conn: socket.socket, nbytes: int) -> bytes:
    """Read exactly ``nbytes`` (``ConnectionError`` if the peer closes first)."""
    data = bytearray()
    while len(data) < nbytes:
        part = conn.recv(nbytes - len(data))
        if not part:
            raise ConnectionError(f"peer closed after {len(data)} of {nbytes} bytes")
        data += part
    return bytes(data)


def _echo(conn: socket.socket) -> None:
    """Echo :data:`PING_BYTES`-byte messages until the peer closes."""
    while True:
        try:
            conn.sendall(_exact(conn, PING_BYTES))
        except ConnectionError:
            return


def _sink(conn: socket.socket) -> None:
    """Read until the peer shuts its side, then answer the byte count (8 bytes, big-endian)."""
    total = 0
    buf = bytearray(CHUNK)
    while n := conn.recv_into(buf):
        total += n
    conn.sendall(total.to_bytes(8, "big"))


def serve(port: int, count: int) -> None:
    """Answer ``count`` connections on ``port`` (0: forever)."""
    with socket.create_server(("0.0.0.0", port), reuse_port=True) as server:
        print(f"listening on {port}", flush=True)
        answered = 0
        while count == 0 or answered < count:
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                kind = _exact(conn, 1)
                _echo(conn) if kind == b"p" else _sink(conn)
            answered += 1


def connect(host: str, port: int, kind: bytes, timeout: float = 10.0) -> socket.socket:
    """A connection to ``serve`` on ``host:port`` that announced ``kind``; retried while the server starts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=timeout)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.sendall(kind)
    return conn


def rtt(host: str, port: int, count: int = 20) -> dict:
    """Round trips of :data:`PING_BYTES`-byte messages (the first, which may meet a cold path, not counted):
    median, minimum and maximum in milliseconds."""
    with connect(host, port, b"p") as conn:
        message = b"x" * PING_BYTES
        times = []
        for _ in range(count + 1):
            start = time.perf_counter()
            conn.sendall(message)
            _exact(conn, PING_BYTES)
            times.append((time.perf_counter() - start) * 1e3)
    times = times[1:]
    return {"rtt_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "count": count}


def bulk(host: str, port: int, seconds: float) -> dict:
    """Send for ``seconds``; the rate the receiver counted, in Mbit/s, over the time until it answered."""
    with connect(host, port, b"b") as conn:
        data = bytes(CHUNK)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        received = int.from_bytes(_exact(conn, 8), "big")
        elapsed = time.perf_counter() - start
    return {"mbit": received * 8 / elapsed / 1e6, "bytes": received, "seconds": elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sockets.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    server = sub.add_parser("serve", help="answer ping-pong and bulk clients")
    server.add_argument("--count", type=int, default=0, help="connections to answer (0: until killed)")
    for name in ("rtt", "bulk"):
        client = sub.add_parser(name, help=f"measure {name} to a server")
        client.add_argument("host")
        client.add_argument("--count" if name == "rtt" else "--seconds", type=float, default=20 if name == "rtt"
                            else 3.0, help="round trips" if name == "rtt" else "seconds of sending")
    for p in sub.choices.values():
        p.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    if args.action == "serve":
        serve(args.port, args.count)
        return 0
    found = rtt(args.host, args.port, int(args.count)) if args.action == "rtt" else bulk(args.host, args.port,
                                                                                         args.seconds)
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
