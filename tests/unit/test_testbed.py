"""pccl-testbed pieces that need neither root nor namespaces: rates, configuration checks, rank layouts,
the hydra launcher script and command line, the tool checks, and pccl-bench's testbed flags."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest
import torch

from pccl_torch.bench.cli import ranks_argv
from pccl_torch.bench.runner import Settings
from pccl_torch.testbed import TestbedConfig, TestbedError, launch, net
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
                            ({"congestion_control": "cubic; reboot"}, "congestion control")):
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


def test_status_expects_the_congestion_control_up_set(monkeypatch, tmp_path) -> None:
    """A testbed whose nodes run the host's control (cubic refused) is up, not broken; one whose nodes
    run anything else is broken."""
    monkeypatch.setattr(net, "STATE_ROOT", tmp_path)
    monkeypatch.setattr(net, "check_tools", lambda: None)
    config = TestbedConfig(nodes=1, prefix="unit")
    config.state_dir.mkdir()
    (config.state_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
    (config.state_dir / net.RUNNING_CONGESTION_FILE).write_text("bbr\n")
    monkeypatch.setattr(net, "namespaces", lambda prefix: ["unit-hub", "unit-n0"])
    monkeypatch.setattr(net, "_run", lambda *args, **kwargs: subprocess.CompletedProcess(
        args, 0, "2: pccl0 inet 10.77.0.1/24 brd 10.77.0.255", ""))
    monkeypatch.setattr(net, "_qdisc", lambda namespace, device: None)
    monkeypatch.setattr(net, "_pids", lambda namespace: [])
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
