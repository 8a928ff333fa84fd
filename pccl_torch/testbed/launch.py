"""Launching ranks into the testbed's namespaces: MPI ranks with MPICH's hydra, or one torchrun per node.

``mpiexec`` itself runs in node 0's namespace, with the nodes' addresses as its host list
(``-hosts 10.77.0.1:L,10.77.0.2:L,...``: blocks of L consecutive ranks per node). Hydra starts its proxy
on node 0 directly (the address is local there) and on every other node through its ssh launcher, whose
executable is the script :func:`write_launcher` makes (in the testbed's state directory, afresh for every
launch, so it always matches the configuration): hydra calls it as ``<script> -x <host> <command>``
and it runs the command in that host's namespace (``ip netns exec``), as ssh would on another machine.

Hydra's host list is MPICH's node map: ranks of different namespaces are on different nodes for MPI
(``MPI_COMM_TYPE_SHARED`` splits by namespace, so pccl's topology needs no ``PCCL_LOCAL_SIZE``), and
MPICH's shared-memory transport is used only inside a namespace. Between namespaces MPICH uses its
netmod; UCX, MPICH's default here, would still find the other namespace's ranks through shared memory
(same machine), so :func:`environment` restricts it to TCP on the node's link (``UCX_TLS=tcp,self``,
``UCX_NET_DEVICES=pccl0``; ``FI_PROVIDER=tcp``/``FI_TCP_IFACE`` for the OFI netmod), and that traffic
crosses the shaped links. torch.distributed's rendezvous and gloo use node 0's address and the node's
link (``MASTER_ADDR``, ``GLOO_SOCKET_IFNAME``).

:func:`torchrun_commands` launches as a multi-node torchrun job does instead: one ``torchrun --nnodes N`` in
each namespace, meeting at the c10d rendezvous on node 0's address; pccl then finds the nodes from torchrun's
``GROUP_RANK`` and runs its levels over gloo groups (``pccl_torch.launcher``).

:func:`run_released` runs a launch and then unlinks the MPI libraries' shared-memory files it left in
``/dev/shm`` (ranks killed before their library unlinked them); ``pccl-bench -np`` launches through it.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from collections.abc import Collection, Sequence
from pathlib import Path

from pccl_torch.testbed.net import NODE_IFACE, TestbedConfig, TestbedError, ip_path, load_config

LAUNCHER = "launcher"


def write_launcher(config: TestbedConfig) -> Path:
    """Write hydra's ssh-launcher stand-in for ``config`` (host address -> ``ip netns exec``)."""
    cases = "\n".join(f"  {config.address(k)}) ns={config.namespace(k)} ;;" for k in range(config.nodes))
    script = f"""#!/bin/sh
# pccl-testbed {config.prefix}: MPICH hydra's ssh launcher calls `<this> -x <host> <command words>`.
# Run the command in the host's network namespace, through a shell, as ssh would on the host.
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1
shift
case "$host" in
{cases}
  *) echo "pccl-testbed: host $host is not a node of testbed {config.prefix}" >&2; exit 255 ;;
esac
exec {ip_path()} netns exec "$ns" /bin/sh -c "$*"
"""
    path = config.state_dir / LAUNCHER
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return path


def environment(config: TestbedConfig) -> dict[str, str]:
    """Variables every rank needs so that inter-node traffic takes the node's shaped link."""
    return {
        "MPIR_CVAR_CH4_NETMOD": "ofi",
        "FI_PROVIDER": "tcp",
        "FI_TCP_IFACE": NODE_IFACE,
        "UCX_TLS": "tcp,self",
        "UCX_NET_DEVICES": NODE_IFACE,
        "GLOO_SOCKET_IFNAME": NODE_IFACE,
        "MASTER_ADDR": config.address(0),
    }


def layout(config: TestbedConfig, nprocs: int | None, per_node: int | None) -> tuple[int, int]:
    """(ranks, ranks per node) from what was given: ``-np`` alone spreads over every node; ``--ppn`` alone
    fills every node; both use ``nprocs / per_node`` nodes."""
    if nprocs is None and per_node is None:
        per_node = 1
    if nprocs is None:
        nprocs = per_node * config.nodes
    if per_node is None:
        if nprocs % config.nodes:
            raise TestbedError(f"{nprocs} ranks do not divide evenly over {config.nodes} nodes: give the ranks "
                               "per node too (--ppn / --local-size)")
        per_node = nprocs // config.nodes
    if nprocs < 1 or per_node < 1 or nprocs % per_node:
        raise TestbedError(f"{nprocs} ranks are not a whole number of nodes of {per_node} ranks")
    if nprocs // per_node > config.nodes:
        raise TestbedError(f"{nprocs} ranks at {per_node} per node need {nprocs // per_node} nodes; testbed "
                           f"{config.prefix} has {config.nodes} (pccl-testbed up --nodes {nprocs // per_node})")
    return nprocs, per_node


def default_mpiexec() -> str:
    """The mpiexec of this Python environment (the mpich wheel's), else the one on PATH."""
    candidate = Path(sys.prefix) / "bin" / "mpiexec"
    found = str(candidate) if candidate.exists() else shutil.which("mpiexec")
    if not found:
        raise TestbedError("no mpiexec found: install pccl-torch (it brings the mpich wheel's mpiexec)")
    return found


def mpiexec_command(config: TestbedConfig, command: list[str], *, nprocs: int | None = None,
                    per_node: int | None = None, mpiexec: str | None = None) -> list[str]:
    """The command line running ``command`` as ``nprocs`` ranks, ``per_node`` per namespace (blocks); writes
    hydra's launcher script for it (:func:`write_launcher`)."""
    nprocs, per_node = layout(config, nprocs, per_node)
    launcher = write_launcher(config)
    hosts = ",".join(f"{config.address(k)}:{per_node}" for k in range(nprocs // per_node))
    return [ip_path(), "netns", "exec", config.namespace(0), mpiexec or default_mpiexec(), "-hosts", hosts,
            "-launcher", "ssh", "-launcher-exec", str(launcher), "-n", str(nprocs), *command]


RENDEZVOUS_PORT = 29400
"""Port of torchrun's c10d rendezvous on node 0's address."""


def torchrun_commands(config: TestbedConfig, command: list[str], *, per_node: int, nodes: int | None = None,
                      port: int = RENDEZVOUS_PORT) -> list[list[str]]:
    """One ``torchrun --nnodes N --nproc-per-node per_node`` per node namespace, all meeting at the c10d
    rendezvous on node 0's address, each running ``command`` (a script and its arguments, or ``-m module ...``):
    a multi-node torchrun launch, with no MPI. Run them at once, with :func:`run_environment`."""
    nodes = config.nodes if nodes is None else nodes
    if not 1 <= nodes <= config.nodes or per_node < 1:
        raise TestbedError(f"{nodes} nodes of {per_node} ranks do not fit testbed {config.prefix} "
                           f"({config.nodes} nodes)")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
                str(per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{config.address(0)}:{port}",
                "--rdzv-id", f"pccl-testbed-{config.prefix}"]
    # --local-addr: each node's own address, which its workers then reach the elected master by (the machine's
    # host name, torchrun's default, resolves to the namespace's own address in every namespace).
    return [[ip_path(), "netns", "exec", config.namespace(k), *launcher, "--local-addr", config.address(k), *command]
            for k in range(nodes)]


def run_environment(config: TestbedConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the testbed's variables and without
    ``PCCL_LOCAL_SIZE``, so that pccl detects the nodes from the namespaces."""
    env = dict(os.environ if base is None else base)
    env.pop("PCCL_LOCAL_SIZE", None)
    env.update(environment(config))
    return env


def require(prefix: str) -> TestbedConfig:
    """The configuration of testbed ``prefix``; ``TestbedError`` when it is not up."""
    config = load_config(prefix)
    if config is None:
        raise TestbedError(f"testbed {prefix} is not up: pccl-testbed up --prefix {prefix} --nodes N --rate R")
    return config


SHM_DIR = Path("/dev/shm")
MPI_SEGMENTS = ("mpich_shm_*", "sm_segment.*", "vader_segment.*")
"""Names of the files in ``/dev/shm`` of the MPI libraries' shared-memory transports: MPICH's (4 MB a node) and
Open MPI 5's and 4's. The library unlinks them once every rank of the node has mapped them; a rank killed before
(a fault trial, a timeout, a crash at start) leaves them there until the machine reboots."""


def shm_in_use() -> set[str]:
    """Names of the ``/dev/shm`` files that a live process maps or holds open (as ``/proc`` shows them: every
    process of this user, every process for root)."""
    used = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            paths = [line.split(maxsplit=5)[-1] for line in (proc / "maps").read_text().splitlines()
                     if "/dev/shm/" in line]
            paths += [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone meanwhile, or another user's
            continue
        used.update(path.removeprefix(f"{SHM_DIR}/").removesuffix(" (deleted)") for path in paths
                    if path.startswith(f"{SHM_DIR}/"))
    return used


def shm_segments(patterns: Sequence[str] = MPI_SEGMENTS) -> set[str]:
    """Names of the files in ``/dev/shm`` that match one of ``patterns``."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return set()
    return {name for name in names if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)}


def release_segments(patterns: Sequence[str] = MPI_SEGMENTS, *, among: Collection[str] | None = None) -> list[str]:
    """Unlink the ``/dev/shm`` files matching ``patterns`` (and in ``among``, when given) that no live process
    maps or holds open: what killed ranks left. A file in use is never touched, so another job's, starting or
    running beside this one, keeps its segment: MPI always holds its file open or mapped until it unlinks it.
    Returns the names unlinked."""
    candidates = shm_segments(patterns)
    if among is not None:
        candidates &= set(among)
    if not candidates:
        return []
    released = []
    for name in sorted(candidates - shm_in_use()):
        try:
            (SHM_DIR / name).unlink()
        except OSError:  # gone meanwhile, or another user's
            continue
        released.append(name)
    return released


def run_released(command: Sequence[str], env: dict[str, str] | None = None) -> int:
    """Run ``command`` (a launch: ``mpiexec ...``) to its end; then unlink the MPI segments that appeared in
    ``/dev/shm`` meanwhile and no process uses any more (:func:`release_segments`). Its exit status."""
    before = shm_segments()
    try:
        return subprocess.run(list(command), env=env).returncode
    finally:
        release_segments(among=shm_segments() - before)
