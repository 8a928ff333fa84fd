"""Measure pccl-testbed's links with delay: for each rate and round-trip time, bring up a 2-node testbed, then
between its namespaces a plain TCP ping-pong (RTT) and a one-way TCP bulk transfer (rate), with the delay
relay's CPU use over the transfer (from /proc/<pid>/stat). Needs root; tears down what it builds.

    python scripts/testbed_delay_check.py --rates 200mbit,1gbit --rtts 500us,5ms,25ms --seconds 3 --prefix pd58
    python scripts/testbed_delay_check.py --relay python ...    # the Python relay (default: C where cc is found)

Prints one JSON line per point: asked RTT and rate, measured RTT (median/min/max ms), rate (Mbit/s), and the
relay's CPU (user + system, and user alone) in percent of one core during the transfer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from pccl_torch.testbed import net, sockets
from pccl_torch.testbed.net import TestbedConfig

PORT = 5201


def in_node(config: TestbedConfig, node: int, *args: str) -> list[str]:
    """The command line running ``sockets.py args`` in ``node``'s namespace."""
    return [net.ip_path(), "netns", "exec", config.namespace(node), sys.executable, sockets.__file__, *args]


def client(config: TestbedConfig, *args: str) -> dict:
    """Run a ``sockets.py`` client on node 0 against node 1; its JSON answer."""
    done = subprocess.run(in_node(config, 0, *args, config.address(1), "--port", str(PORT)), capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def measure(config: TestbedConfig, seconds: float) -> dict:
    """RTT and bulk rate from node 0 to node 1 of a testbed that is up, with the relay's CPU over the bulk."""
    server = subprocess.Popen(in_node(config, 1, "serve", "--count", "2", "--port", str(PORT)),
                              stdout=subprocess.DEVNULL)
    try:
        ping = client(config, "rtt", "--count", "50")
        pid = net.relay_status(config.prefix).pid
        before = net.cpu_use(pid) if pid else None
        start = time.monotonic()
        flow = client(config, "bulk", "--seconds", str(seconds))
        after = net.cpu_use(pid) if pid else None
        elapsed = time.monotonic() - start
    finally:
        server.wait(timeout=30)
    cpu = {} if before is None or after is None else {
        "relay_cpu_percent": round(100 * (after.total_s - before.total_s) / elapsed, 1),
        "relay_user_percent": round(100 * (after.user_s - before.user_s) / elapsed, 1)}
    return {**{k: round(v, 3) for k, v in ping.items()}, "mbit": round(flow["mbit"], 1), **cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="200mbit,1gbit")
    parser.add_argument("--rtts", default="500us,5ms,25ms")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds of bulk transfer per point")
    parser.add_argument("--prefix", default="pdelay")
    parser.add_argument("--mtu", type=int, help="link MTU (default: the testbed's)")
    parser.add_argument("--method", default="auto", choices=net.DELAY_METHODS)
    parser.add_argument("--relay", default="auto", choices=net.RELAY_IMPLS)
    args = parser.parse_args(argv)
    for rate in args.rates.split(","):
        for rtt in args.rtts.split(","):
            config = TestbedConfig(nodes=2, rate=rate, delay=rtt, prefix=args.prefix, mtu=args.mtu,
                                   delay_method=args.method, relay_impl=args.relay)
            try:
                net.up(config)
                found = measure(config, args.seconds)
            finally:
                net.down(config.prefix)
            print(json.dumps({"rate": rate, "rtt_asked": rtt, "mtu": config.link_mtu, "relay": args.relay, **found}),
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
