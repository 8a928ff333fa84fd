"""Emulated nodes as Linux network namespaces joined by shaped links (glue around ``ip`` and ``tc``).

Layout of testbed ``pccl`` with N nodes (every name carries the prefix, so ``down`` finds them all)::

    pccl-n0 [pccl0 10.77.0.1/24] ==veth== [n0] \\
    pccl-n1 [pccl0 10.77.0.2/24] ==veth== [n1]  br0 in namespace pccl-hub (no address)
    ...                                         /

Each link is shaped in both directions: a ``tbf`` qdisc (rate, burst, queue latency) on the node's end
(node -> hub) and on the hub's end (hub -> node). With ``delay`` (the round-trip time between two nodes), each
link end adds a quarter of it: a ``netem`` qdisc (delay and rate) where the kernel has netem; elsewhere the link
is a pair of TAP devices instead of a veth pair, and a relay process (:mod:`pccl_torch.testbed.relay`, started
by ``up``, its PID in the state folder, ended by ``down``) copies every frame between them once it is due, after
the ``tbf`` on the TAP device has shaped it. Links with delay use a 65000-byte MTU (fewer frames for the relay)
and the nodes' TCP buffers (``net.ipv4.tcp_rmem``/``tcp_wmem``) hold four bandwidth-delay products.

Every node runs TCP with one named congestion control (``cubic``, Linux's default, unless configured otherwise), not
whatever the host's default happens to be: on this machine the host runs BBR, which slowed schedules that change
peer at every step (pairwise, recursive halving, MPICH's) by up to 16% at 4 nodes, where a ring that keeps its peers
lost 2-7%. A namespace may set only what the host's ``net.ipv4.tcp_allowed_congestion_control`` lists; where cubic
is missing there, ``up`` (root) adds it while it sets the nodes and then restores the list (a namespace keeps the
control it was set to), or, where the list cannot be changed, leaves the nodes on the host's control and logs one
line saying so. Nothing is created in the caller's namespace: removing the namespaces removes every link, so
``down`` also cleans up after a crash (the relay, which lives in the hub's namespace, it ends first).
Ranks of one namespace talk through loopback and shared memory (fast, like the inside of a node); ranks of
different namespaces cross two shaped links.

The state of testbed ``P`` (its configuration, the TCP congestion control its nodes run, and the launcher
script that :mod:`pccl_torch.testbed.launch` writes there when it launches) lives in ``/run/pccl-testbed/P``;
``/etc/netns/P-nK/hosts`` maps the machine's hostname to the node's address inside namespace ``P-nK`` (``ip
netns exec`` mounts it over ``/etc/hosts``), so programs that resolve their own hostname (gloo, c10d) find the
node's address rather than loopback.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from pccl_torch.testbed import relay

log = logging.getLogger(__name__)

NODE_IFACE = "pccl0"
"""Name of the link inside every node namespace (``GLOO_SOCKET_IFNAME``, ``UCX_NET_DEVICES``)."""
BRIDGE = "br0"
STATE_ROOT = Path("/run/pccl-testbed")
NETNS_ETC = Path("/etc/netns")
DEFAULT_PREFIX = "pccl"
DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_CONGESTION_CONTROL = "cubic"
CONGESTION_SYSCTL = Path("/proc/sys/net/ipv4/tcp_congestion_control")
AVAILABLE_CONGESTION = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
ALLOWED_CONGESTION = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
"""What a namespace other than the host's may set (a host-wide list; root changes it in the host's namespace)."""
RUNNING_CONGESTION_FILE = "congestion_control"
"""In the state folder: the TCP congestion control the nodes were set to run (the host's where ``up`` could
not set the configured one)."""

_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_MIN_BURST = 32 << 10
DELAY_METHODS = ("auto", "netem", "relay")
"""How ``--delay`` is made: ``auto`` (netem where the kernel has it, else the relay), or one of them by name."""
RELAY_IMPLS = ("auto", "c", "python")
"""Which relay: ``auto`` (the C one where a C compiler is found, else Python's), or one of them by name."""
RELAY_SOURCE = Path(relay.__file__).with_name("relay.c")
RELAY_BINARY = "pccl-relay"
DELAY_METHOD_FILE = "delay_method"
"""In the state folder: how the delay was made (``netem`` or ``relay``; empty without delay)."""
PLAIN_MTU = 1500
DELAY_MTU = 65000
"""MTU of links with delay: a 64 KB frame costs the relay what a 1500-byte one does (TAP devices allow 65521)."""
MAX_TAP_MTU = 65521
UNSHAPED_BITS = 10**10
"""The rate TCP buffers are sized for on unshaped links with delay."""
TCP_RMEM = Path("/proc/sys/net/ipv4/tcp_rmem")
TCP_WMEM = Path("/proc/sys/net/ipv4/tcp_wmem")
KERNEL_TCP_MAX = {TCP_RMEM: 6 << 20, TCP_WMEM: 4 << 20}
"""Linux's default largest TCP receive / send buffers (the third numbers): never lowered."""


class TestbedError(RuntimeError):
    """The testbed cannot be built, found or removed; the message says why and what to do."""

    __test__ = False  # not a pytest test class


def parse_rate(text: str) -> int:
    """``"1gbit"`` -> 10**9 bits/s, ``"200mbit"``, ``"100mbps"`` (bytes) -> 8 * 10**8 (tc's SI units)."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"cannot read rate {text!r}: expected a number and a tc unit, e.g. 1gbit, 200mbit, 100mbps")
    value = float(match.group(1)) * _SCALE[match.group(2).lower()] * (8 if match.group(3).lower() == "bps" else 1)
    if value < 8000:
        raise ValueError(f"rate {text!r} is below 8 kbit/s")
    return int(value)


def format_rate(bits_per_s: int) -> str:
    """10**9 -> ``"1gbit"``; 2 * 10**8 -> ``"200mbit"``."""
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits_per_s % scale == 0:
            return f"{bits_per_s // scale}{unit}"
    return f"{bits_per_s}bit"


@dataclass(frozen=True, kw_only=True, slots=True)
class TestbedConfig:
    """What ``up`` builds."""

    __test__ = False

    nodes: int = 2
    """Number of node namespaces."""
    rate: str | None = None
    """Link rate in each direction (tc units: ``1gbit``, ``200mbit``); None leaves links unshaped."""
    burst: int | None = None
    """tbf bucket in bytes; None: one millisecond at the rate, at least 32 KiB."""
    latency: str = "50ms"
    """tbf queue limit, as time spent waiting (packets beyond it are dropped)."""
    delay: str | None = None
    """Round-trip time added between two nodes (``500us``, ``5ms``): a quarter on each link end in each direction
    (a packet crosses its sender's link and its receiver's, and the answer crosses them back)."""
    jitter: str | None = None
    """Largest change of the round-trip time either way (a quarter on each link end); never reorders packets."""
    delay_method: str = "auto"
    """How the delay is made: ``auto`` (netem where the kernel has it, else the relay), ``netem``, ``relay``."""
    relay_impl: str = "auto"
    """Which relay adds the delay where netem does not: ``auto`` (C, compiled by ``up``, where a C compiler is
    found; else Python), ``c``, ``python``."""
    mtu: int | None = None
    """MTU of the links; None: 1500, or 65000 on links with delay."""
    prefix: str = DEFAULT_PREFIX
    """Names: namespaces ``<prefix>-hub`` and ``<prefix>-n<k>``, state in ``/run/pccl-testbed/<prefix>``."""
    subnet: str = DEFAULT_SUBNET
    """Node ``k`` gets the subnet's host address ``k + 1``."""
    congestion_control: str | None = DEFAULT_CONGESTION_CONTROL
    """TCP congestion control of every node namespace (``net.ipv4.tcp_congestion_control``); None: the host's."""

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"prefix {self.prefix!r} must be 1-12 lower-case letters and digits, starting "
                             "with a letter")
        network = ipaddress.ip_network(self.subnet, strict=False)
        if not isinstance(network, ipaddress.IPv4Network):
            raise ValueError(f"subnet {self.subnet!r} must be IPv4")
        if not 1 <= self.nodes <= min(network.num_addresses - 2, 250):
            raise ValueError(f"nodes must be between 1 and {min(network.num_addresses - 2, 250)} for subnet "
                             f"{self.subnet}, got {self.nodes}")
        if self.rate is not None:
            parse_rate(self.rate)
        if self.mtu is not None and not 576 <= self.mtu <= MAX_TAP_MTU:
            raise ValueError(f"mtu must be between 576 and {MAX_TAP_MTU} (a TAP device's largest), got {self.mtu}")
        if self.burst is not None and self.burst < self.frame_bytes:
            raise ValueError(f"burst must hold one frame ({self.frame_bytes} bytes at MTU {self.link_mtu}), "
                             f"got {self.burst}")
        self._check_delay()
        if self.congestion_control is not None and not re.match(r"^[a-z][a-z0-9_]{0,15}$", self.congestion_control):
            raise ValueError(f"congestion control {self.congestion_control!r} must be the name of a TCP congestion "
                             "control such as cubic, reno or bbr")

    def _check_delay(self) -> None:
        """``ValueError`` for a delay, jitter or method that cannot be built."""
        for name, value in (("delay", self.delay), ("jitter", self.jitter)):
            if value is not None and _time_or_none(value) is None:
                raise ValueError(f"{name} {value!r} must be a time such as 500us or 2ms")
        if self.jitter is not None and self.delay is None:
            raise ValueError(f"jitter {self.jitter!r} needs a delay (--delay RTT)")
        if self.jitter is not None and relay.parse_time(self.jitter) > relay.parse_time(self.delay):
            raise ValueError(f"jitter {self.jitter} must not exceed the delay {self.delay} (a round trip is never "
                             "shorter than zero)")
        if self.delay_method not in DELAY_METHODS:
            raise ValueError(f"delay method {self.delay_method!r} must be one of {', '.join(DELAY_METHODS)}")
        if self.relay_impl not in RELAY_IMPLS:
            raise ValueError(f"relay {self.relay_impl!r} must be one of {', '.join(RELAY_IMPLS)}")

    @property
    def rtt_s(self) -> float | None:
        """The added round-trip time in seconds (None: no delay)."""
        return None if self.delay is None else relay.parse_time(self.delay)

    @property
    def link_mtu(self) -> int:
        """MTU of every link (node and hub ends)."""
        return self.mtu or (DELAY_MTU if self.delay is not None else PLAIN_MTU)

    @property
    def frame_bytes(self) -> int:
        """The largest frame on a link (MTU plus the 14-byte Ethernet header): the least a tbf bucket holds."""
        return self.link_mtu + 14

    def tcp_buffer_max(self) -> int | None:
        """Largest TCP buffer (bytes) the nodes need: four bandwidth-delay products at the link rate (10 Gbit/s
        unshaped) and the round-trip time; None without delay (the kernel's own)."""
        if self.rtt_s is None:
            return None
        return int(4 * (self.rate_bits or UNSHAPED_BITS) / 8 * self.rtt_s)

    @property
    def rate_bits(self) -> int | None:
        """Link rate in bits per second (None: unshaped)."""
        return None if self.rate is None else parse_rate(self.rate)

    @property
    def burst_bytes(self) -> int | None:
        """The tbf bucket actually used."""
        if self.rate is None:
            return None
        return self.burst or max(_MIN_BURST, self.rate_bits // 8 // 1000, 2 * self.frame_bytes)

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def namespace(self, node: int) -> str:
        """Namespace of ``node``."""
        return f"{self.prefix}-n{node}"

    def address(self, node: int) -> str:
        """Address of ``node`` (without the prefix length)."""
        return str(ipaddress.ip_network(self.subnet, strict=False)[node + 1])

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_network(self.subnet, strict=False).prefixlen

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.prefix

    def describe(self, delay_method: str | None = None) -> str:
        """``2 nodes, 1gbit links (tbf burst 125000 B, latency 50ms), round trip 5ms (relay, MTU 65000), ...``;
        ``delay_method``: how ``up`` made the delay (default: as configured)."""
        if self.rate is None:
            link = "unshaped links"
        else:
            link = f"{format_rate(self.rate_bits)} links (tbf burst {self.burst_bytes} B, latency {self.latency})"
        if self.delay is not None:
            jitter = f" +- {self.jitter}" if self.jitter else ""
            link += (f", round trip {self.delay}{jitter} ({delay_method or self.delay_method}, "
                     f"MTU {self.link_mtu})")
        tcp = f"TCP {self.congestion_control}" if self.congestion_control else "the host's TCP congestion control"
        return f"{self.nodes} nodes, {link}, {tcp}, subnet {self.subnet}"


def _time_or_none(text: str) -> float | None:
    """``relay.parse_time(text)``, None where it is not a time."""
    try:
        return relay.parse_time(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One node namespace as found."""

    namespace: str
    address: str | None
    """Address on the node's link (None: missing)."""
    qdisc_out: str | None
    """Shaping of node -> hub (tc's line for the node's end)."""
    qdisc_in: str | None
    """Shaping of hub -> node (tc's line for the hub's end)."""
    pids: list[int] = field(default_factory=list)
    """Processes running in the namespace."""
    congestion_control: str | None = None
    """The namespace's TCP congestion control (None: unreadable)."""


@dataclass(frozen=True, slots=True)
class RelayStatus:
    """The delay relay of a testbed, as found."""

    pid: int | None
    """As recorded by the relay (None: no PID file)."""
    alive: bool
    """Whether that process runs and is the relay (not a later process that reuses the PID)."""
    cpu_s: float | None = None
    """CPU time it has used (user + system), from ``/proc/<pid>/stat``."""
    cpu_percent: float | None = None
    """``cpu_s`` over its lifetime, in percent of one core."""
    impl: str | None = None
    """``c`` or ``python`` (None: not running)."""
    scheduling: str | None = None
    """``real time`` (``SCHED_FIFO``) or ``nice N`` (None: not running)."""


@dataclass(frozen=True, slots=True)
class Status:
    """What exists of testbed ``prefix``."""

    prefix: str
    config: TestbedConfig | None
    """As written by ``up`` (None: no state file, e.g. a crashed ``up``)."""
    namespaces: list[str]
    """Every namespace with the prefix."""
    nodes: list[NodeStatus]
    problems: list[str]
    """Empty when the testbed is complete and matches its configuration."""
    congestion_control: str | None = None
    """The TCP congestion control ``up`` set the nodes to run: the configured one, or the host's where the
    configured one is not allowed in namespaces and the host's list cannot be changed (None: not recorded)."""
    delay_method: str | None = None
    """How ``up`` made the delay (``netem``, ``relay``; None: no delay, or not recorded)."""
    relay: RelayStatus | None = None
    """The delay relay (None: the testbed has none)."""

    @property
    def up(self) -> bool:
        return self.config is not None and not self.problems


def check_tools() -> None:
    """Raise ``TestbedError`` saying what is missing when namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces and tc); run it as root, e.g. with sudo")
    missing = [tool for tool in ("ip", "tc") if not _which(tool)]
    if missing:
        raise TestbedError(f"{' and '.join(missing)} not found: install iproute2 "
                           "(Debian/Ubuntu: apt-get install -y iproute2)")


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next((f"{d}/{tool}" for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
                                       if os.access(f"{d}/{tool}", os.X_OK)), None)


def ip_path() -> str:
    """Absolute path of ``ip`` (the launcher script calls it with no PATH lookup)."""
    found = _which("ip")
    if not found:
        raise TestbedError("ip not found: install iproute2 (Debian/Ubuntu: apt-get install -y iproute2)")
    return found


def _run(*args: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip``/``tc`` (inside ``namespace`` if given); ``TestbedError`` with the command and its stderr."""
    tool = _which(args[0]) or args[0]
    command = [tool, *args[1:]] if namespace is None else [ip_path(), "netns", "exec", namespace, tool, *args[1:]]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise TestbedError(f"{args[0]} not found: install iproute2 (apt-get install -y iproute2)") from None
    if check and result.returncode != 0:
        raise TestbedError(f"`{' '.join(command)}` failed (exit {result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()}")
    return result


def namespaces(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Every namespace of testbed ``prefix`` (``<prefix>-hub``, ``<prefix>-n<k>``), nodes in order."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(hub|n(\d+))$")
    found = []
    for line in _run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        match = pattern.match(name)
        if match:
            found.append((-1 if match.group(2) is None else int(match.group(2)), name))
    return [name for _, name in sorted(found)]


def netem_available(namespace: str) -> bool:
    """Whether this kernel has netem (tried on ``namespace``'s loopback, then removed)."""
    probe = _run("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms", namespace=namespace,
                 check=False)
    if probe.returncode == 0:
        _run("tc", "qdisc", "del", "dev", "lo", "root", namespace=namespace, check=False)
    return probe.returncode == 0


def _shape(config: TestbedConfig, namespace: str, device: str, delay_method: str | None) -> None:
    """Shape egress of ``device`` in ``namespace``: tbf at the rate, or, with ``delay_method`` netem, netem with a
    quarter of the round-trip time (and of the jitter) and the rate."""
    if delay_method == "netem":
        rate = [] if config.rate is None else ["rate", f"{config.rate_bits}bit"]
        jitter = [] if config.jitter is None else [f"{relay.leg_delay(relay.parse_time(config.jitter)) * 1e6:.0f}us"]
        _run("tc", "qdisc", "replace", "dev", device, "root", "netem", "delay",
             f"{relay.leg_delay(config.rtt_s) * 1e6:.0f}us", *jitter, *rate, "limit", "10000", namespace=namespace)
        return
    if config.rate is None:
        return
    _run("tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{config.rate_bits}bit", "burst",
         str(config.burst_bytes), "latency", config.latency, namespace=namespace)


def available_congestion_controls() -> list[str]:
    """The TCP congestion controls this kernel has loaded (empty when it does not say)."""
    try:
        return AVAILABLE_CONGESTION.read_text().split()
    except OSError:
        return []


def _check_congestion_control(name: str | None) -> None:
    """``TestbedError`` when the kernel cannot run congestion control ``name`` (None: nothing to check)."""
    known = available_congestion_controls()
    if name is not None and known and name not in known:
        raise TestbedError(f"TCP congestion control {name!r} is not available in this kernel (available: "
                           f"{', '.join(known)}); load its module (modprobe tcp_{name}) or pick one of those")


def _write_sysctl(namespace: str, path: Path, value: str) -> None:
    """Write ``value`` to sysctl ``path`` inside ``namespace`` (``TestbedError`` when refused)."""
    _run("sh", "-c", f"echo '{value}' > {path}", namespace=namespace)


def _set_congestion_control(namespace: str, name: str | None) -> None:
    """Set ``namespace``'s TCP congestion control (a per-namespace sysctl); None leaves the host's."""
    if name is not None:
        _write_sysctl(namespace, CONGESTION_SYSCTL, name)


def tcp_buffer_setting(path: Path, largest: int) -> str:
    """The value of ``net.ipv4.tcp_rmem``/``tcp_wmem`` (min, default, max) whose max is ``largest``, never below
    Linux's default max: TCP's autotuning grows a connection's buffer up to it."""
    default = 131072 if path == TCP_RMEM else 16384
    return f"4096 {default} {max(largest, KERNEL_TCP_MAX[path])}"


def _size_tcp_buffers(config: TestbedConfig, namespace: str) -> None:
    """Let TCP in ``namespace`` hold the links' bandwidth-delay product (per-namespace sysctls; the host-wide
    ``net.core.rmem_max``/``wmem_max`` bound only buffers a program sets itself and are left alone)."""
    largest = config.tcp_buffer_max()
    if largest is not None:
        for path in (TCP_RMEM, TCP_WMEM):
            _write_sysctl(namespace, path, tcp_buffer_setting(path, largest))


def allowed_congestion_controls() -> list[str] | None:
    """What namespaces other than the host's may set (None when the kernel does not say)."""
    try:
        return ALLOWED_CONGESTION.read_text().split()
    except OSError:
        return None


def _write_allowed(names: list[str]) -> None:
    ALLOWED_CONGESTION.write_text(" ".join(names) + "\n")


@contextlib.contextmanager
def _allowed_in_namespaces(name: str) -> Iterator[str | None]:
    """While open, namespaces may set TCP congestion control ``name``: yields None when they may (it was
    allowed, the kernel does not say, or this added it to the host's ``net.ipv4.tcp_allowed_congestion_control``,
    restored on exit), else why they may not. A namespace keeps the control it was set to after the list is
    restored. Concurrent ``up`` calls take turns (a lock on the list), so none restores a list another relies on."""
    try:
        lock = ALLOWED_CONGESTION.open()
    except OSError:
        yield None  # the kernel does not say: try
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        allowed = allowed_congestion_controls()
        if allowed is None or name in allowed:
            yield None
            return
        try:
            _write_allowed([*allowed, name])
        except OSError as exc:
            yield (f"net.ipv4.tcp_allowed_congestion_control is {' '.join(allowed)!r} and cannot be changed here: "
                   f"{exc.strerror or exc}")
            return
        log.info("added %s to net.ipv4.tcp_allowed_congestion_control while the nodes are set", name)
        try:
            yield None
        finally:
            try:
                _write_allowed(allowed)
            except OSError as exc:  # the nodes are set; the host keeps the longer list
                log.warning("pccl-testbed: could not restore net.ipv4.tcp_allowed_congestion_control to %r (%s)",
                            " ".join(allowed), exc.strerror or exc)


def _apply_congestion_control(config: TestbedConfig) -> str | None:
    """Set ``config.congestion_control`` in every node namespace; the name the nodes run. Where namespaces may
    not set it and the host's list cannot be changed, the nodes keep the host's, and one log line says so."""
    nodes = [config.namespace(k) for k in range(config.nodes)]
    name = config.congestion_control
    if name is None:
        return _congestion_control(nodes[0])
    with _allowed_in_namespaces(name) as refused:
        if refused is None:
            for ns in nodes:
                _set_congestion_control(ns, name)
            return name
    host = _congestion_control(nodes[0])
    log.warning("pccl-testbed: the nodes run the host's TCP %s, not %s (%s)", host or "congestion control", name,
                refused)
    return host


def running_congestion_control(prefix: str = DEFAULT_PREFIX) -> str | None:
    """The TCP congestion control ``up`` set testbed ``prefix``'s nodes to run (None: not recorded)."""
    return _state_line(prefix, RUNNING_CONGESTION_FILE)


def _state_line(prefix: str, name: str) -> str | None:
    """The one-line state file ``name`` of testbed ``prefix`` (None: missing or empty)."""
    try:
        return (STATE_ROOT / prefix / name).read_text().strip() or None
    except OSError:
        return None


def recorded_delay_method(prefix: str = DEFAULT_PREFIX) -> str | None:
    """How ``up`` made testbed ``prefix``'s delay (``netem``, ``relay``; None: no delay or not recorded)."""
    return _state_line(prefix, DELAY_METHOD_FILE)


def _congestion_control(namespace: str) -> str | None:
    """``namespace``'s TCP congestion control (None: unreadable)."""
    result = _run("cat", str(CONGESTION_SYSCTL), namespace=namespace, check=False)
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def _hosts_text(config: TestbedConfig, node: int) -> str:
    lines = ["127.0.0.1 localhost", f"{config.address(node)} {socket.gethostname()}"]
    lines += [f"{config.address(k)} {config.namespace(k)}" for k in range(config.nodes)]
    # torch's TCPStore sees IPv4 peers as IPv6-mapped addresses and warns when it cannot name them.
    lines += [f"::ffff:{config.address(k)} {config.namespace(k)}" for k in range(config.nodes)]
    return "\n".join(lines) + "\n"


def _delay_method(config: TestbedConfig, namespace: str) -> str | None:
    """How ``config``'s delay is made here (None: no delay): netem where asked for or where ``auto`` finds it
    in the kernel (tried in ``namespace``), else the relay. ``TestbedError`` when netem is asked for and absent."""
    if config.delay is None or config.delay_method == "relay":
        return None if config.delay is None else "relay"
    if netem_available(namespace):
        return "netem"
    if config.delay_method == "netem":
        raise TestbedError(f"--delay-method netem: this kernel has no netem qdisc (tc: 'Specified qdisc kind is "
                           "unknown'); use --delay-method relay or auto (a userspace relay adds the delay)")
    return "relay"


def _add_node(config: TestbedConfig, node: int, delay_method: str | None) -> None:
    """Make node ``node``'s namespace and its link to the hub's bridge (a veth pair, or with the relay a pair of
    TAP devices the relay joins), shaped at both ends; its TCP buffers and ``/etc/netns`` hosts file."""
    ns, hub, hub_end = config.namespace(node), config.hub, f"n{node}"
    _run("ip", "netns", "add", ns)
    _run("ip", "link", "set", "lo", "up", namespace=ns)
    if delay_method == "relay":
        _run("ip", "tuntap", "add", "dev", NODE_IFACE, "mode", "tap", namespace=ns)
        _run("ip", "tuntap", "add", "dev", hub_end, "mode", "tap", namespace=hub)
    else:
        _run("ip", "link", "add", hub_end, "netns", hub, "type", "veth", "peer", "name", NODE_IFACE, "netns", ns)
    _run("ip", "link", "set", hub_end, "mtu", str(config.link_mtu), namespace=hub)
    _run("ip", "link", "set", NODE_IFACE, "mtu", str(config.link_mtu), namespace=ns)
    _run("ip", "link", "set", hub_end, "master", BRIDGE, namespace=hub)
    _run("ip", "link", "set", hub_end, "up", namespace=hub)
    _run("ip", "addr", "add", f"{config.address(node)}/{config.prefixlen}", "dev", NODE_IFACE, namespace=ns)
    _run("ip", "link", "set", NODE_IFACE, "up", namespace=ns)
    _shape(config, ns, NODE_IFACE, delay_method)
    _shape(config, hub, hub_end, delay_method)
    _size_tcp_buffers(config, ns)
    etc = NETNS_ETC / ns
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(_hosts_text(config, node))


RELAY_START_S = 10.0
"""How long ``up`` waits for the relay to attach to every TAP device."""


def relay_command(config: TestbedConfig, binary: Path | None = None) -> list[str]:
    """The command line that starts ``config``'s relay, detached: the compiled ``binary``, else the Python script
    (``down`` finds either by its name and ``--prefix``)."""
    program = [str(binary)] if binary is not None else [sys.executable, relay.__file__]
    return [*program, "--prefix", config.prefix, "--nodes", str(config.nodes), "--delay", config.delay or "0ms",
            "--jitter", config.jitter or "0ms", "--state", str(config.state_dir), "--detach"]


def relay_cache() -> Path:
    """Where the compiled relay is kept (``$XDG_CACHE_HOME/pccl-torch/relay``, beside pccl's other caches)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pccl-torch" / "relay"


def build_relay(cache: Path | None = None) -> Path | None:
    """The C relay compiled from ``relay.c`` (once per source, into :func:`relay_cache`); None where no C compiler
    is found (``$CC``, ``cc``, ``gcc``). ``TestbedError`` with the compiler's message when compiling fails."""
    target = (cache or relay_cache()) / f"{RELAY_BINARY}-{hashlib.sha256(RELAY_SOURCE.read_bytes()).hexdigest()[:16]}"
    if target.exists():
        return target
    compiler = next((c for c in (os.environ.get("CC"), "cc", "gcc") if c and shutil.which(c)), None)
    if compiler is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    done = subprocess.run([compiler, "-O2", "-o", str(partial), str(RELAY_SOURCE), "-lm"], capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise TestbedError(f"compiling the delay relay failed (`{compiler} -O2 ... {RELAY_SOURCE}`): "
                           f"{done.stderr.strip()[-2000:]}; pass --relay python to use the Python relay")
    os.replace(partial, target)  # atomic: concurrent `up` calls never run a half-written binary
    return target


def _relay_binary(config: TestbedConfig) -> Path | None:
    """The compiled relay ``config`` runs (None: the Python one); ``TestbedError`` when ``c`` is asked for and
    there is no compiler."""
    if config.relay_impl == "python":
        return None
    binary = build_relay()
    if binary is None and config.relay_impl == "c":
        raise TestbedError("--relay c: no C compiler found ($CC, cc or gcc); install one (apt-get install -y gcc) "
                           "or pass --relay python")
    if binary is None:
        log.info("pccl-testbed: no C compiler; the delay relay runs in Python (about 20% of a core per Gbit/s)")
    return binary


def start_relay(config: TestbedConfig) -> int:
    """Start ``config``'s relay and wait until it has attached every link; its PID. ``TestbedError`` with the
    relay's log when it exits or is not ready in :data:`RELAY_START_S`."""
    state = config.state_dir
    for name in (relay.PID_FILE, relay.READY_FILE):
        (state / name).unlink(missing_ok=True)
    subprocess.run(relay_command(config, _relay_binary(config)), check=True, timeout=30)  # returns once forked
    deadline = time.monotonic() + RELAY_START_S
    while time.monotonic() < deadline:
        pid = _recorded_pid(state / relay.PID_FILE)
        if (state / relay.READY_FILE).exists() and pid is not None:
            return pid
        if pid is not None and not _alive(pid):
            break
        time.sleep(0.05)
    log_text = (state / relay.LOG_FILE).read_text()[-2000:] if (state / relay.LOG_FILE).exists() else "(no log)"
    raise TestbedError(f"the delay relay of testbed {config.prefix} did not attach its links in {RELAY_START_S:.0f} "
                       f"s; its log ({state / relay.LOG_FILE}):\n{log_text}")


def _recorded_pid(path: Path) -> int | None:
    """The PID written in ``path`` (None: missing or unreadable)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    """``pid``'s command line (empty when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def is_relay_of(cmdline: list[str], prefix: str) -> bool:
    """Whether ``cmdline`` is the relay of testbed ``prefix`` (its script or binary, ``--prefix <prefix>``)."""
    return (relay_impl_of(cmdline) is not None
            and any(a == "--prefix" and b == prefix for a, b in zip(cmdline, cmdline[1:])))


def relay_impl_of(cmdline: list[str]) -> str | None:
    """``c`` or ``python`` when ``cmdline`` runs a relay (the compiled binary first, or the script after an
    interpreter), else None."""
    if cmdline and Path(cmdline[0]).name.startswith(f"{RELAY_BINARY}-"):
        return "c"
    return "python" if Path(relay.__file__).name in (Path(word).name for word in cmdline[1:2]) else None


def relay_pids(prefix: str) -> list[int]:
    """Every running relay of testbed ``prefix``, found by command line (the relay's script or binary with
    ``--prefix <prefix>``): the one whose PID is recorded, and any a crashed ``up`` left or whose state folder is
    gone. A process that took over a recorded PID is never among them."""
    found = {pid for pid in (int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit())
             if is_relay_of(_cmdline(pid), prefix)}
    return sorted(pid for pid in found if _alive(pid))


def relay_status(prefix: str) -> RelayStatus:
    """The relay of testbed ``prefix`` as recorded in its state folder, with its CPU use."""
    pid = _recorded_pid(STATE_ROOT / prefix / relay.PID_FILE)
    command = _cmdline(pid) if pid is not None else []
    alive = pid is not None and _alive(pid) and is_relay_of(command, prefix)
    usage = cpu_use(pid) if alive else None
    return RelayStatus(pid, alive, usage.total_s if usage else None, usage.percent if usage else None,
                       relay_impl_of(command) if alive else None, scheduling_of(pid) if alive else None)


def scheduling_of(pid: int) -> str | None:
    """How ``pid`` is scheduled: ``real time`` (``SCHED_FIFO``/``SCHED_RR``) or ``nice N``; None when gone."""
    try:
        if os.sched_getscheduler(pid) in (os.SCHED_FIFO, os.SCHED_RR):
            return "real time"
        return f"nice {os.getpriority(os.PRIO_PROCESS, pid)}"
    except OSError:
        return None


class CpuUse(NamedTuple):
    """CPU a process has used, from ``/proc/<pid>/stat``."""

    user_s: float
    system_s: float
    percent: float
    """(user + system) over its lifetime, in percent of one core."""

    @property
    def total_s(self) -> float:
        return self.user_s + self.system_s


def cpu_use(pid: int) -> CpuUse | None:
    """What ``pid`` has used of the CPU (None: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    return cpu_from_stat(stat, uptime, os.sysconf("SC_CLK_TCK"))


def cpu_from_stat(stat: str, uptime_s: float, ticks_per_s: int) -> CpuUse:
    """CPU use from a ``/proc/<pid>/stat`` line: utime and stime (fields 14, 15), and their sum over the time
    since starttime (field 22), all in clock ticks."""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces; field 3 first
    user, system = int(fields[11]) / ticks_per_s, int(fields[12]) / ticks_per_s
    lifetime = uptime_s - int(fields[19]) / ticks_per_s
    return CpuUse(user, system, 100 * (user + system) / lifetime if lifetime > 0 else 0.0)


def up(config: TestbedConfig) -> bool:
    """Build testbed ``config.prefix`` as configured; returns False when it was already up as configured.

    Idempotent: a complete testbed with the same configuration is left as it is; anything else with the
    prefix (another configuration, leftovers of a crash) is removed first. On failure, whatever was
    created is removed and ``TestbedError`` says which command failed.
    """
    check_tools()
    _check_congestion_control(config.congestion_control)
    try:
        current = status(config.prefix)
        if current.up and current.config == config:
            return False
    except TestbedError:  # an unreadable state file: rebuilt below
        pass
    down(config.prefix)
    try:
        hub = config.hub
        _run("ip", "netns", "add", hub)
        _run("ip", "link", "set", "lo", "up", namespace=hub)
        _run("ip", "link", "add", BRIDGE, "type", "bridge", namespace=hub)
        _run("ip", "link", "set", BRIDGE, "up", namespace=hub)
        method = _delay_method(config, hub)
        for node in range(config.nodes):
            _add_node(config, node, method)
        running = _apply_congestion_control(config)
        config.state_dir.mkdir(parents=True, exist_ok=True)
        (config.state_dir / RUNNING_CONGESTION_FILE).write_text(f"{running or ''}\n")
        (config.state_dir / DELAY_METHOD_FILE).write_text(f"{method or ''}\n")
        if method == "relay":
            start_relay(config)
        (config.state_dir / "config.json").write_text(json.dumps(asdict(config), indent=1) + "\n")
    except BaseException:
        down(config.prefix)
        raise
    return True


def down(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove testbed ``prefix``: end the processes left in its namespaces (SIGTERM, then SIGKILL after
    2 s), delete the namespaces (and with them every link), its ``/etc/netns`` files and its state.
    Returns the namespaces removed; removing nothing is not an error."""
    check_tools()
    _end(relay_pids(prefix))
    found = namespaces(prefix)
    _end(sorted({pid for ns in found for pid in _pids(ns)}))
    for ns in found:
        _run("ip", "netns", "delete", ns)
    for etc in NETNS_ETC.glob(f"{prefix}-*"):
        if re.match(rf"^{re.escape(prefix)}-(hub|n\d+)$", etc.name):
            shutil.rmtree(etc, ignore_errors=True)
    shutil.rmtree(STATE_ROOT / prefix, ignore_errors=True)
    for folder in (NETNS_ETC, STATE_ROOT):  # ours when empty: ip netns exec needs neither
        try:
            folder.rmdir()
        except OSError:
            pass
    return found


def _end(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM ``pids``, then SIGKILL those still running after ``grace_s``."""
    if not pids:
        return
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    _signal([p for p in pids if _alive(p)], signal.SIGKILL)


def _pids(namespace: str) -> list[int]:
    result = _run("ip", "netns", "pids", namespace, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit() and int(p) != os.getpid()]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    except (PermissionError, IndexError):
        return True
    return state not in ("Z", "X")


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def load_config(prefix: str = DEFAULT_PREFIX) -> TestbedConfig | None:
    """The configuration ``up`` wrote for ``prefix`` (None when there is none)."""
    path = STATE_ROOT / prefix / "config.json"
    try:
        return TestbedConfig(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise TestbedError(f"{path} is not a testbed configuration ({exc}); run `pccl-testbed down "
                           f"--prefix {prefix}`") from None


def _qdisc(namespace: str, device: str) -> str | None:
    result = _run("tc", "qdisc", "show", "dev", device, namespace=namespace, check=False)
    line = result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else None
    return line if line and " root " in line else None


def status(prefix: str = DEFAULT_PREFIX) -> Status:
    """What exists of testbed ``prefix``, and what is wrong with it."""
    check_tools()
    config = load_config(prefix)
    found = namespaces(prefix)
    problems: list[str] = []
    nodes: list[NodeStatus] = []
    expected = [] if config is None else [config.hub] + [config.namespace(k) for k in range(config.nodes)]
    if config is None and found:
        problems.append(f"namespaces {', '.join(found)} exist without a configuration (a crashed `up`?)")
    problems += [f"namespace {ns} is missing" for ns in expected if ns not in found]
    problems += [f"namespace {ns} is not part of the configuration" for ns in found if expected and
                 ns not in expected]
    hub = f"{prefix}-hub"
    method = recorded_delay_method(prefix)
    found_relay = relay_status(prefix) if method == "relay" else None
    if found_relay is not None and not found_relay.alive:
        problems.append(f"the delay relay (pid {found_relay.pid or 'not recorded'}) is not running: the links carry "
                        f"nothing (its log: {STATE_ROOT / prefix / relay.LOG_FILE})")
    running = running_congestion_control(prefix)
    expected_tcp = running or (config.congestion_control if config is not None else None)
    for ns in found:
        if ns == hub:
            continue
        node = int(ns.rsplit("-n", 1)[1])
        shown = _run("ip", "-o", "-4", "addr", "show", "dev", NODE_IFACE, namespace=ns, check=False).stdout.split()
        address = shown[shown.index("inet") + 1] if "inet" in shown else None
        status_ = NodeStatus(ns, address, _qdisc(ns, NODE_IFACE),
                             _qdisc(hub, f"n{node}") if hub in found else None, _pids(ns), _congestion_control(ns))
        nodes.append(status_)
        if config is not None and node < config.nodes:
            want = f"{config.address(node)}/{config.prefixlen}"
            if address != want:
                problems.append(f"{ns}: address {address or 'missing'}, expected {want}")
            kind = "netem" if method == "netem" else ("tbf" if config.rate is not None else None)
            for where, line in (("node end", status_.qdisc_out), ("hub end", status_.qdisc_in)):
                if kind and (line is None or f"qdisc {kind} " not in line):
                    problems.append(f"{ns}: {where} of the link is not shaped by {kind} ({line or 'no qdisc'})")
            if expected_tcp and status_.congestion_control != expected_tcp:
                problems.append(f"{ns}: TCP congestion control {status_.congestion_control or 'unknown'}, "
                                f"expected {expected_tcp}")
    return Status(prefix, config, found, nodes, problems, running, method, found_relay)
