"""The emulated multi-node testbed (pccl-testbed): 2 network namespaces joined by 200 Mbit/s links, 2 ranks
in each. pccl must detect the 2 nodes with no PCCL_LOCAL_SIZE, the hierarchical collectives must be right
across the namespaces, MPI traffic between them must be held to the link rate (while inside a namespace it
is not), and nothing may be left behind. Skipped only where network namespaces cannot be made (not root,
no iproute2, or a kernel or sandbox that refuses them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pccl_torch.testbed import (TestbedConfig, TestbedError, check_tools, down, mpiexec_command, run_environment,
                                torchrun_commands)
from pccl_torch.testbed import net, sockets

from .conftest import HERE, ROOT, bring_up_testbed, collect_ranks
from .rank_result import RESULT_DIR_ENV

PREFIX = "pccltest"  # not the default prefix: a testbed someone brought up by hand is left alone
RATE_MBIT = 200


@pytest.fixture(scope="module")
def testbed() -> Iterator[TestbedConfig]:
    """Builds the testbed, and always removes it, whatever the test did."""
    with bring_up_testbed(TestbedConfig(nodes=2, rate=f"{RATE_MBIT}mbit", prefix=PREFIX)) as config:
        yield config


@pytest.mark.multiprocess
def test_up_is_idempotent_and_status_sees_shaped_links(testbed: TestbedConfig) -> None:
    assert net.up(testbed) is False  # already up as configured: left as it is
    found = net.status(PREFIX)
    assert found.up, found.problems
    assert [n.namespace for n in found.nodes] == ["pccltest-n0", "pccltest-n1"]
    assert [n.address for n in found.nodes] == ["10.77.0.1/24", "10.77.0.2/24"]
    for node in found.nodes:
        for line in (node.qdisc_out, node.qdisc_in):
            assert line is not None and "tbf" in line and "rate 200Mbit" in line
        assert node.congestion_control == found.congestion_control
    # The testbed's own cubic, not the host's default, unless namespaces may not set cubic and the host's list
    # cannot be changed here (then the host's, with one log line: test_congestion_control_refused_...).
    assert found.congestion_control == "cubic" or "cubic" not in (net.allowed_congestion_controls() or ["cubic"])


@pytest.mark.multiprocess
def test_hierarchical_collectives_across_namespaces(testbed: TestbedConfig, tmp_path) -> None:
    command = mpiexec_command(testbed, [sys.executable, str(HERE / "testbed_driver.py"), "4"], nprocs=4,
                              per_node=2)
    results = tmp_path / "ranks"
    results.mkdir()
    try:
        result = subprocess.run(command, cwd=ROOT, env={**run_environment(testbed), RESULT_DIR_ENV: str(results)},
                                capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(command)} did not finish in 300 s\nstdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    ranks = collect_ranks(result, 4, results, what="testbed_driver.py across namespaces").ranks
    assert [r["errors"] for r in ranks] == [[]] * 4
    assert [(r["node"], r["local_rank"], r["num_nodes"]) for r in ranks] == [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(lines[-1])
    assert report["errors"] == []
    # Nodes found from the namespaces (no PCCL_LOCAL_SIZE): ranks 0,1 in pccltest-n0, ranks 2,3 in n1.
    assert (report["num_nodes"], report["local_size"]) == (2, 2)
    assert [tuple(p[1:3]) for p in report["places"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    netns = [p[3] for p in report["places"]]
    assert netns[0] == netns[1] != netns[2] == netns[3]
    assert report["mpi_layout"]["nodes_share_netns"] is False
    # MPI between namespaces goes through the shaped links; inside a namespace it does not.
    assert report["inter_mbit"] <= 1.15 * RATE_MBIT, report
    assert 0.5 * RATE_MBIT <= report["inter_all_links_mbit"] <= 1.15 * RATE_MBIT, report  # both links at once
    assert report["intra_mbit"] >= 2 * RATE_MBIT, report
    # The links init() measured (pccl_torch.selection.links): rank 0's numbers on every rank, the shaped rate between
    # nodes, far faster inside one.
    links = report["links"]
    assert all(entry == links[0] for entry in links), links
    inter_mbit = links[0]["inter"]["bytes_per_s"] * 8e-6
    assert 0.5 * RATE_MBIT <= inter_mbit <= 1.2 * RATE_MBIT, links[0]
    assert links[0]["ratio"] >= 4 and links[0]["source"] in ("measured", "cache"), links[0]


@pytest.mark.multiprocess
def test_torchrun_across_namespaces(testbed: TestbedConfig, tmp_path) -> None:
    """One `torchrun --nnodes 2` per namespace, c10d rendezvous on node 0, no MPI: pccl finds the two nodes from
    torchrun's GROUP_RANK, and every algorithm (the hierarchical ones across the shaped link), DDP and FSDP2
    match gloo."""
    out = tmp_path / "torchrun.json"
    lines = torchrun_commands(testbed, [str(HERE / "launcher_driver.py"), "--json", str(out)], per_node=2)
    env = {k: v for k, v in run_environment(testbed).items() if k not in ("PCCL_ALGO", "PCCL_TRANSPORT")}
    agents = [subprocess.Popen(line, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for line in lines]
    try:
        logs = [agent.communicate(timeout=400)[0] for agent in agents]
    except subprocess.TimeoutExpired:
        for agent in agents:
            agent.kill()
        pytest.fail("torchrun across the testbed did not finish in 400 s")
    assert out.exists(), "\n".join(log[-3000:] for log in logs)
    report = json.loads(out.read_text())
    assert report["failures"] == [] and report["passed"] == 4
    for entry in report["ranks"]:
        assert entry["transport"] == {"torch:gloo": 1}
        assert entry["topology"] == [2, 2, 2]  # 2 nodes of 2, on 2 networked hosts
    assert sorted(entry["launcher"]["GROUP_RANK"] for entry in report["ranks"]) == ["0", "0", "1", "1"]


def _namespaces_or_skip() -> None:
    try:
        check_tools()
    except TestbedError as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")


@pytest.mark.multiprocess
def test_cubic_not_allowed_in_namespaces_is_allowed_while_up_sets_the_nodes() -> None:
    """A host whose net.ipv4.tcp_allowed_congestion_control lacks cubic (one machine of this kind: "reno bbr",
    where a namespace's write of cubic failed with "I/O error"): the nodes run cubic all the same, and the host's
    list is as it was. The list is set so here (root) and restored after."""
    _namespaces_or_skip()
    before = net.allowed_congestion_controls()
    if before is None or "cubic" not in net.available_congestion_controls():
        pytest.skip("this kernel does not list its allowed congestion controls, or has no cubic")
    without_cubic = [name for name in before if name != "cubic"]
    try:
        net.ALLOWED_CONGESTION.write_text(" ".join(without_cubic) + "\n")
    except OSError as exc:
        pytest.skip(f"the host's allowed list cannot be changed here ({exc.strerror}); "
                    "test_congestion_control_refused_leaves_the_nodes_on_the_host_s covers that case")
    config = TestbedConfig(nodes=2, prefix="pccltestc")
    try:
        assert net.up(config) is True
        found = net.status(config.prefix)
        assert found.up and found.congestion_control == "cubic", found.problems
        assert [node.congestion_control for node in found.nodes] == ["cubic", "cubic"]
        assert net.allowed_congestion_controls() == without_cubic  # restored once the nodes were set
    finally:
        down(config.prefix)
        net.ALLOWED_CONGESTION.write_text(" ".join(before) + "\n")
    assert net.allowed_congestion_controls() == before


@pytest.mark.multiprocess
def test_congestion_control_refused_leaves_the_nodes_on_the_host_s(monkeypatch, caplog) -> None:
    """Where namespaces may not set the configured control and the host's list cannot be changed (a container,
    a read-only /proc/sys), the testbed comes up on the host's control, says so in one log line, and is up."""
    _namespaces_or_skip()
    host = net.CONGESTION_SYSCTL.read_text().strip()
    wanted = next((name for name in net.available_congestion_controls() if name != host), None)
    if wanted is None:
        pytest.skip("this kernel has only the host's congestion control")
    monkeypatch.setattr(net, "allowed_congestion_controls", lambda: [host])

    def read_only(names: list[str]) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(net, "_write_allowed", read_only)
    config = TestbedConfig(nodes=2, prefix="pccltestc", congestion_control=wanted)
    try:
        with caplog.at_level("WARNING", logger=net.__name__):
            assert net.up(config) is True
        assert [r.getMessage() for r in caplog.records] == [
            f"pccl-testbed: the nodes run the host's TCP {host}, not {wanted} (net.ipv4.tcp_allowed_congestion_control "
            f"is {host!r} and cannot be changed here: Read-only file system)"]
        found = net.status(config.prefix)
        assert found.up and found.congestion_control == host, found.problems
        assert [node.congestion_control for node in found.nodes] == [host, host]
        assert net.up(config) is False  # up as configured, on the host's control
    finally:
        down(config.prefix)


@pytest.mark.multiprocess
def test_down_removes_everything() -> None:
    try:
        check_tools()
    except TestbedError as exc:
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    config = TestbedConfig(nodes=3, prefix="pccltestb")
    try:
        net.up(config)
    except TestbedError as exc:
        down(config.prefix)
        pytest.skip(f"network namespaces cannot be created here: {exc}")
    # A crashed `up`: namespaces without a state file are still found and removed.
    (config.state_dir / "config.json").unlink()
    assert not net.status(config.prefix).up
    removed = down(config.prefix)
    assert removed == ["pccltestb-hub", "pccltestb-n0", "pccltestb-n1", "pccltestb-n2"]
    assert net.namespaces(config.prefix) == [] and not config.state_dir.exists()
    assert not any(net.NETNS_ETC.glob("pccltestb-*"))
    assert down(config.prefix) == []  # nothing left: not an error


def _socket_rtt(config: TestbedConfig, port: int = 5299) -> dict:
    """Plain-TCP ping-pong from node 0 to node 1 (pccl_torch/testbed/sockets.py in the namespaces)."""
    def in_node(node: int, *args: str) -> list[str]:
        return [net.ip_path(), "netns", "exec", config.namespace(node), sys.executable, sockets.__file__, *args,
                "--port", str(port)]

    server = subprocess.Popen(in_node(1, "serve", "--count", "1"), stdout=subprocess.DEVNULL)
    try:
        done = subprocess.run(in_node(0, "rtt", config.address(1), "--count", "20"), capture_output=True, text=True,
                              timeout=60)
    finally:
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.multiprocess
@pytest.mark.parametrize("method,impl", [("relay", "c"), ("relay", "python"), ("netem", "auto")])
def test_delay_gives_the_round_trip_asked_and_down_leaves_nothing(method: str, impl: str) -> None:
    """`up --delay 4ms` (the round trip between two nodes): a plain TCP ping-pong between the namespaces takes at
    least 4 ms and not much more; with the relay (C and Python; this kernel has no netem), status shows it running,
    and `down` ends it: no namespace, no relay process, no state left. The netem case is skipped where the kernel
    lacks it, the C relay's where there is no C compiler."""
    _namespaces_or_skip()
    if method == "relay" and not Path("/dev/net/tun").exists():
        pytest.skip("no /dev/net/tun: TAP devices cannot be made here")
    config = TestbedConfig(nodes=2, rate="200mbit", delay="4ms", delay_method=method, relay_impl=impl,
                           prefix="pccltestd")
    try:
        try:
            net.up(config)
        except TestbedError as exc:
            if any(reason in str(exc) for reason in ("has no netem", "no C compiler", "Operation not permitted")):
                pytest.skip(f"cannot add delay by {method} here: {exc}")
            raise
        found = net.status(config.prefix)
        assert found.up and found.delay_method == method, found.problems
        assert net.up(config) is False  # up as configured, its relay running: left as it is
        pid = found.relay.pid if found.relay else None
        assert (found.relay.impl if found.relay else None) == (impl if method == "relay" else None), found.relay
        if method == "relay":  # root here: the relay runs in the real-time class, ahead of ranks that poll
            assert found.relay.scheduling == "real time", found.relay
        measured = _socket_rtt(config)
        assert measured["min_ms"] >= 4.0 and measured["rtt_ms"] <= 6.0, measured  # 4.2-4.4 ms on an idle machine
        if impl == "python":  # a crash lost the state and the hub's namespace: only its command line finds the relay
            shutil.rmtree(config.state_dir)
            subprocess.run([net.ip_path(), "netns", "delete", config.hub], check=True)
    finally:
        down(config.prefix)
    assert net.namespaces(config.prefix) == [] and not config.state_dir.exists()
    assert net.relay_pids(config.prefix) == [] and (pid is None or not net._alive(pid))
