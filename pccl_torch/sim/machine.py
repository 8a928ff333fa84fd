"""Machine profiles: the alpha-beta-gamma parameters of one machine, and their YAML form.

Inside the library every parameter is in SI units (seconds, seconds per byte), so a cost is a plain
dot product (``costs.Terms.time``). The YAML files in ``configs/machines/`` use the units people quote:
latencies in microseconds (``*_us``) and bandwidths in GB/s = 1e9 bytes per second (``*_GBps``,
bytes, not bits: a 200 Gb/s Slingshot NIC is 25 GBps). A bandwidth of ``.inf`` is a beta of 0.
Every number should carry its source, as a YAML comment and in the ``sources`` mapping (the comments
are lost when a profile is saved; the mapping is kept).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


MACHINES_DIR_ENV = "PCCL_MACHINES_DIR"

PARAMS: tuple[str, ...] = (
    "alpha_intra", "beta_intra", "alpha_inter", "beta_inter",
    "alpha_vendor_intra", "beta_vendor_intra", "alpha_vendor_step", "beta_vendor_inter",
    "alpha_mpi_native", "gamma", "copy", "overhead",
)
"""The fitted parameters, in the order of the fit's design matrix (every cost is linear in these)."""

VENDOR_LIBRARIES: tuple[str, ...] = ("nccl", "rccl", "gloo")
"""The flat libraries the model knows how ``vendor`` runs."""

DEVICES: tuple[str, ...] = ("cpu", "cuda")
"""The device types a profile's ranks hold tensors on, as torch names them (ROCm GPUs are ``cuda`` too)."""

TOPOLOGY_KEYS: tuple[str, ...] = ("host_cores", "vendor_library", "device")
"""Optional YAML keys (facts of the machine, not fitted); a profile that leaves them out gets the defaults of
:class:`MachineProfile`'s fields."""

# parameter -> (YAML key, unit): "us" stores seconds as microseconds, "GBps" stores s/byte as GB/s.
_YAML_KEYS: dict[str, tuple[str, str]] = {
    "alpha_intra": ("alpha_intra_us", "us"),
    "beta_intra": ("bw_intra_GBps", "GBps"),
    "alpha_inter": ("alpha_inter_us", "us"),
    "beta_inter": ("bw_inter_GBps", "GBps"),
    "alpha_vendor_intra": ("alpha_vendor_intra_us", "us"),
    "beta_vendor_intra": ("bw_vendor_intra_GBps", "GBps"),
    "alpha_vendor_step": ("alpha_vendor_step_us", "us"),
    "beta_vendor_inter": ("bw_vendor_inter_GBps", "GBps"),
    "alpha_mpi_native": ("alpha_mpi_native_us", "us"),
    "gamma": ("reduce_GBps", "GBps"),
    "copy": ("copy_GBps", "GBps"),
    "overhead": ("overhead_us", "us"),
}
# Fitted like the above but optional in YAML (0 when left out: profiles written before it existed load unchanged).
_OPTIONAL_YAML_KEYS: dict[str, tuple[str, str]] = {"chunk_overhead": ("chunk_overhead_us", "us")}
# Never fitted, optional in YAML (0 when left out): facts of the network given to the model.
_FIXED_YAML_KEYS: dict[str, tuple[str, str]] = {"link_latency": ("link_latency_us", "us")}
FIXED_PARAMS: tuple[str, ...] = tuple(_FIXED_YAML_KEYS)
"""Parameters costs may use that no fit sets (:attr:`MachineProfile.link_latency`)."""
_ALL_YAML_KEYS = {**_YAML_KEYS, **_OPTIONAL_YAML_KEYS, **_FIXED_YAML_KEYS}


@dataclass(kw_only=True, slots=True)
class MachineProfile:
    """Alpha-beta-gamma parameters of one machine (seconds and seconds per byte)."""

    name: str
    """Short name, the file stem in ``configs/machines/``."""
    ranks_per_node: int
    """Ranks (GPUs, GCDs) per node: L of the hierarchical compositions."""
    nics_per_node: int
    """Network interfaces per node; more ranks than NICs sending off-node at once share them."""
    alpha_intra: float
    """Latency of one MPI point-to-point message between two ranks of a node."""
    beta_intra: float
    """Seconds per byte of an MPI message between two ranks of a node (1 / pair bandwidth)."""
    alpha_inter: float
    """Latency of one MPI point-to-point message between nodes."""
    beta_inter: float
    """Seconds per byte between nodes for one rank that has a NIC to itself (1 / NIC bandwidth)."""
    alpha_vendor_intra: float
    """Latency of one step of the vendor library's (NCCL/RCCL/gloo) ring inside a node."""
    beta_vendor_intra: float
    """Seconds per byte of the vendor ring inside a node (1 / its effective bus bandwidth)."""
    alpha_vendor_step: float
    """Latency of one step of the vendor ring across nodes: ring collectives cost (p-1) of these."""
    beta_vendor_inter: float
    """Seconds per byte of the vendor ring across nodes. Vendor libraries stripe a ring over several
    channels, one per NIC, so this is 1 / the node's aggregate NIC bandwidth, not one NIC's."""
    alpha_mpi_native: float
    """Per-step latency of the MPI library's own collectives (``mpi``), which use its p2p bandwidths."""
    gamma: float
    """Seconds per byte reduced (a local reduction reads two operands and writes one)."""
    copy: float
    """Seconds per byte of a local copy or permutation (pack, unpack, Bruck's rotation)."""
    overhead: float
    """Constant cost of one call (Python dispatch, stream synchronisation)."""
    host_cores: int = 0
    """Cores of the one host every rank runs on, when they all share one (the testbed's emulated nodes, ranks
    on one machine); 0 when each node has its own, at least one a rank. With ``p`` ranks on ``host_cores``
    cores, the work the cores do (:data:`~pccl_torch.sim.costs.HOST_PARAMS`) takes ``p / host_cores`` as long."""
    vendor_library: str = "nccl"
    """The flat vendor library the model prices as ``vendor`` (:data:`VENDOR_LIBRARIES`): ``nccl``/``rccl`` run
    a ring reduce-scatter; torch's ``gloo`` backend runs reduce-scatter as an all-reduce of a copy."""
    device: str = "cpu"
    """Where the ranks' tensors live (:data:`DEVICES`). ``cuda``: the model prices what runs on GPUs, where pccl's
    ``hier:pipelined`` runs the vendor library inside the node like every ``hier:`` name, and NCCL/RCCL run an
    all-reduce as the faster of their ring and their tree. ``cpu`` (profiles without the key, written before it
    existed, included): ``hier:pipelined`` with MPI inside the node, the vendor all-reduce as a ring."""
    chunk_overhead: float = 0.0
    """Seconds of the cores' work each phase of each chunk of a pipelined call adds (starting and completing its
    non-blocking collective, slicing the chunk); fitted on pipelined rows after the linear parameters
    (``pccl_torch.sim.fit``), optional in YAML (``chunk_overhead_us``, 0 when left out)."""
    link_latency: float = 0.0
    """One-way latency of the wire between two nodes beyond what the fitted latencies saw (the testbed's added delay:
    half its round-trip time, :meth:`with_link_rtt`). Every message step that crosses nodes pays it, whatever runs
    it: pccl's point-to-point steps (``alpha_inter`` + this), the MPI library's own collectives
    (``alpha_mpi_native`` + this) and the vendor ring or tree (``alpha_vendor_step`` + this). Not fitted: profiles
    are fitted on links without added delay, then given the measured round trip (``link_latency_us`` in YAML, 0 when
    left out)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each number comes from, keyed by field name."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("name must be a non-empty string.")
        for count in ("ranks_per_node", "nics_per_node", "host_cores"):
            value = getattr(self, count)
            least = 0 if count == "host_cores" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{count} must be an integer of at least {least}, got {value!r}.")
        if self.vendor_library not in VENDOR_LIBRARIES:
            raise ValueError(f"vendor_library must be one of {', '.join(VENDOR_LIBRARIES)}, "
                             f"got {self.vendor_library!r}.")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}.")
        if self.device == "cuda" and self.vendor_library == "gloo":
            raise ValueError("device cuda needs a GPU vendor library (nccl or rccl), got 'gloo'.")
        for param in (*PARAMS, *_OPTIONAL_YAML_KEYS, *FIXED_PARAMS):
            value = getattr(self, param)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
                raise ValueError(f"{param} must be a finite number >= 0, got {value!r}.")
            setattr(self, param, float(value))
        unknown = set(self.sources) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"sources name unknown fields {sorted(unknown)}; valid: {', '.join(PARAMS)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MachineProfile":
        """A profile from its YAML mapping (human units); unknown or missing keys raise."""
        data = dict(data)
        values: dict[str, Any] = {}
        for param, (key, unit) in _YAML_KEYS.items():
            if key not in data:
                raise ValueError(f"machine profile lacks {key!r}")
            values[param] = _from_human(data.pop(key), unit, key)
        for key in ("name", "ranks_per_node", "nics_per_node"):
            if key not in data:
                raise ValueError(f"machine profile lacks {key!r}")
            values[key] = data.pop(key)
        for key in TOPOLOGY_KEYS:
            if key in data:
                values[key] = data.pop(key)
        for param, (key, unit) in {**_OPTIONAL_YAML_KEYS, **_FIXED_YAML_KEYS}.items():
            if key in data:
                values[param] = _from_human(data.pop(key), unit, key)
        values["sources"] = {_field_of(k): str(v) for k, v in (data.pop("sources", None) or {}).items()}
        if data:
            raise TypeError(f"unexpected argument {next(iter(data))!r} in machine profile")
        return cls(**values)

    def with_inter_link(self, latency_s: float, seconds_per_byte: float) -> "MachineProfile":
        """This machine behind a measured network: the inter-node latency and bandwidth (of MPI and of the
        vendor ring across nodes) replaced by what ``pccl_torch.selection.links`` measured.

        A pccl step between nodes costs the measured ``latency_s`` and a vendor step at least that, as before; what
        the measurement exceeds the fitted ``alpha_inter`` by is the wire's latency the fit did not see
        (:attr:`link_latency`), which the MPI library's own collectives pay on each step between nodes too."""
        wire = max(0.0, latency_s - self.alpha_inter)
        return dataclasses.replace(self, alpha_inter=latency_s - wire, beta_inter=seconds_per_byte,
                                   beta_vendor_inter=seconds_per_byte, link_latency=wire,
                                   alpha_vendor_step=max(self.alpha_vendor_step, latency_s) - wire)

    def with_link_rtt(self, rtt_s: float) -> "MachineProfile":
        """This machine with ``rtt_s`` of round trip added between nodes (a profile fitted on links without added
        delay, and the round trip ``pccl-testbed probe`` measured): :attr:`link_latency` is half of it."""
        if not 0 <= rtt_s < math.inf:
            raise ValueError(f"a round-trip time must be a finite number of seconds >= 0, got {rtt_s!r}.")
        return dataclasses.replace(self, link_latency=rtt_s / 2)

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping (human units), the inverse of :meth:`from_dict`."""
        out: dict[str, Any] = {"name": self.name, "ranks_per_node": self.ranks_per_node,
                               "nics_per_node": self.nics_per_node, "host_cores": self.host_cores,
                               "vendor_library": self.vendor_library, "device": self.device}
        for param, (key, unit) in _ALL_YAML_KEYS.items():
            out[key] = _to_human(getattr(self, param), unit)
        if self.sources:
            out["sources"] = {_ALL_YAML_KEYS.get(k, (k,))[0]: v for k, v in self.sources.items()}
        return out

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the profile as YAML (``yaml.safe_dump``); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# pccl-sim machine profile: latencies in us, bandwidths in GB/s (1e9 bytes/s)\n"
                        + yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


def _to_human(value: float, unit: str) -> float:
    """Seconds -> us, s/byte -> GB/s, to 9 significant digits (so 3e-6 s is written 3.0, not 2.9999...)."""
    if unit == "GBps" and value == 0:
        return math.inf
    return float(f"{value * 1e6 if unit == 'us' else 1e-9 / value:.9g}")


def _from_human(value: Any, unit: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    if unit == "us":
        return value * 1e-6
    if value <= 0:
        raise ValueError(f"{key} must be a bandwidth > 0 GB/s (.inf for free), got {value!r}")
    return 1e-9 / value


def _field_of(key: str) -> str:
    """Field name of a ``sources`` key, which may be written as the YAML key or the field name."""
    for param, (yaml_key, _) in _ALL_YAML_KEYS.items():
        if key == yaml_key:
            return param
    return key


def search_dirs() -> list[Path]:
    """Where profile names are looked up: ``$PCCL_MACHINES_DIR`` (if set), then the repository's."""
    dirs = [Path(os.environ[MACHINES_DIR_ENV])] if os.environ.get(MACHINES_DIR_ENV) else []
    return dirs + [Path(__file__).resolve().parents[2] / "configs" / "machines"]


def available() -> list[str]:
    """Names of the profiles found in :func:`search_dirs`."""
    return sorted({p.stem for d in search_dirs() if d.is_dir() for p in d.glob("*.yaml")})


def load(name_or_path: str | os.PathLike[str]) -> MachineProfile:
    """The profile at a path (anything ending in .yaml/.yml or containing a separator), or by name."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise FileNotFoundError(f"no machine profile at {path}")
    else:
        path = next((d / f"{text}.yaml" for d in search_dirs() if (d / f"{text}.yaml").is_file()), None)
        if path is None:
            where = ", ".join(str(d) for d in search_dirs())
            raise ValueError(f"unknown machine {text!r}; available: {', '.join(available()) or 'none'} "
                             f"(searched {where}; set ${MACHINES_DIR_ENV} or pass a .yaml path)")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a machine profile must be a YAML mapping")
    try:
        return MachineProfile.from_dict(data)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{path}: {err}") from None
