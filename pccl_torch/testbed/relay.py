"""The testbed's delay relay: latency without netem, the way Mahimahi's ``mm-delay`` adds it.

Where the kernel has no ``netem``, each node's link is a pair of persistent TAP devices instead of a veth pair:
``pccl0`` in the node's namespace and ``n<k>`` in the hub's (on its bridge). This process holds the file
descriptors of every pair and copies each frame from one end to the other once it is due: ``delay`` seconds
after it was read (``delay`` = a quarter of the testbed's round-trip time, since a packet between two nodes
crosses two links and the answer crosses them back), plus, with jitter, a uniform draw in ``[-jitter, +jitter]``.
A frame never leaves before the one read before it on the same link end (jitter varies the delay but does not
reorder, which TCP would take for loss), so each direction is a FIFO of ``(due time, frame)``: no heap needed.
The ``tbf`` qdiscs on the TAP devices shape the rate before the relay sees a frame, in series with the delay.

It is stdlib-only and started as a script (``python .../relay.py --prefix P ...``, which ``down`` finds by its
command line), so that it does not import torch. ``--detach`` forks it into its own session; it writes its PID to
``<state>/relay.pid`` at once and ``<state>/relay.ready`` once every TAP device is attached.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import math
import os
import random
import re
import select
import signal
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
NETNS_RUN = Path("/run/netns")
NODE_IFACE = "pccl0"
PID_FILE = "relay.pid"
READY_FILE = "relay.ready"
LOG_FILE = "relay.log"
READ_SIZE = 65536 + 64
"""Larger than any frame a TAP device hands out (MTU at most 65521, plus the 14-byte Ethernet header)."""
READS_PER_ROUND = 64
"""Frames read from one device before the relay looks at the clock again (bounds the lateness of due frames)."""
DEFAULT_LIMIT_BYTES = 64 << 20
"""Bytes one direction may hold; frames beyond are dropped, as a full netem queue drops them."""
RT_PRIORITY = 10
"""The relay runs in the real-time class (``SCHED_FIFO`` at this priority): it sleeps in epoll between frames, and
ranks that spin on the same cores must not make frames late. At nice -10, 8 nodes x 1 rank of MPI polling on 2 cores
(RTT 20 ms, 1 Gbit/s) held each link to 77-95 Mbit/s with all of them busy, 330-435 Mbit/s alone, and stretched the
round trip to 22-23 ms; in the real-time class 591, 764 Mbit/s and 20.3 ms (``pccl-testbed probe``, 2026-12-07), and
MPICH's 16 MiB all-reduce went from 2.7 s to 0.50 s. The kernel keeps 5% of each second for other processes
(``sched_rt_runtime_us``)."""
NICE = -10
"""The relay's priority where the real-time class is refused: ahead of busy ranks still (measured on 2 shared cores
with 4 MPI ranks polling: a 5 ms round trip took 6.4 ms at nice 0, 5.2 ms at -10)."""
SPIN_S = 0.001
"""epoll waits whole milliseconds; the last millisecond before a frame is due is slept with nanosleep."""

_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*$")
_TIME_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_time(text: str) -> float:
    """``"500us"`` -> 0.0005, ``"2ms"`` -> 0.002, ``"1s"`` -> 1.0 (tc's time units); ``ValueError`` otherwise."""
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"cannot read time {text!r}: expected a number and a unit, e.g. 500us, 2ms, 0.1s")
    return float(match.group(1)) * _TIME_SCALE[match.group(2)]


def leg_delay(rtt_s: float) -> float:
    """Delay added on each link end in each direction for a round-trip time of ``rtt_s`` between two nodes:
    a quarter (node A -> hub, hub -> node B, and back)."""
    return rtt_s / 4


def due_time(now: float, delay: float, jitter: float, last_due: float, draw: float) -> float:
    """When a frame read at ``now`` leaves: ``now + delay`` moved by ``jitter * (2 * draw - 1)`` (``draw`` in
    [0, 1)), never earlier than ``now`` nor than ``last_due``, the previous frame's due time (no reordering)."""
    return max(now + max(0.0, delay + jitter * (2 * draw - 1)), last_due)


@dataclass(slots=True)
class DelayLine:
    """One direction of one link end: frames in the order read, each with its due time."""

    delay: float
    """Seconds each frame is held (before jitter)."""
    jitter: float = 0.0
    """Largest change of a frame's delay either way, in seconds."""
    limit_bytes: int = DEFAULT_LIMIT_BYTES
    """Bytes held at most; a frame that would exceed it is dropped."""
    frames: deque[tuple[float, bytes]] = field(default_factory=deque)
    held_bytes: int = 0
    last_due: float = -math.inf
    dropped: int = 0
    """Frames dropped because the line was full."""

    def push(self, now: float, frame: bytes, draw: float = 0.5) -> bool:
        """Hold ``frame``, read at ``now``; False (and counted) when the line is full."""
        if self.held_bytes + len(frame) > self.limit_bytes:
            self.dropped += 1
            return False
        self.last_due = due_time(now, self.delay, self.jitter, self.last_due, draw)
        self.frames.append((self.last_due, frame))
        self.held_bytes += len(frame)
        return True

    def next_due(self) -> float | None:
        """Due time of the oldest frame held (None: empty)."""
        return self.frames[0][0] if self.frames else None

    def pop_due(self, now: float) -> Iterator[bytes]:
        """The frames due at ``now``, oldest first, each removed as it is taken."""
        while self.frames and self.frames[0][0] <= now:
            _, frame = self.frames.popleft()
            self.held_bytes -= len(frame)
            yield frame


def next_wait(lines: list[DelayLine], now: float) -> float | None:
    """Seconds until the first frame held by any of ``lines`` is due (0 when one is late; None: all empty)."""
    dues = [due for due in (line.next_due() for line in lines) if due is not None]
    return max(0.0, min(dues) - now) if dues else None


def poll_timeout(wait: float | None) -> float:
    """epoll's timeout for ``wait`` seconds (None or -1: block): a millisecond short of it, since epoll rounds up
    to whole milliseconds; 0 when less than that is left (the rest is slept, see :data:`SPIN_S`)."""
    if wait is None or wait < 0:
        return -1
    return max(0.0, wait - SPIN_S)


def link_ends(prefix: str, nodes: int) -> list[tuple[str, str, str, str]]:
    """(node namespace, node device, hub namespace, hub device) of every link of testbed ``prefix``."""
    return [(f"{prefix}-n{k}", NODE_IFACE, f"{prefix}-hub", f"n{k}") for k in range(nodes)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def enter_netns(name: str) -> None:
    """Move this process into network namespace ``name`` (``/run/netns/<name>``, as ``ip netns`` made it)."""
    with open(NETNS_RUN / name) as handle:
        if _libc().setns(handle.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")


def open_tap(namespace: str, device: str) -> int:
    """A non-blocking file descriptor attached to persistent TAP device ``device`` of ``namespace`` (a TUN file
    belongs to the namespace it was opened in, so the process enters it first)."""
    enter_netns(namespace)
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", device.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as exc:
        os.close(fd)
        raise OSError(exc.errno, f"cannot attach to TAP device {device} in {namespace}: {exc.strerror}") from None
    return fd


def _read_into(fd: int, line: DelayLine, now: float, draw: Callable[[], float]) -> None:
    """Read up to :data:`READS_PER_ROUND` frames from ``fd`` into ``line``."""
    for _ in range(READS_PER_ROUND):
        try:
            frame = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        line.push(now, frame, draw())


def _write(fd: int, frame: bytes) -> None:
    """Hand ``frame`` to the kernel at the far end; a frame the device refuses (down, full) is lost, as on a wire."""
    try:
        os.write(fd, frame)
    except OSError:
        pass


def serve(pairs: list[tuple[int, int]], delay: float, jitter: float = 0.0, limit_bytes: int = DEFAULT_LIMIT_BYTES,
          until: float | None = None) -> None:
    """Relay frames both ways between the two file descriptors of each of ``pairs`` (TAP devices, or any
    message-preserving descriptors), each held ``delay`` (+- ``jitter``) seconds; forever, or until
    ``time.monotonic()`` reaches ``until`` (tests)."""
    routes: dict[int, tuple[int, DelayLine]] = {}
    for a, b in pairs:
        routes[a] = (b, DelayLine(delay, jitter, limit_bytes))
        routes[b] = (a, DelayLine(delay, jitter, limit_bytes))
    lines = [line for _, line in routes.values()]
    draw = random.random if jitter > 0 else (lambda: 0.5)
    with select.epoll() as poller:
        for fd in routes:
            poller.register(fd, select.EPOLLIN)
        while until is None or time.monotonic() < until:
            _relay_once(poller, routes, _bounded(next_wait(lines, time.monotonic()), until), draw)


def _bounded(wait: float | None, until: float | None) -> float | None:
    """``wait``, no later than ``until`` (a monotonic time; None: no bound)."""
    if until is None:
        return wait
    return max(0.0, min(until - time.monotonic(), math.inf if wait is None else wait))


def _relay_once(poller: select.epoll, routes: dict[int, tuple[int, DelayLine]], wait: float | None,
                draw: Callable[[], float]) -> None:
    """Wait up to ``wait`` seconds (None: until a frame comes), hold every frame read, send every frame due."""
    timeout = poll_timeout(wait)
    if timeout == 0 and wait:
        time.sleep(wait)
    events = poller.poll(timeout)
    now = time.monotonic()
    for fd, _ in events:
        _read_into(fd, routes[fd][1], now, draw)
    now = time.monotonic()
    for out, line in routes.values():
        for frame in line.pop_due(now):
            _write(out, frame)


def _keep_time() -> None:
    """Sleep to the microsecond (a process's default timer slack is 50 us) and run ahead of busy ranks
    (:data:`RT_PRIORITY`, else :data:`NICE`; left as it is where neither is allowed)."""
    _libc().prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return
    except PermissionError:
        pass
    try:
        os.nice(NICE - os.nice(0))
    except PermissionError:
        print(f"relay: cannot raise its priority to nice {NICE}; frames may be late on busy cores", flush=True)


def _detach(state: Path) -> None:
    """Fork into a new session with output to ``<state>/relay.log``; the parent exits at once."""
    if os.fork():
        os._exit(0)
    os.setsid()
    log = os.open(state / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", required=True, help="testbed prefix (namespaces <prefix>-hub, <prefix>-n<k>)")
    parser.add_argument("--nodes", type=int, required=True, help="node namespaces")
    parser.add_argument("--delay", required=True, help="round-trip time between two nodes (500us, 5ms)")
    parser.add_argument("--jitter", default="0ms", help="largest change of the round-trip time either way")
    parser.add_argument("--state", type=Path, required=True, help="testbed state folder (PID, ready and log files)")
    parser.add_argument("--limit-bytes", type=int, default=DEFAULT_LIMIT_BYTES, help="bytes held per direction")
    parser.add_argument("--detach", action="store_true", help="fork into a session of its own")
    args = parser.parse_args(argv)
    if args.detach:
        _detach(args.state)
    (args.state / PID_FILE).write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _keep_time()
    ends = link_ends(args.prefix, args.nodes)
    pairs = [(open_tap(node_ns, node_dev), open_tap(hub_ns, hub_dev)) for node_ns, node_dev, hub_ns, hub_dev in ends]
    # Stay in the hub's namespace: `ip netns pids <prefix>-hub` lists the relay too.
    (args.state / READY_FILE).write_text(f"{os.getpid()}\n")
    print(f"relay {args.prefix}: {args.nodes} links, round trip {args.delay} (+- {args.jitter})", flush=True)
    serve(pairs, leg_delay(parse_time(args.delay)), leg_delay(parse_time(args.jitter)), args.limit_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
