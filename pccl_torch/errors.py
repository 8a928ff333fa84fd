"""The errors pccl raises when a collective cannot complete, and why each exists.

A collective that cannot finish must never hang silently: transports wait against a deadline and raise
:class:`Stalled` (internal), which the dispatch layer turns into a :class:`PcclTimeoutError` naming the
collective, its sequence number and the peers not heard from. The communicator is then broken: every
later call raises :class:`CommunicatorBrokenError` at once, since the ranks no longer agree on where
they are in the sequence of collectives.
"""

from __future__ import annotations

from collections.abc import Sequence


class PcclError(RuntimeError):
    """Base class of pccl's communication errors."""


class Stalled(PcclError):
    """A transport gave up waiting: raised inside a collective, re-raised as :class:`PcclTimeoutError`."""

    def __init__(self, peers: Sequence[int], waited_s: float, detail: str) -> None:
        self.peers = sorted(set(peers))
        self.waited_s = waited_s
        self.detail = detail
        super().__init__(f"{detail} (waited {waited_s:.1f} s; peers not heard from: {self.peers or 'unknown'})")


class PcclTimeoutError(PcclError, TimeoutError):
    """A collective did not complete within the communicator's timeout (or a peer process failed)."""

    def __init__(self, collective: str, sequence: int, algorithm: str, rank: int, stalled: Stalled) -> None:
        self.collective = collective
        self.sequence = sequence
        self.algorithm = algorithm
        self.peers = stalled.peers
        super().__init__(
            f"pccl {collective} #{sequence} ({algorithm}) on rank {rank} did not complete: {stalled.detail}; "
            f"peers not heard from: {stalled.peers or 'unknown'} (waited {stalled.waited_s:.1f} s). "
            "A peer process died, hangs, or did not call this collective; the communicator is now broken"
        )


class PcclMismatchError(PcclError, ValueError):
    """Ranks called different collectives (or sizes, dtypes, ops, algorithms) at the same point."""


class CommunicatorBrokenError(PcclError):
    """A collective failed earlier on this communicator; it can no longer be used."""
