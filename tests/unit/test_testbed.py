"""pccl-testbed pieces that need neither root nor namespaces: rates, configuration checks, rank layouts,
the hydra launcher script and command line, the tool checks, pccl-bench's testbed flags, and the delay relay's
scheduling (its frames through socket pairs instead of TAP devices) and bookkeeping."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import torch

from pccl_torch.bench.cli import ranks_argv
from pccl_torch.bench.runner import Settings
from pccl_torch.testbed import TestbedConfig, TestbedError, launch, net, relay
from pccl_torch.testbed.net import format_rate, parse_rate


def test_rates_read_as_tc_does() -> None:
    assert parse_rate("1gbit") == 10**9 and parse_rate("200mbit") == 2 * 10**8 and parse_rate("500kbit") == 5 * 10**5
    assert parse_rate("100mbps") == 8 * 10**8 and parse_rate("1.5Gbit") == 15 * 10**8
    assert format_rate(10**9) == "1gbit" and format_rate(2 * 10**8) == "200mbit" and format_rate(12345) == "12345bit"
    for bad in ("fast", "1gigabit", "10", "1bit"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_config_names_addresses_and_checks() -> None:
    config = TestbedConfig(nodes=3, rate="1gbit")
    assert config.hub == "pccl-hub" and [config.namespace(k) for k in range(3)] == ["pccl-n0", "pccl-n1", "pccl-n2"]
    assert [config.address(k) for k in range(3)] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert config.burst_bytes == 125_000  # 1 ms at 1 Gbit/s
    assert TestbedConfig(rate="200mbit").burst_bytes == 32 << 10  # at least 32 KiB
    assert TestbedConfig().burst_bytes is None and "unshaped" in TestbedConfig().describe()
    assert TestbedConfig(subnet="10.9.8.0/29", nodes=6).address(5) == "10.9.8.6"
    assert config.congestion_control == "cubic" and "TCP cubic" in config.describe()
    assert "the host's TCP congestion control" in TestbedConfig(congestion_control=None).describe()
    for kwargs, message in (({"nodes": 0}, "nodes must be"), ({"subnet": "10.0.0.0/30", "nodes": 3}, "nodes must be"),
                            ({"prefix": "Bad-Name"}, "prefix"), ({"rate": "quick"}, "cannot read rate"),
                            ({"burst": 10}, "burst"), ({"delay": "soon"}, "delay"), ({"subnet": "fd00::/64"}, "IPv4"),
                            ({"congestion_control": "cubic; reboot"}, "congestion control"),
                            ({"delay": "5"}, "delay '5' must be a time"), ({"jitter": "1ms"}, "needs a delay"),
                            ({"delay": "2ms", "jitter": "3ms"}, "must not exceed the delay"),
                            ({"delay": "2ms", "delay_method": "tc"}, "delay method 'tc' must be one of"),
                            ({"mtu": 70000}, "mtu must be between 576 and 65521"),
                            ({"delay": "1ms", "relay_impl": "rust"}, "relay 'rust' must be one of auto, c, python"),
                            ({"delay": "1ms", "burst": 4000},
                             r"burst must hold one frame \(65014 bytes at MTU 65000\)")):
        with pytest.raises(ValueError, match=message):
            TestbedConfig(**kwargs)


def test_unknown_congestion_control_is_refused_before_anything_is_built(monkeypatch) -> None:
    monkeypatch.setattr(net, "available_congestion_controls", lambda: ["reno", "cubic"])
    monkeypatch.setattr(net, "check_tools", lambda: None)
    monkeypatch.setattr(net, "status", lambda prefix: pytest.fail("the kernel's list must be checked first"))
    with pytest.raises(TestbedError, match=r"'bbr' is not available in this kernel \(available: reno, cubic\)"):
        net.up(TestbedConfig(nodes=2, congestion_control="bbr"))


def _fake_host(monkeypatch, tmp_path, allowed: str | None) -> list[tuple[str, str, str]]:
    """A host whose allowed list is the file ``allowed`` (None: the kernel does not say) and whose default is
    bbr; returns the (namespace, name, allowed list at that moment) of every namespace set."""
    path = tmp_path / "tcp_allowed_congestion_control"
    if allowed is not None:
        path.write_text(allowed + "\n")
    monkeypatch.setattr(net, "ALLOWED_CONGESTION", path)
    monkeypatch.setattr(net, "_congestion_control", lambda namespace: "bbr")
    done: list[tuple[str, str, str]] = []
    monkeypatch.setattr(net, "_set_congestion_control", lambda namespace, name: done.append(
        (namespace, name, path.read_text().strip() if path.exists() else "")))
    return done


def test_congestion_control_not_allowed_is_allowed_while_the_nodes_are_set(monkeypatch, tmp_path) -> None:
    """Where cubic is available but not allowed in namespaces (a namespace's write fails with "I/O error"),
    root adds it to the host's list while the nodes are set, then restores the list."""
    done = _fake_host(monkeypatch, tmp_path, "reno bbr")
    assert net._apply_congestion_control(TestbedConfig(nodes=2)) == "cubic"
    assert done == [("pccl-n0", "cubic", "reno bbr cubic"), ("pccl-n1", "cubic", "reno bbr cubic")]
    assert net.allowed_congestion_controls() == ["reno", "bbr"]  # restored


def test_congestion_control_already_allowed_leaves_the_host_s_list_alone(monkeypatch, tmp_path) -> None:
    done = _fake_host(monkeypatch, tmp_path, "reno cubic bbr")
    monkeypatch.setattr(net, "_write_allowed", lambda names: pytest.fail("the list already allows cubic"))
    assert net._apply_congestion_control(TestbedConfig(nodes=2, congestion_control="reno")) == "reno"
    assert [(ns, name) for ns, name, _ in done] == [("pccl-n0", "reno"), ("pccl-n1", "reno")]
    done = _fake_host(monkeypatch, tmp_path / "missing", None)  # the kernel does not say: set it as asked
    assert net._apply_congestion_control(TestbedConfig(nodes=1)) == "cubic" and len(done) == 1
    assert net._apply_congestion_control(TestbedConfig(nodes=1, congestion_control=None)) == "bbr" and len(done) == 1


def test_congestion_control_that_cannot_be_allowed_leaves_the_host_s_with_one_log_line(monkeypatch, tmp_path,
                                                                                       caplog) -> None:
    done = _fake_host(monkeypatch, tmp_path, "reno bbr")

    def read_only(names: list[str]) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(net, "_write_allowed", read_only)
    with caplog.at_level("INFO", logger=net.__name__):
        assert net._apply_congestion_control(TestbedConfig(nodes=2)) == "bbr"
    assert done == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "pccl-testbed: the nodes run the host's TCP bbr, not cubic "
                    "(net.ipv4.tcp_allowed_congestion_control is 'reno bbr' and cannot be changed here: "
                    "Read-only file system)")]


def _fake_testbed(monkeypatch, tmp_path, config: TestbedConfig, state: dict[str, str]) -> None:
    """Testbed ``config`` (one node, prefix ``unit``) as ``status`` would find it: its configuration and the
    ``state`` files in a state folder under ``tmp_path``, its namespaces, its node's address, no qdisc, no
    process, TCP cubic."""
    monkeypatch.setattr(net, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(net, "check_tools", lambda: None)
    config.state_dir.mkdir()
    (config.state_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
    for name, text in state.items():
        (config.state_dir / name).write_text(text + "\n")
    monkeypatch.setattr(net, "namespaces", lambda prefix: ["unit-hub", "unit-n0"])
    monkeypatch.setattr(net, "_run", lambda *args, **kwargs: subprocess.CompletedProcess(
        args, 0, "2: pccl0 inet 10.77.0.1/24 brd 10.77.0.255", ""))
    monkeypatch.setattr(net, "_qdisc", lambda namespace, device: None)
    monkeypatch.setattr(net, "_pids", lambda namespace: [])
    monkeypatch.setattr(net, "_congestion_control", lambda namespace: "cubic")


def test_status_expects_the_congestion_control_up_set(monkeypatch, tmp_path) -> None:
    """A testbed whose nodes run the host's control (cubic refused) is up, not broken; one whose nodes
    run anything else is broken."""
    _fake_testbed(monkeypatch, tmp_path, TestbedConfig(nodes=1, prefix="unit"), {net.RUNNING_CONGESTION_FILE: "bbr"})
    running = {"unit-n0": "bbr"}
    monkeypatch.setattr(net, "_congestion_control", lambda namespace: running[namespace])
    found = net.status("unit")
    assert found.up and found.congestion_control == "bbr", found.problems
    running["unit-n0"] = "reno"
    assert net.status("unit").problems == ["unit-n0: TCP congestion control reno, expected bbr"]


def test_rank_layouts() -> None:
    config = TestbedConfig(nodes=2)
    assert launch.layout(config, 4, None) == (4, 2)
    assert launch.layout(config, None, 3) == (6, 3)
    assert launch.layout(config, 2, 2) == (2, 2)  # one node used
    assert launch.layout(config, None, None) == (2, 1)
    with pytest.raises(TestbedError, match="do not divide evenly"):
        launch.layout(config, 3, None)
    with pytest.raises(TestbedError, match="need 3 nodes"):
        launch.layout(config, 6, 2)
    with pytest.raises(TestbedError, match="whole number"):
        launch.layout(config, 3, 2)


def test_launcher_maps_hosts_to_namespaces(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(net, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(launch, "ip_path", lambda: "/bin/echo")  # prints what it would run
    config = TestbedConfig(nodes=2, prefix="unit")
    script = launch.write_launcher(config)
    # hydra's ssh launcher: <script> -x <host> <command words>
    ran = subprocess.run([str(script), "-x", "10.77.0.2", '"/venv/bin/hydra_pmi_proxy"', "--proxy-id", "1"],
                         capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.split() == ["netns", "exec", "unit-n1", "/bin/sh", "-c",
                                                          '"/venv/bin/hydra_pmi_proxy"', "--proxy-id", "1"]
    unknown = subprocess.run([str(script), "-x", "10.77.0.9", "true"], capture_output=True, text=True)
    assert unknown.returncode == 255 and "not a node of testbed unit" in unknown.stderr
    command = launch.mpiexec_command(config, ["python", "x.py"], nprocs=4, mpiexec="/venv/bin/mpiexec")
    assert command == ["/bin/echo", "netns", "exec", "unit-n0", "/venv/bin/mpiexec", "-hosts",
                       "10.77.0.1:2,10.77.0.2:2", "-launcher", "ssh", "-launcher-exec", str(script), "-n", "4",
                       "python", "x.py"]
    env = launch.run_environment(config, {"PCCL_LOCAL_SIZE": "2", "PATH": "/bin"})
    assert "PCCL_LOCAL_SIZE" not in env and env["PATH"] == "/bin"
    assert env["MASTER_ADDR"] == "10.77.0.1" and env["GLOO_SOCKET_IFNAME"] == net.NODE_IFACE
    assert env["MPIR_CVAR_CH4_NETMOD"] == "ofi" and env["FI_PROVIDER"] == "tcp"


def test_missing_root_or_iproute2_is_explained(monkeypatch) -> None:
    monkeypatch.setattr(net.os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match="needs root"):
        net.check_tools()
    monkeypatch.setattr(net.os, "geteuid", lambda: 0)
    monkeypatch.setattr(net.shutil, "which", lambda tool: None)
    monkeypatch.setattr(net.os, "access", lambda path, mode: False)
    with pytest.raises(TestbedError, match="apt-get install -y iproute2"):
        net.check_tools()


def test_bench_testbed_flags() -> None:
    argv = ["--testbed", "-np", "4", "--local-size", "2", "-b", "1K", "--testbed=x"]
    assert ranks_argv(argv, testbed=True) == ["-b", "1K"]
    assert ranks_argv(["--testbed", "tb2", "-np=4", "-e", "1M"], testbed=True) == ["-e", "1M"]
    assert ranks_argv(["-np", "4", "--local-size", "2", "-n", "3"]) == ["--local-size", "2", "-n", "3"]


def test_iteration_budget() -> None:
    plain = Settings(("all_reduce",), (1024,), torch.float32, 3, 10, "pccl", False)
    assert plain.counts(1 << 30) == (3, 10)
    budget = Settings(("all_reduce",), (1024,), torch.float32, 3, 10, "pccl", False, iter_budget=64 << 20)
    assert budget.counts(1 << 20) == (3, 10)
    assert budget.counts(16 << 20) == (1, 4)
    assert budget.counts(64 << 20) == (1, 3)  # never fewer than 3 timed iterations


def test_delay_is_a_round_trip_split_over_four_link_ends() -> None:
    config = TestbedConfig(rate="1gbit", delay="20ms", jitter="2ms")
    assert config.rtt_s == 0.02 and relay.leg_delay(config.rtt_s) == 0.005  # A->hub, hub->B, and back
    assert config.link_mtu == net.DELAY_MTU and TestbedConfig().link_mtu == net.PLAIN_MTU == TestbedConfig(
        delay="0ms", mtu=1500).link_mtu
    assert config.burst_bytes == 2 * (65000 + 14)  # a tbf bucket smaller than a frame would drop it
    assert TestbedConfig(rate="1gbit").burst_bytes == 125_000  # links without delay as before
    assert "round trip 20ms +- 2ms (relay, MTU 65000)" in config.describe("relay")
    assert "round trip 20ms +- 2ms (auto, " in config.describe() and "round trip" not in TestbedConfig().describe()


def test_tcp_buffers_hold_four_bandwidth_delay_products() -> None:
    assert TestbedConfig(rate="1gbit", delay="20ms").tcp_buffer_max() == 10_000_000  # 4 x 125 MB/s x 20 ms
    assert TestbedConfig(delay="1ms").tcp_buffer_max() == 5_000_000  # unshaped: sized for 10 Gbit/s
    assert TestbedConfig(rate="1gbit").tcp_buffer_max() is None  # no delay: the kernel's own
    assert net.tcp_buffer_setting(net.TCP_RMEM, 10_000_000) == "4096 131072 10000000"
    assert net.tcp_buffer_setting(net.TCP_WMEM, 1000) == "4096 16384 4194304"  # never below Linux's default


def test_times_read_as_tc_does() -> None:
    assert relay.parse_time("500us") == pytest.approx(5e-4) and relay.parse_time("2ms") == 0.002
    assert relay.parse_time("0.1s") == 0.1 and relay.parse_time(" 25 ms ") == 0.025
    for bad in ("5", "5 min", "fast", "-1ms"):
        with pytest.raises(ValueError, match="expected a number and a unit"):
            relay.parse_time(bad)


def test_due_times_keep_the_order_frames_came_in() -> None:
    assert relay.due_time(10.0, 0.005, 0.0, -math.inf, 0.5) == 10.005
    assert relay.due_time(10.0, 0.005, 0.002, -math.inf, 0.0) == pytest.approx(10.003)  # earliest draw
    assert relay.due_time(10.0, 0.005, 0.002, -math.inf, 1.0) == pytest.approx(10.007)
    assert relay.due_time(10.0, 0.005, 0.002, 10.0069, 0.0) == 10.0069  # never before the frame ahead of it
    assert relay.due_time(10.0, 0.001, 0.004, -math.inf, 0.0) == 10.0  # never before it came


def test_delay_line_holds_frames_until_due_and_drops_beyond_its_limit() -> None:
    line = relay.DelayLine(delay=0.010, jitter=0.004, limit_bytes=10)
    assert line.next_due() is None
    assert line.push(1.000, b"aaaa", draw=1.0) and line.push(1.001, b"bbbb", draw=0.0)  # b drawn earlier than a
    assert not line.push(1.002, b"ccc") and line.dropped == 1 and line.held_bytes == 8  # 11 bytes > 10
    assert line.next_due() == pytest.approx(1.014)
    assert list(line.pop_due(1.0139)) == []
    assert list(line.pop_due(1.014)) == [b"aaaa", b"bbbb"]  # b waited for a: both due at 1.014
    assert line.held_bytes == 0 and line.next_due() is None and line.push(1.02, b"ccc")


def test_relay_waits_in_epoll_then_sleeps_the_last_millisecond() -> None:
    lines = [relay.DelayLine(0.01), relay.DelayLine(0.01)]
    assert relay.next_wait(lines, 5.0) is None and relay.poll_timeout(None) == -1
    lines[0].push(5.0, b"x")
    lines[1].push(4.995, b"y")
    assert relay.next_wait(lines, 5.0) == pytest.approx(0.005)
    assert relay.next_wait(lines, 6.0) == 0.0  # late: at once
    assert relay.poll_timeout(0.005) == pytest.approx(0.004) and relay.poll_timeout(0.0004) == 0.0


def test_relay_carries_frames_both_ways_after_the_delay() -> None:
    """Two datagram socket pairs stand for a node's TAP device and the hub's: what one end writes comes out of
    the other, whole, in order, no sooner than the delay."""
    node, node_relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    hub, hub_relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with node, node_relay, hub, hub_relay:
        for end in (node_relay, hub_relay, hub, node):
            end.setblocking(False)
        start = time.monotonic()
        node.send(b"first")
        node.send(b"second")
        hub.send(b"answer")
        relay.serve([(node_relay.fileno(), hub_relay.fileno())], delay=0.03, until=start + 0.1)
        assert [hub.recv(100), hub.recv(100), node.recv(100)] == [b"first", b"second", b"answer"]
        with pytest.raises(BlockingIOError):
            hub.recv(100)
        node.send(b"late")
        relay.serve([(node_relay.fileno(), hub_relay.fileno())], delay=0.05, until=time.monotonic() + 0.02)
        with pytest.raises(BlockingIOError):  # held for 50 ms: not out after 20
            hub.recv(100)


def test_relay_bookkeeping(tmp_path, monkeypatch) -> None:
    line = ("1234 (python3 relay) S 1 1234 1234 0 -1 4194560 100 0 0 0 150 50 0 0 10 -10 1 0 1000 0 0 "
            + "0 " * 30).strip()
    used = net.cpu_from_stat(line, uptime_s=30.0, ticks_per_s=100)
    assert (used.user_s, used.system_s, used.total_s) == (1.5, 0.5, 2.0)
    assert used.percent == pytest.approx(10.0)  # 200 ticks over the 20 s since tick 1000
    script = relay.__file__
    assert net.is_relay_of(["/venv/bin/python", script, "--prefix", "pd58", "--nodes", "2"], "pd58")
    assert not net.is_relay_of(["/venv/bin/python", script, "--prefix", "pd581"], "pd58")
    assert not net.is_relay_of(["python", "train.py", "--prefix", "pd58"], "pd58")
    command = net.relay_command(TestbedConfig(delay="4ms", prefix="pd58"))
    assert net.is_relay_of(command, "pd58") and command[-1] == "--detach" and "--jitter" in command
    assert net.relay_impl_of(command) == "python"
    compiled = net.relay_command(TestbedConfig(delay="4ms", prefix="pd58"), net.Path("/c/pccl-relay-0123abcd"))
    assert compiled[0] == "/c/pccl-relay-0123abcd" and compiled[1:] == command[2:]  # the same arguments
    assert net.is_relay_of(compiled, "pd58") and net.relay_impl_of(compiled) == "c"
    assert net.relay_impl_of(["/usr/bin/python3", "x.py", relay.__file__]) is None


def test_status_reports_a_dead_relay(monkeypatch, tmp_path) -> None:
    config = TestbedConfig(nodes=1, prefix="unit", delay="4ms")
    _fake_testbed(monkeypatch, tmp_path, config, {net.DELAY_METHOD_FILE: "relay", relay.PID_FILE: "4242"})
    monkeypatch.setattr(net, "_alive", lambda pid: False)
    monkeypatch.setattr(net, "_cmdline", lambda pid: [])
    found = net.status("unit")
    assert not found.up and found.delay_method == "relay" and found.relay == net.RelayStatus(4242, False)
    assert found.problems == [f"the delay relay (pid 4242) is not running: the links carry nothing (its log: "
                              f"{tmp_path / 'unit' / relay.LOG_FILE})"]
    monkeypatch.setattr(net, "_alive", lambda pid: True)
    monkeypatch.setattr(net, "_cmdline", lambda pid: net.relay_command(config))
    monkeypatch.setattr(net, "cpu_use", lambda pid: net.CpuUse(1.0, 0.5, 12.5))
    monkeypatch.setattr(net, "scheduling_of", lambda pid: "real time")
    found = net.status("unit")
    assert found.up and found.relay == net.RelayStatus(4242, True, 1.5, 12.5, "python", "real time"), found.problems


def test_scheduling_of_reads_the_class_and_the_nice_value() -> None:
    assert net.scheduling_of(os.getpid()) == f"nice {os.getpriority(os.PRIO_PROCESS, os.getpid())}"
    assert net.scheduling_of(2 ** 22 + 12345) is None  # no such process


def test_the_c_relay_compiles_once_and_reads_the_python_relay_s_arguments(tmp_path) -> None:
    if not any(shutil.which(c) for c in ("cc", "gcc")):
        pytest.skip("no C compiler here: up runs the Python relay")
    binary = net.build_relay(tmp_path)
    assert binary is not None and binary.name.startswith("pccl-relay-") and net.build_relay(tmp_path) == binary
    assert [p.name for p in tmp_path.iterdir()] == [binary.name]  # nothing half-written left beside it
    bad_time = subprocess.run([str(binary), "--prefix", "x", "--nodes", "1", "--delay", "5", "--state", str(tmp_path)],
                              capture_output=True, text=True, timeout=10)
    assert bad_time.returncode == 2 and "cannot read time '5'" in bad_time.stderr
    missing = subprocess.run([str(binary), "--prefix", "x"], capture_output=True, text=True, timeout=10)
    assert missing.returncode == 2 and "usage:" in missing.stderr
    absent = subprocess.run([str(binary), "--prefix", "nosuchtb", "--nodes", "1", "--delay", "1ms", "--state",
                             str(tmp_path)], capture_output=True, text=True, timeout=10)
    assert absent.returncode == 1 and "cannot enter network namespace nosuchtb-n0" in absent.stderr


def test_a_relay_that_exits_at_start_fails_up_with_its_log(monkeypatch, tmp_path) -> None:
    """The relay records its PID, then exits before it is ready (say no /dev/net/tun): up's wait ends at once
    with the relay's log in the error, not after the full timeout."""
    monkeypatch.setattr(net, "STATE_ROOT", tmp_path)
    config = TestbedConfig(nodes=1, prefix="unit", delay="4ms", relay_impl="python")
    config.state_dir.mkdir()
    fake = (f"import os, pathlib; s = pathlib.Path({str(config.state_dir)!r}); "
            f"(s / {relay.PID_FILE!r}).write_text(str(os.getpid())); "
            f"(s / {relay.LOG_FILE!r}).write_text('relay: cannot open /dev/net/tun: No such device')")
    monkeypatch.setattr(net, "relay_command", lambda config, binary: [sys.executable, "-c", fake])
    start = time.monotonic()
    with pytest.raises(TestbedError, match=r"did not attach its links in 10 s; its log .*\n"
                                           r"relay: cannot open /dev/net/tun: No such device"):
        net.start_relay(config)
    assert time.monotonic() - start < 5
