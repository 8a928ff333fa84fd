"""pccl-testbed: emulated nodes on one machine (network namespaces joined by rate-shaped links), and MPI
launches into them. Needs root and iproute2 (ip, tc).

    pccl-testbed up --nodes 2 --rate 1gbit          # build (idempotent); --rate 200mbit, --burst, --delay,
                                                    #   --congestion-control (default cubic)
    pccl-testbed up --rate 1gbit --delay 5ms        # 5 ms round trip between nodes (netem, or the delay relay)
    pccl-testbed status                             # what exists, what is wrong, the relay's CPU; exit 1 unless up
    pccl-testbed probe                              # MPI Sendrecv rate inside a node and between nodes, and RTT
    pccl-testbed run -np 4 -- python train.py       # 2 ranks per node; pccl detects the nodes itself
    pccl-testbed torchrun --ppn 2 -- train.py       # one `torchrun --nnodes 2` per node, no MPI
    pccl-bench --testbed -np 4 --local-size 2 ...   # the benchmark across the testbed
    pccl-testbed down                               # remove everything with the prefix (also after a crash)
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from dataclasses import asdict, replace

from pccl_torch.testbed import launch, net
from pccl_torch.testbed.net import DEFAULT_PREFIX, TestbedConfig, TestbedError
from pccl_torch.units import UsageError, run_command, tool_parser


def build_parser() -> argparse.ArgumentParser:
    parser = tool_parser("pccl-testbed", __doc__)
    sub = parser.add_subparsers(dest="action", required=True, help="what to do (each has its own --help)")

    def with_prefix(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--prefix", default=DEFAULT_PREFIX,
                       help=f"names of the namespaces, <prefix>-hub and <prefix>-n<k> (default {DEFAULT_PREFIX})")
        return p

    up = with_prefix(sub.add_parser("up", help="build the testbed (idempotent)"))
    up.add_argument("--nodes", type=int, default=2, help="node namespaces (default 2)")
    up.add_argument("--rate", help="link rate each way in tc units (1gbit, 200mbit); default unshaped")
    up.add_argument("--burst", type=int, help="tbf bucket in bytes (default: 1 ms at the rate, >= 32 KiB)")
    up.add_argument("--latency", default="50ms", help="tbf queue limit as a time (default 50ms)")
    up.add_argument("--delay", metavar="RTT",
                    help="round-trip time added between two nodes (500us, 5ms): a quarter on each link end each way "
                         "(a packet crosses its sender's link and its receiver's, the answer crosses them back); "
                         "by netem where the kernel has it, else by a relay process between TAP devices")
    up.add_argument("--jitter", metavar="J", help="largest change of the round-trip time either way (uniform, a "
                                                  "quarter per link end; packets are never reordered)")
    up.add_argument("--delay-method", choices=net.DELAY_METHODS, default="auto",
                    help="how --delay is made: auto (netem if the kernel has it, else the relay), netem, relay")
    up.add_argument("--relay", choices=net.RELAY_IMPLS, default="auto",
                    help="which relay: auto (C, compiled once with the system's cc, where there is one; else Python), "
                         "c, python")
    up.add_argument("--mtu", type=int, help=f"MTU of the links (default {net.PLAIN_MTU}, {net.DELAY_MTU} with "
                                            "--delay: fewer frames for the relay)")
    up.add_argument("--subnet", default=net.DEFAULT_SUBNET, help=f"node addresses (default {net.DEFAULT_SUBNET})")
    up.add_argument("--congestion-control", default=net.DEFAULT_CONGESTION_CONTROL, metavar="NAME",
                    help=f"TCP congestion control of the nodes (default {net.DEFAULT_CONGESTION_CONTROL}, Linux's "
                         "default; 'host': the host's own, whatever it is)")
    with_prefix(sub.add_parser("down", help="remove everything with the prefix"))
    st = with_prefix(sub.add_parser("status", help="show the testbed; exit 1 unless it is up and complete"))
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    tr = with_prefix(sub.add_parser("torchrun", help="run a script with one torchrun per node namespace (no MPI)"))
    tr.add_argument("--ppn", type=int, default=1, help="ranks per node (torchrun --nproc-per-node; default 1)")
    tr.add_argument("--nodes", type=int, help="nodes to use (default: all of the testbed's)")
    tr.add_argument("--port", type=int, default=launch.RENDEZVOUS_PORT,
                    help=f"c10d rendezvous port on node 0 (default {launch.RENDEZVOUS_PORT})")
    tr.add_argument("command", nargs=argparse.REMAINDER, help="after --: the script and its arguments, or -m module")
    for name, text in (("run", "run a command as MPI ranks in the namespaces"),
                       ("probe", "measure MPI Sendrecv rates and round trips inside a node and to every other node")):
        p = with_prefix(sub.add_parser(name, help=text))
        p.add_argument("-np", "--nprocs", type=int, help="ranks (default: ppn x nodes)")
        p.add_argument("--ppn", type=int, help="ranks per node (default: ranks / nodes; probe: 2)")
        p.add_argument("--mpiexec", help="mpiexec to use (default: this environment's)")
        if name == "run":
            p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
        else:
            p.add_argument("--mbytes", type=float, default=8, help="MiB per direction (default 8)")
    return parser


def _print_status(found: net.Status) -> None:
    config = found.config
    state = "up" if found.up else ("absent" if not found.namespaces and config is None else "BROKEN")
    print(f"testbed {found.prefix}: {state}" + (f" ({config.describe(found.delay_method)})" if config else ""))
    if found.relay is not None:
        print(f"  delay relay: {_relay_line(found.relay)}")
    for node in found.nodes:
        print(f"  {node.namespace:<12} {node.address or 'no address':<16} processes {len(node.pids)}, "
              f"TCP {node.congestion_control or 'unknown'}")
        print(f"    out (node -> hub): {node.qdisc_out or 'unshaped'}")
        print(f"    in  (hub -> node): {node.qdisc_in or 'unshaped'}")
    if config and config.congestion_control and found.congestion_control not in (None, config.congestion_control):
        print(f"  TCP {found.congestion_control}, the host's: {config.congestion_control} is not allowed in namespaces "
              "here (net.ipv4.tcp_allowed_congestion_control)")
    for problem in found.problems:
        print(f"  problem: {problem}")
    if found.problems:
        print(f"  fix: pccl-testbed down --prefix {found.prefix}, then up again")


def _relay_line(relay: net.RelayStatus) -> str:
    """``pid 4103, running, CPU 3.2 s (16.1% of a core since it started)`` or why it is not running."""
    if not relay.alive:
        return f"NOT RUNNING (recorded pid {relay.pid or 'none'})"
    return (f"pid {relay.pid} ({relay.impl}, {relay.scheduling}), running, CPU {relay.cpu_s:.1f} s "
            f"({relay.cpu_percent:.1f}% of a core since it started)")


def _launch(args: argparse.Namespace, command: list[str]) -> int:
    config = launch.require(args.prefix)
    line = launch.mpiexec_command(config, command, nprocs=args.nprocs, per_node=args.ppn, mpiexec=args.mpiexec)
    return subprocess.run(line, env=launch.run_environment(config)).returncode


def _torchrun(args: argparse.Namespace, command: list[str]) -> int:
    """Start one torchrun per node at once; the worst exit status of them."""
    config = launch.require(args.prefix)
    lines = launch.torchrun_commands(config, command, per_node=args.ppn, nodes=args.nodes, port=args.port)
    env = launch.run_environment(config)
    agents = [subprocess.Popen(line, env=env) for line in lines]
    return max(abs(agent.wait()) for agent in agents)


def run(args: argparse.Namespace) -> int:
    """Carry out ``args.action``; its exit status."""
    if args.action == "up":
        congestion_control = None if args.congestion_control == "host" else args.congestion_control
        config = TestbedConfig(nodes=args.nodes, rate=args.rate, burst=args.burst, latency=args.latency,
                               delay=args.delay, jitter=args.jitter, delay_method=args.delay_method,
                               relay_impl=args.relay, mtu=args.mtu, prefix=args.prefix, subnet=args.subnet,
                               congestion_control=congestion_control)
        built = net.up(config)
        running = net.running_congestion_control(config.prefix)  # the host's where the configured one is refused
        shown = config if running in (None, config.congestion_control) else replace(config, congestion_control=running)
        method = net.recorded_delay_method(config.prefix)
        print(f"testbed {config.prefix} {'up' if built else 'already up'}: {shown.describe(method)}")
        return 0
    if args.action == "down":
        removed = net.down(args.prefix)
        print(f"testbed {args.prefix} down: " + (f"removed {', '.join(removed)}" if removed else "nothing found"))
        return 0
    if args.action == "status":
        found = net.status(args.prefix)
        if args.json:
            print(json.dumps({**asdict(found), "up": found.up}, indent=1))
        else:
            _print_status(found)
        return 0 if found.up else 1
    if args.action == "probe":
        if args.ppn is None and args.nprocs is None:
            args.ppn = 2
        return _launch(args, [sys.executable, "-m", "pccl_torch.testbed.probe", "--mbytes", str(args.mbytes)])
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        example = "run -np 4 -- python script.py" if args.action == "run" else "torchrun --ppn 2 -- script.py"
        raise UsageError(f"{args.action}: no command given (pccl-testbed {example})")
    return _torchrun(args, command) if args.action == "torchrun" else _launch(args, command)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(parser, functools.partial(run, args), (TestbedError,))


if __name__ == "__main__":
    sys.exit(main())
