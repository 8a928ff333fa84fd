"""Alpha-beta-gamma costs of every pccl algorithm, linear in the machine parameters.

A cost is a :class:`Terms`: a coefficient per parameter of :data:`~pccl_torch.sim.machine.PARAMS`
(``{"alpha_inter": 11, "beta_inter": 3.1e7, "gamma": ...}``), so the time on a machine is a dot product
and the parameters can be fitted to measurements by linear least squares (``fit.py``).

Formulas (Thakur, Rabenseifner and Gropp 2005; p ranks, n bytes of the full buffer, lg = log2):

- all-gather: ring ``(p-1) a + (p-1)/p n b``; recursive doubling ``lg p a + (p-1)/p n b``;
  Bruck ``ceil(lg p) a + (p-1)/p n b`` plus a local rotation of n bytes.
- reduce-scatter: ring and pairwise ``(p-1) a + (p-1)/p n (b + g)``; recursive halving
  ``lg p a + (p-1)/p n (b + g)``.
- all-reduce: ring ``2(p-1) a + 2(p-1)/p n b + (p-1)/p n g``; Rabenseifner (recursive-halving RS, then
  recursive-doubling AG) ``2 lg p a + 2(p-1)/p n b + (p-1)/p n g``; recursive doubling ``lg p (a + n b + n g)``.
- all-to-all (n = one rank's send buffer, p blocks of n/p, as nccl-tests' alltoall_perf): pairwise
  ``(p-1) a + (p-1)/p n b`` plus the copy of its own block (n/p) (step k sends block r+k to rank r+k and
  receives from r-k); Bruck ``ceil(lg p) a + sum_k c_k n/p b`` (step k at distance 2^k carries the ``c_k``
  blocks whose index has bit k set, about p/2) plus the rotations in and out (2n copied) and each step's pack
  and unpack. ``mpi`` is MPICH's choice (its built-in selection, MPICH 5.0): ``MPI_Alltoall`` runs Bruck at
  p >= 8 with blocks of at most 256 bytes, else ``scattered`` (every message posted at once, blocks up to
  32 KiB: priced as pairwise but for the wire's latency, paid once, :func:`a2a_scattered`) or ``pairwise``
  (``heuristic.mpich_all_to_all``); pccl's ``mpi`` calls ``MPI_Alltoall`` for equal blocks
  (``heuristic.MPI_A2A_VECTOR``). ``vendor`` (gloo's and NCCL's sends and receives, all posted at once) is priced
  as scattered on the vendor library's links. Hierarchical ``hier:<x>`` (P = N nodes x L): pack (copy
  n), an all-to-all among the node's L ranks on the whole buffer (blocks of n/L: every block for local rank j
  of any node goes to local rank j), regroup (copy n), an all-to-all among the N local-rank peers (blocks of
  n/N: one message per peer node, pairwise or MPI's). Each node sends L (N-1)/N n bytes off-node either way;
  the hierarchy sends them in N-1 messages per rank instead of P-1, and no on-node pair waits for an
  off-node one (a flat step lasts as long as its slowest pair).
- Non-powers of two (recursive doubling/halving): the first ``2(p - q)`` ranks (``q = 2^floor(lg p)``) fold
  in pairs and the power-of-two schedule runs on q virtual ranks over the whole buffer. AG adds a step with
  n/p bytes (the extra rank's block) and a step with n (the result back); RS adds a step with n bytes and
  a reduction of n, and a step returning n/p; AR recursive doubling adds two steps of n and a reduction of n.

Each step is priced on a :class:`Link` chosen by where its two ranks are (:class:`Net`): MPI inside a
node, MPI between nodes (with NIC sharing), the vendor library inside a node or across nodes. With uneven
virtual blocks after a fold, a step is priced with the mean block, not the largest.

An all-to-all step (rank r sends to r + k) is bounded by its slowest pair: when any pair crosses a node boundary
the whole step is priced on the ``far`` link, its bytes times the contention of the ``c`` ranks of each node that
cross at that step (``max(1, share * c / local)``, ``share`` being the contention when all ``local`` do), else on
the ``near`` link. MPICH's pairwise reduce-scatter crosses node links the same way. MPI's own all-reduce is priced
as MPICH runs it: halving from the nearest partner out (:func:`ar_rabenseifner_mpich`), and over several nodes of
several ranks through one leader a node (:func:`ar_mpich_smp`).

Facts of the machine, not fitted: ranks of one host sharing its cores (``host_cores``: the work in
:data:`HOST_PARAMS` takes :func:`contention` times as long, and a pipelined chunk waits for the cores' work of
every phase, :func:`pipelined_time`), and the vendor library (torch's gloo runs reduce-scatter as an all-reduce of
a copy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from pccl_torch.algorithms import COLLECTIVES, Collective
from pccl_torch.selection.heuristic import SMALL_ALL_REDUCE, flat_choice, mpich_all_to_all
from pccl_torch.plan import HIER_PREFIX, PIPELINED, hierarchical_inner, intra_library, valid_names
from pccl_torch.sim.machine import FIXED_PARAMS, PARAMS, MachineProfile


@dataclass(frozen=True, slots=True)
class Terms:
    """A cost as coefficients of the machine parameters (seconds = ``sum(coef[k] * profile.k)``)."""

    coef: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.coef) - set(PARAMS) - set(FIXED_PARAMS)
        if unknown:
            raise ValueError(f"unknown cost parameters {sorted(unknown)}; valid: {', '.join(PARAMS + FIXED_PARAMS)}")

    def __add__(self, other: "Terms") -> "Terms":
        out = dict(self.coef)
        for name, c in other.coef.items():
            out[name] = out.get(name, 0.0) + c
        return Terms(out)

    def __mul__(self, k: float) -> "Terms":
        return Terms({name: c * k for name, c in self.coef.items()})

    __rmul__ = __mul__

    def __getitem__(self, name: str) -> float:
        return self.coef.get(name, 0.0)

    def vector(self) -> np.ndarray:
        """Coefficients in :data:`PARAMS` order (a row of the fit's design matrix; the fixed parameters are not
        fitted)."""
        return np.array([self[name] for name in PARAMS])

    def time(self, profile: MachineProfile) -> float:
        """Seconds on ``profile``."""
        return sum(c * getattr(profile, name) for name, c in self.coef.items())

    def host(self) -> "Terms":
        """The part of this cost that the ranks' cores do (:data:`HOST_PARAMS`)."""
        return Terms({name: c for name, c in self.coef.items() if name in HOST_PARAMS})

    def contended(self, factor: float) -> "Terms":
        """This cost with its :meth:`host` part ``factor`` times as long (cores shared by more ranks)."""
        if factor == 1.0:
            return self
        return Terms({name: c * factor if name in HOST_PARAMS else c for name, c in self.coef.items()})


HOST_PARAMS: frozenset[str] = frozenset({"alpha_intra", "beta_intra", "alpha_vendor_intra", "beta_vendor_intra",
                                         "alpha_inter", "alpha_mpi_native", "gamma", "copy", "overhead"})
"""The parameters of work a rank's cores do: messages inside a node (shared-memory copies, or gloo's loopback
TCP), reductions, copies, the per-call dispatch, and the per-step latency of MPI messages between nodes: MPI's
waits poll, so a step ends when its rank next runs on a core, later the more ranks share one (gloo's waits sleep
in the kernel and wake at once: its step latency stays the network's). The others are the network's: bytes on
node links, and gloo's steps across them."""


def contention(ranks: int, host_cores: int) -> float:
    """How many times as long the cores' work takes when ``ranks`` ranks share ``host_cores`` cores (0: each rank
    has a core of its own, factor 1)."""
    return max(1.0, ranks / host_cores) if host_cores > 0 else 1.0


def _total(terms: Iterable[Terms]) -> Terms:
    out = Terms()
    for t in terms:
        out = out + t
    return out


# ---- where a step runs --------------------------------------------------------------------------------

WIRE_LATENCIES_PER_STEP = 2.0
"""One-way wire latencies (``link_latency``) a message step between nodes pays: a round trip. Measured on the
testbed at RTT 20 ms (2026-12-07, mpi4py in two namespaces): MPICH over libfabric's tcp provider (``ch4:ofi``,
``FI_PROVIDER=tcp``) completes a blocking send of 1 KiB or more when the receiver acknowledges it (20.6 ms; 8 bytes,
injected: 0.1 ms), so each exchange step of a schedule took 20.5-22.4 ms, not 10; gloo's ring steps the same (its
8-rank all-gather of 64 KiB: 7 steps, 147 ms). Priced at one latency a step, every small call was predicted at half
its time."""
WIRE_LATENCIES_POSTED = 1.2
"""One-way wire latencies a step between nodes pays in pccl's schedules that post their sends and wait for the
receive only (``Transport.sendrecv_posted``: all-gathers, reduce-scatter by recursive halving or pairwise); the call
pays the rest of a round trip at its end, for its last sends. Measured on the testbed at RTT 20.4 ms (2026-12-07,
2 ranks, ``benchmarks/results/latency-regime/fourth-pass/step-cost``): such a step of 4-32 KiB took 12.2-12.3 ms,
as on a raw TCP socket with ``TCP_NODELAY`` (12.3 ms), against 20.3-20.5 ms waiting for the send too."""


@dataclass(frozen=True, slots=True)
class Link:
    """The parameters one message step is priced with; ``share`` ranks contend for each NIC; ``wire``: the step
    crosses nodes and pays the wire's own latency (``link_latency``, :data:`WIRE_LATENCIES_PER_STEP` times)
    besides its library's ``alpha``."""

    alpha: str
    beta: str
    share: float = 1.0
    wire: bool = False
    wire_latencies: float = WIRE_LATENCIES_PER_STEP

    def step(self, nbytes: float) -> Terms:
        if self.wire:
            return Terms({self.alpha: 1.0, "link_latency": self.wire_latencies, self.beta: nbytes * self.share})
        return Terms({self.alpha: 1.0, self.beta: nbytes * self.share})


@dataclass(frozen=True, slots=True)
class Net:
    """The ranks one algorithm runs on: ``p`` ranks, ``local`` consecutive ones per node.

    A step between partners at ring distance ``d`` is on the node when ``d < local`` (exact for the
    power-of-two partners of recursive doubling/halving when ``local`` is a power of two; an
    approximation otherwise), else it crosses nodes with every local rank sending at once (``far``).
    A ring step (distance ``None``) across nodes is one stream per node boundary (``ring``).
    """

    p: int
    local: int
    near: Link
    far: Link
    ring: Link

    def link(self, distance: int | None) -> Link:
        if self.p <= self.local:
            return self.near
        if distance is None:
            return self.ring
        distance %= self.p
        return self.near if min(distance, self.p - distance) < self.local else self.far

    def step(self, distance: int | None, nbytes: float) -> Terms:
        return self.link(distance).step(nbytes)

    def native(self) -> "Net":
        """The same links priced with the MPI library's own per-step latency (the ``mpi`` algorithm)."""
        def swap(link: Link) -> Link:
            return replace(link, alpha="alpha_mpi_native")
        return replace(self, near=swap(self.near), far=swap(self.far), ring=swap(self.ring))


def nic_share(local_size: int, nics_per_node: int) -> float:
    """How many ranks share one NIC when all ``local_size`` ranks of a node send off-node (>= 1)."""
    return max(1.0, local_size / nics_per_node)


_MPI_INTRA = Link("alpha_intra", "beta_intra")
_VENDOR_INTRA = Link("alpha_vendor_intra", "beta_vendor_intra")


def flat_net(nodes: int, local_size: int, nics_per_node: int) -> Net:
    """All ranks over MPI point-to-point (the flat family)."""
    far = Link("alpha_inter", "beta_inter", nic_share(local_size, nics_per_node), wire=True)
    return Net(nodes * local_size, local_size, _MPI_INTRA, far, Link("alpha_inter", "beta_inter", wire=True))


def inter_net(nodes: int, local_size: int, nics_per_node: int) -> Net:
    """One rank per node (the hierarchical inter phase); all local ranks' phases run at once."""
    far = Link("alpha_inter", "beta_inter", nic_share(local_size, nics_per_node), wire=True)
    return Net(nodes, 1, far, far, far)


def vendor_intra_net(local_size: int) -> Net:
    """The vendor library among the ranks of one node."""
    return Net(local_size, local_size, _VENDOR_INTRA, _VENDOR_INTRA, _VENDOR_INTRA)


def vendor_flat_net(nodes: int, local_size: int) -> Net:
    """The vendor library over all ranks: a ring striped over every NIC (``beta_vendor_inter``, the node's
    aggregate bandwidth, one stream per node boundary). When every local rank sends off the node at once (an
    all-to-all step), their ``local_size`` streams share that aggregate bandwidth (``far``)."""
    ring = Link("alpha_vendor_step", "beta_vendor_inter", wire=True)
    return Net(nodes * local_size, local_size, _VENDOR_INTRA, replace(ring, share=float(local_size)), ring)


# ---- the algorithm family ------------------------------------------------------------------------------

Formula = Callable[[Net, float], Terms]


def _reduce(nbytes: float) -> Terms:
    return Terms({"gamma": nbytes})


def _copy(nbytes: float) -> Terms:
    return Terms({"copy": nbytes})


def _pof2(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def _doubling(q: int) -> list[int]:
    """Partner distances 1, 2, 4, ..., q/2 of recursive doubling on q (a power of two) ranks."""
    return [1 << k for k in range(q.bit_length() - 1)]


def _posting(formula: Formula) -> Formula:
    """``formula`` for a schedule that posts its sends: over pccl's own point-to-point links between nodes
    (``alpha_inter``; not MPI's native collectives or the vendor library, priced with the same formulas) each step
    pays :data:`WIRE_LATENCIES_POSTED`, the call the rest of one round trip at its end."""
    @functools.wraps(formula)
    def posted(net: Net, n: float) -> Terms:
        if net.p <= net.local or net.far.alpha != "alpha_inter":
            return formula(net, n)
        links = {name: replace(link, wire_latencies=WIRE_LATENCIES_POSTED) if link.alpha == "alpha_inter" else link
                 for name, link in (("near", net.near), ("far", net.far), ("ring", net.ring))}
        return formula(replace(net, **links), n) + Terms(
            {"link_latency": WIRE_LATENCIES_PER_STEP - WIRE_LATENCIES_POSTED})
    return posted


@_posting
def ag_ring(net: Net, n: float) -> Terms:
    """All-gather ring: ``(p-1)`` neighbour steps of one block ``n/p``."""
    return net.step(None, n / net.p) * (net.p - 1)


@_posting
def ag_recursive_doubling(net: Net, n: float) -> Terms:
    """All-gather recursive doubling: step k exchanges ``2^k`` blocks with the partner at distance ``2^k``."""
    p, q = net.p, _pof2(net.p)
    cost = _total(net.step(d, d * n / q) for d in _doubling(q))
    if q < p:  # fold: the extra rank sends its block, then receives the whole result
        cost = cost + net.step(1, n / p) + net.step(1, n)
    return cost


@_posting
def ag_bruck(net: Net, n: float) -> Terms:
    """All-gather Bruck: ``ceil(lg p)`` steps at distance ``2^k`` of ``min(2^k, p-2^k)`` blocks, then a
    rotation of the whole buffer into rank order."""
    p = net.p
    if p == 1:
        return Terms()
    dists = [1 << k for k in range((p - 1).bit_length())]
    return _total(net.step(d, min(d, p - d) * n / p) for d in dists) + _copy(n)


def rs_ring(net: Net, n: float) -> Terms:
    """Reduce-scatter ring: ``(p-1)`` neighbour steps of one block, each followed by its reduction."""
    return (net.step(None, n / net.p) + _reduce(n / net.p)) * (net.p - 1)


@_posting
def rs_recursive_halving(net: Net, n: float) -> Terms:
    """Reduce-scatter recursive halving: step k sends (and reduces) half of what is left to the partner at
    distance ``q/2^(k+1)``."""
    p, q = net.p, _pof2(net.p)
    cost = _total(net.step(d, d * n / q) + _reduce(d * n / q) for d in _doubling(q))
    if q < p:  # fold: the extra rank's whole buffer in (and reduced), its block back out
        cost = cost + net.step(1, n) + _reduce(n) + net.step(1, n / p)
    return cost


@_posting
def rs_pairwise(net: Net, n: float) -> Terms:
    """Reduce-scatter pairwise: at step k send block ``r+k`` to rank ``r+k``, reduce the block from ``r-k``; the
    steps cross node links as an all-to-all's do (:func:`_a2a_step`)."""
    p = net.p
    return _total(_a2a_step(net, k, n / p) for k in range(1, p)) + _reduce(n / p) * (p - 1)


def ar_ring(net: Net, n: float) -> Terms:
    """All-reduce ring: ring reduce-scatter then ring all-gather."""
    return rs_ring(net, n) + ag_ring(net, n)


def ar_rabenseifner(net: Net, n: float) -> Terms:
    """All-reduce Rabenseifner: recursive-halving reduce-scatter then recursive-doubling all-gather."""
    return rs_recursive_halving(net, n) + ag_recursive_doubling(net, n)


def ar_rabenseifner_mpich(net: Net, n: float) -> Terms:
    """All-reduce as MPICH's reduce-scatter + all-gather runs it: the reduce-scatter halves the buffer from the
    nearest partner out (distance ``d`` carries ``n / 2d``: the largest exchanges stay inside a node when ranks
    are placed by node), the all-gather mirrors it; non-powers of two fold the extra ranks in and out."""
    p, q = net.p, _pof2(net.p)
    cost = _total((net.step(d, n / (2 * d)) * 2 + _reduce(n / (2 * d))) for d in _doubling(q))
    if q < p:
        cost = cost + net.step(1, n) + _reduce(n) + net.step(1, n)
    return cost


def ar_mpich_smp(net: Net, n: float) -> Terms:
    """All-reduce as MPICH composes it over several nodes of several ranks: reduce to each node's first rank
    (reduce-scatter, then gather), all-reduce among those leaders (:func:`ar_rabenseifner_mpich`, one rank a node
    on the node's link), broadcast inside the node (scatter, then all-gather). On 3 testbed nodes its fold sends
    whole buffers between leaders (16 MiB: 2.5 s where gloo's ring took 1.3 s)."""
    local, nodes = net.local, net.p // net.local
    intra = Net(local, local, net.near, net.near, net.near)
    alone = replace(net.far, share=1.0)
    leaders = Net(nodes, 1, alone, alone, alone)
    gather = intra.step(1, n / local) * (local - 1)  # also the broadcast's scatter
    return (rs_recursive_halving(intra, n) + gather + ar_rabenseifner_mpich(leaders, n) + gather
            + ag_ring(intra, n))


def ar_recursive_doubling(net: Net, n: float) -> Terms:
    """All-reduce recursive doubling: ``lg p`` steps exchanging and reducing the whole buffer."""
    p, q = net.p, _pof2(net.p)
    cost = _total(net.step(d, n) + _reduce(n) for d in _doubling(q))
    if q < p:  # fold: the extra rank's buffer in (and reduced), the result back
        cost = cost + net.step(1, n) + _reduce(n) + net.step(1, n)
    return cost


def _a2a_crossing(net: Net, k: int) -> int:
    """How many of a node's ``net.local`` ranks send to another node at all-to-all step ``k`` (rank r sends to
    r + k): with ``k = q local + s``, the last ``s`` local ranks when q = 0, the first ``local - s`` when
    q = nodes - 1, all of them in between (none on one node)."""
    nodes = net.p // net.local
    if nodes <= 1:
        return 0
    q, s = divmod(k % net.p, net.local)
    if q == 0:
        return s
    return net.local - s if q == nodes - 1 else net.local


def _a2a_step(net: Net, k: int, nbytes: float) -> Terms:
    """One all-to-all step at distance ``k``, ``nbytes`` per rank: bounded by its slowest pair, on the ``far``
    link with the contention of the ranks that cross as soon as one pair crosses nodes."""
    crossing = _a2a_crossing(net, k)
    if not crossing:
        return net.near.step(nbytes)
    far = net.far
    return replace(far, share=max(1.0, far.share * crossing / net.local)).step(nbytes)


def a2a_pairwise(net: Net, n: float) -> Terms:
    """All-to-all pairwise: copy the own block, then at step k (1..p-1) send block ``r+k`` to rank ``r+k`` and
    receive block ``r`` of rank ``r-k``, each step one block ``n/p``."""
    return _copy(n / net.p) + _total(_a2a_step(net, k, n / net.p) for k in range(1, net.p))


def a2a_bruck(net: Net, n: float) -> Terms:
    """All-to-all Bruck: rotate the blocks (copy n), then at step k send to rank ``r + 2^k`` the blocks whose
    index has bit k set (packed and unpacked: copied twice), then rotate back (copy n)."""
    p = net.p
    if p == 1:
        return Terms()
    cost = _copy(2 * n)
    for k in range((p - 1).bit_length()):
        blocks = sum(1 for j in range(1, p) if j >> k & 1)
        cost = cost + _a2a_step(net, 1 << k, blocks * n / p) + _copy(2 * blocks * n / p)
    return cost


def a2a_scattered(net: Net, n: float) -> Terms:
    """All-to-all with every message posted at once (MPICH's scattered, gloo's and NCCL's grouped sends): each
    block's bytes and each message's cost as pairwise, the wire's latency once, since the messages are in flight
    together (RTT 20 ms, 4 x 2 testbed: 64 KiB in 22-24 ms over MPICH's ``MPI_Alltoallv`` and gloo, one round
    trip, where 7 steps in turn would take 7)."""
    pairwise = a2a_pairwise(net, n)
    if not pairwise["link_latency"]:
        return pairwise
    return Terms({**pairwise.coef, "link_latency": WIRE_LATENCIES_PER_STEP})


FAMILY: dict[Collective, dict[str, Formula]] = {
    "all_gather": {"ring": ag_ring, "recursive_doubling": ag_recursive_doubling, "bruck": ag_bruck},
    "reduce_scatter": {"ring": rs_ring, "recursive_halving": rs_recursive_halving, "pairwise": rs_pairwise},
    "all_reduce": {"ring": ar_ring, "rabenseifner": ar_rabenseifner, "recursive_doubling": ar_recursive_doubling},
    "all_to_all": {"pairwise": a2a_pairwise},  # type: ignore[dict-item]
}
"""The hand-written schedules of each collective (the names of ``pccl_torch.plan.family``)."""

def vendor_rs_ring(net: Net, n: float) -> Terms:
    """The vendor library's ring reduce-scatter: ``(p-1)`` neighbour steps of one block, each step's reduction
    hidden behind the transfers. gloo's ring keeps two segments of a block in flight and reduces one while the
    other moves (``gloo/allreduce.cc``, ``ring``); NCCL and RCCL reduce inside the kernel that copies the data.
    The reduction runs faster than any link it overlaps (``reduce_GBps`` against ``bw_*``), so the steps'
    transfers are the cost."""
    return net.step(None, n / net.p) * (net.p - 1)


def vendor_ar_ring(net: Net, n: float) -> Terms:
    """The vendor library's ring all-reduce: :func:`vendor_rs_ring` then the ring all-gather."""
    return vendor_rs_ring(net, n) + ag_ring(net, n)


VENDOR: dict[Collective, Formula] = {"all_gather": ag_ring, "reduce_scatter": vendor_rs_ring,
                                     "all_reduce": vendor_ar_ring, "all_to_all": a2a_scattered}  # type: ignore[dict-item]
"""What NCCL/RCCL (and gloo) run: rings (for all-reduce too, although NCCL also has trees), their reductions
overlapped with the transfers; for all-to-all, every send and receive of the rank posted at once, priced as the
pairwise steps on the vendor library's links."""


NCCL_TREE_BUS_EFFICIENCY = 0.9
"""The share of the links' bandwidth NCCL's tuning model gives its tree (``busBw * .9``, ``src/graph/tuning.cc``)."""


def vendor_tree_all_reduce(nodes: int, local_size: int, n: float) -> Terms:
    """NCCL's (and RCCL's) tree all-reduce over ``nodes`` nodes of ``local_size`` ranks, as NCCL's own tuning model
    prices it (``ncclTopoTuneModel``, ``src/graph/tuning.cc``): a chain through the node's ranks and a double
    binary tree over the nodes, reduced up then broadcast down: latency ``2 ((L-1) a_intra + floor(lg N) a_step)``;
    each node's links carry the buffer up and down (its algorithm bandwidth half the bus bandwidth) at
    :data:`NCCL_TREE_BUS_EFFICIENCY` of their speed. NCCL runs it where it beats the ring (small and middle
    sizes across many nodes): :func:`predict` takes the faster of the two on ``cuda`` machines. Not in the
    linear :func:`terms` (a minimum of two costs is not linear in the parameters)."""
    steps = 2.0 * (nodes.bit_length() - 1)  # across nodes: each pays the wire's latency too
    return Terms({"alpha_vendor_intra": 2.0 * (local_size - 1), "alpha_vendor_step": steps,
                  "link_latency": WIRE_LATENCIES_PER_STEP * steps,
                  "beta_vendor_inter": 2.0 * n / NCCL_TREE_BUS_EFFICIENCY})


def _mpi_native(collective: Collective, net: Net, n: float) -> Terms:
    """The MPI library's own collective: MPICH's choice of schedule (``heuristic.flat_choice``;
    :func:`mpich_all_to_all` for all-to-all) priced with ``alpha_mpi_native`` per step and the MPI point-to-point
    bandwidths."""
    if collective == "all_to_all":
        formula = {"bruck": a2a_bruck, "scattered": a2a_scattered, "pairwise": a2a_pairwise}
        return formula[mpich_all_to_all(n / net.p, net.p)](net.native(), n)
    if collective == "all_reduce" and n >= SMALL_ALL_REDUCE:  # MPICH's choice from 2 KiB, whatever p
        nodes = net.p // net.local
        if nodes > 1 and net.local > 1:
            return ar_mpich_smp(net.native(), n)
        return ar_rabenseifner_mpich(net.native(), n)
    return FAMILY[collective][flat_choice(collective, int(n), net.p)](net.native(), n)


# ---- names, compositions, predictions ------------------------------------------------------------------

def _check(collective: str) -> Collective:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    return collective  # type: ignore[return-value]


def algorithms(collective: str) -> list[str]:
    """Every algorithm name of ``collective``, as ``pccl_torch.algorithms(collective)`` lists them."""
    return valid_names(_check(collective))


def mpi_intra_net(local_size: int) -> Net:
    """MPI among the ranks of one node (its shared-memory communicator)."""
    return Net(local_size, local_size, _MPI_INTRA, _MPI_INTRA, _MPI_INTRA)


CPU_VENDOR_LIBRARIES = frozenset({"gloo"})
"""Vendor libraries of machines whose ranks hold CPU tensors: there pccl's ``hier:`` runs MPI inside the node."""


def split_hierarchical(algorithm: str, vendor_library: str = "nccl", device: str = "cpu") -> tuple[str, str] | None:
    """``(intra, inner)`` of a hierarchical name: intra is ``mpi`` or ``vendor``; None for a flat name.

    ``hier-<library>:`` names its library. ``hier:`` runs the device's default inside the node, as
    ``Communicator.intra`` picks it: the vendor library on GPU machines (NCCL, RCCL), MPI's shared memory on CPU
    machines (whose vendor library, :data:`CPU_VENDOR_LIBRARIES`, is gloo). ``hier:pipelined`` runs the vendor
    library inside on a ``cuda`` machine (``MachineProfile.device``), as ``plan.Plan`` runs it for CUDA tensors,
    and MPI inside on a ``cpu`` one (profiles without a device: as priced before pipelines ran NCCL inside)."""
    head, sep, inner = algorithm.partition(":")
    if not sep or not head.startswith("hier"):
        return None
    library = intra_library(algorithm)
    if library is None:
        library = "mpi" if vendor_library in CPU_VENDOR_LIBRARIES or (inner == PIPELINED and device != "cuda") \
            else "vendor"
    return ("mpi" if library == "mpi" else "vendor"), inner


def hierarchical_phases(collective: str, inner: str, nbytes: float, nodes: int, local_size: int,
                        nics_per_node: int, intra: str = "vendor") -> list[tuple[str, Terms]]:
    """The phases of ``hier:<inner>`` in the order they run, as (label, cost) pairs; ``intra`` is the
    library inside the node (``vendor``: a ring; ``mpi``: MPI's own collective on its shared memory).

    AG: inter AG among the N local-rank peers on n/L bytes, intra AG on n, unpack (copy n).
    RS: pack (copy n), intra RS on n, inter RS on n/L. AR: intra RS on n, inter AR on n/L, intra AG on n.
    All-to-all (n = one rank's buffer): pack (copy n), intra all-to-all on n (blocks of n/L), regroup (copy n),
    inter all-to-all among the N peers on n (blocks of n/N); one rank a node: the inter phase alone.
    ``pipelined`` is priced as its unpipelined phases (MPI on both levels); :func:`predict` overlaps them.
    """
    collective = _check(collective)
    if inner not in hierarchical_inner(collective) or intra not in ("vendor", "mpi"):
        raise ValueError(f"unknown {collective} algorithm {HIER_PREFIX + inner!r} with {intra!r} inside nodes; "
                         f"valid: {', '.join(algorithms(collective))}")
    if collective == "all_to_all":
        return _a2a_phases(inner, nbytes, nodes, local_size, nics_per_node, intra)
    net, shard = inter_net(nodes, local_size, nics_per_node), nbytes / local_size
    if inner in ("mpi", PIPELINED):
        inter = ("inter mpi", _mpi_native(collective, net, shard))
    else:
        inter = (f"inter {inner}", FAMILY[collective][inner](net, shard))
    if intra == "mpi":
        local = mpi_intra_net(local_size)
        ag = ("intra mpi all_gather", _mpi_native("all_gather", local, nbytes))
        rs = ("intra mpi reduce_scatter", _mpi_native("reduce_scatter", local, nbytes))
    else:
        local = vendor_intra_net(local_size)
        ag = ("intra vendor all_gather", ag_ring(local, nbytes))
        rs = ("intra vendor reduce_scatter", vendor_rs_ring(local, nbytes))
    if collective == "all_gather":
        return [inter, ag, ("unpack", _copy(nbytes))]
    if collective == "reduce_scatter":
        return [("pack", _copy(nbytes)), rs, inter]
    return [rs, inter, ag]


def _a2a_phases(inner: str, nbytes: float, nodes: int, local_size: int, nics_per_node: int,
                intra: str) -> list[tuple[str, Terms]]:
    """``hier:<inner>`` all-to-all as ``algorithms/hierarchical.py`` runs it: pack (copy n: blocks regrouped from
    (node, local rank) to (local rank, node)); among the node's L ranks, local rank l sends local rank j the
    blocks of local rank j of every node (n/L each, (L-1)/L n leave the rank); regroup (copy n: (local rank, node)
    to (node, local rank)); among the N local-rank peers, one message of n/N per peer node ((N-1)/N n cross, the
    L ranks of a node at once on its NICs), received straight into the output. One rank a node: the inter
    phase alone."""
    net = inter_net(nodes, local_size, nics_per_node)
    if inner in ("mpi", PIPELINED):
        inter = ("inter mpi", _mpi_native("all_to_all", net, nbytes))
    else:
        inter = (f"inter {inner}", FAMILY["all_to_all"][inner](net, nbytes))  # type: ignore[index]
    if local_size == 1:
        return [inter]
    if intra == "mpi":
        local = ("intra mpi all_to_all", _mpi_native("all_to_all", mpi_intra_net(local_size), nbytes))
    else:
        local = ("intra vendor all_to_all", a2a_pairwise(vendor_intra_net(local_size), nbytes))
    return [("pack", _copy(nbytes)), local, ("regroup", _copy(nbytes)), inter]


def terms(collective: str, algorithm: str, nbytes: float, nodes: int, local_size: int,
          nics_per_node: int, *, host_cores: int = 0, vendor_library: str = "nccl", device: str = "cpu") -> Terms:
    """The cost of one call of ``algorithm`` on a full buffer of ``nbytes`` (all-to-all: one rank's send buffer)
    over ``nodes`` x ``local_size`` ranks, including the per-call ``overhead`` (``pipelined``: unoverlapped, see
    :func:`predict`); the cores' work is :func:`contention` times as long when the ranks share ``host_cores``
    cores. ``vendor`` is ``vendor_library``'s schedule (gloo's reduce-scatter: an all-reduce of a copy); ``device``
    is where the ranks' tensors live (:func:`split_hierarchical`)."""
    collective = _check(collective)
    if nodes < 1 or local_size < 1 or nics_per_node < 1:
        raise ValueError(f"nodes, local_size and nics_per_node must be >= 1, got {nodes}, {local_size}, "
                         f"{nics_per_node}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    factor = contention(nodes * local_size, host_cores)
    return (Terms({"overhead": 1.0}) + _schedule(collective, algorithm, nbytes, nodes, local_size, nics_per_node,
                                                 vendor_library, device)).contended(factor)


def profile_terms(collective: str, algorithm: str, nbytes: float, nodes: int, local_size: int,
                  profile: MachineProfile) -> Terms:
    """:func:`terms` on ``profile``'s machine: its NICs a node, shared cores, vendor library and device."""
    return terms(collective, algorithm, nbytes, nodes, local_size, profile.nics_per_node,
                 host_cores=profile.host_cores, vendor_library=profile.vendor_library, device=profile.device)


def _schedule(collective: Collective, algorithm: str, nbytes: float, nodes: int, local_size: int,
              nics_per_node: int, vendor_library: str, device: str = "cpu") -> Terms:
    """The uncontended cost of ``algorithm``'s schedule, without the per-call overhead."""
    hier = split_hierarchical(algorithm, vendor_library, device)
    if hier is not None and algorithm in algorithms(collective):
        phases = hierarchical_phases(collective, hier[1], nbytes, nodes, local_size, nics_per_node, hier[0])
        return _total(cost for _, cost in phases)
    if algorithm == "vendor":
        net = vendor_flat_net(nodes, local_size)
        if collective == "reduce_scatter" and vendor_library == "gloo":
            # torch's ProcessGroupGloo: clone the input, all-reduce it, copy this rank's block out
            return _copy(nbytes) + VENDOR["all_reduce"](net, nbytes) + _copy(nbytes / net.p)
        return VENDOR[collective](net, nbytes)
    flat = flat_net(nodes, local_size, nics_per_node)
    if algorithm == "mpi":
        return _mpi_native(collective, flat, nbytes)
    if algorithm in FAMILY[collective]:
        return FAMILY[collective][algorithm](flat, nbytes)
    raise ValueError(f"unknown {collective} algorithm {algorithm!r}; valid: {', '.join(algorithms(collective))}")


def pipelined_time(collective: str, nbytes: float, nodes: int, local_size: int, profile: MachineProfile,
                   chunks: int, algorithm: str = HIER_PREFIX + PIPELINED) -> float:
    """Seconds of ``algorithm`` (``hier:pipelined`` or ``hier-mpi:pipelined``: the library inside the node, by
    :func:`split_hierarchical`) in ``chunks`` chunks: each phase of one chunk costs ``t_s`` (its latency
    plus 1/chunks of its bytes), the first chunk passes every phase and each further one adds what bounds a
    chunk: the slowest phase, or the cores' work of every phase (a rank's phases share its cores; on a shared
    host, every rank's): ``sum_s t_s + (chunks - 1) max(max_s t_s, sum_s host_s)``; and each phase of each chunk
    its ``chunk_overhead`` of the cores' work, contended like the rest of it."""
    factor = contention(nodes * local_size, profile.host_cores)
    intra, _ = split_hierarchical(algorithm, profile.vendor_library, profile.device) or ("mpi", PIPELINED)
    phases = [cost.contended(factor) for _, cost in
              hierarchical_phases(collective, PIPELINED, nbytes / chunks, nodes, local_size, profile.nics_per_node,
                                  intra)]
    times = [cost.time(profile) for cost in phases]
    host = sum(cost.host().time(profile) for cost in phases)
    return (profile.overhead * factor + sum(times) + (chunks - 1) * max(max(times), host)
            + chunks * len(phases) * profile.chunk_overhead * factor)


MAX_CHUNKS = 32
"""Most chunks a ``hier:pipelined`` call is cut into."""
MIN_CHUNK_BYTES = 256 * 1024
"""Smallest chunk (of the full buffer) the cost model considers."""


def max_chunks(nbytes: int) -> int:
    """Most chunks of a pipelined call on a full buffer of ``nbytes`` bytes: :data:`MAX_CHUNKS`, no chunk below
    :data:`MIN_CHUNK_BYTES` (at least 1)."""
    return max(1, min(MAX_CHUNKS, nbytes // MIN_CHUNK_BYTES))


def best_chunks(collective: str, nbytes: int, nodes: int, local_size: int, profile: MachineProfile,
                algorithm: str = HIER_PREFIX + PIPELINED) -> int:
    """The chunk count of least :func:`pipelined_time` among the powers of two up to :func:`max_chunks`."""
    counts = [1 << k for k in range(max_chunks(nbytes).bit_length())]
    return min(counts, key=lambda k: pipelined_time(collective, nbytes, nodes, local_size, profile, k, algorithm))


def predict(collective: str, algorithm: str, nbytes: float, nodes: int, local_size: int,
            profile: MachineProfile) -> float:
    """Predicted seconds of one call on ``profile`` (``hier:pipelined`` in its :func:`best_chunks`; on a ``cuda``
    machine across nodes, the vendor all-reduce as the faster of its ring and :func:`vendor_tree_all_reduce`)."""
    if algorithm.endswith(":" + PIPELINED):
        chunks = best_chunks(collective, int(nbytes), nodes, local_size, profile, algorithm)
        return pipelined_time(collective, nbytes, nodes, local_size, profile, chunks, algorithm)
    seconds = profile_terms(collective, algorithm, nbytes, nodes, local_size, profile).time(profile)
    if algorithm == "vendor" and collective == "all_reduce" and profile.device == "cuda" and nodes > 1:
        factor = contention(nodes * local_size, profile.host_cores)
        tree = (Terms({"overhead": 1.0}) + vendor_tree_all_reduce(nodes, local_size, nbytes)).contended(factor)
        seconds = min(seconds, tree.time(profile))
    return seconds


def best(collective: str, nbytes: float, nodes: int, local_size: int, profile: MachineProfile,
         candidates: list[str] | None = None) -> tuple[str, float]:
    """The fastest of ``candidates`` (default: every algorithm) and its predicted seconds."""
    names = candidates if candidates is not None else algorithms(collective)
    if not names:
        raise ValueError("no candidate algorithms")
    times = {name: predict(collective, name, nbytes, nodes, local_size, profile) for name in names}
    name = min(times, key=times.__getitem__)
    return name, times[name]
