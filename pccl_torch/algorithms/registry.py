"""The algorithm registry: (collective, name) -> the schedule and what it costs.

Every schedule registers itself here with a one-line summary, its alpha-beta-gamma cost
(Thakur, Rabenseifner, Gropp 2005; p ranks, n bytes of the full buffer) and its scratch: the temporaries it takes
(``pccl_torch.scratch``), which a CUDA call's worker finds reserved at issue (``pccl_torch.workspace``). Lookups of
an unknown name fail with the list of valid names. Calling conventions, by collective:

- ``all_gather(t, out, inp, blocks)``: ``out`` receives block ``i`` from rank ``i``; ``inp`` is this
  rank's block (it may be the view ``blocks.block(out, t.rank)``).
- ``reduce_scatter(t, inp, out, blocks, op)``: ``out`` receives block ``t.rank`` of the element-wise
  ``op`` of every rank's ``inp``; ``inp`` is never modified.
- ``all_reduce(t, buf, op)``: in place; the result is bitwise identical on every rank.
- ``all_to_all(t, out, inp, send, recv)``: block ``j`` of ``inp`` (``send``, one block per rank, any sizes
  including zero) goes to rank ``j``; block ``i`` of ``out`` (``recv``) comes from rank ``i``. Every rank's
  ``send.counts[j]`` equals rank ``j``'s ``recv.counts[rank]``; ``inp`` is never modified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

Collective = Literal["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]
COLLECTIVES: tuple[Collective, ...] = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")

F = TypeVar("F", bound=Callable[..., None])
Scratch = Callable[[int, int], tuple[int, ...]]
"""``scratch(p, n)``: the elements (of the buffer's dtype) of each temporary a schedule takes over ``p`` ranks on a
full buffer of ``n`` elements (all-gather output, reduce-scatter input, all-reduce buffer), at most on any rank."""


def no_scratch(p: int, n: int) -> tuple[int, ...]:
    """A schedule that takes no temporaries."""
    return ()


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One registered schedule."""

    collective: Collective
    name: str
    fn: Callable[..., None]
    summary: str
    cost: str
    scratch: Scratch = no_scratch


_REGISTRY: dict[tuple[str, str], Algorithm] = {}


def register(collective: Collective, name: str, *, summary: str, cost: str,
             scratch: Scratch = no_scratch) -> Callable[[F], F]:
    """Decorator: register ``fn`` as algorithm ``name`` of ``collective``."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")

    def wrap(fn: F) -> F:
        key = (collective, name)
        if key in _REGISTRY:
            raise ValueError(f"algorithm {name!r} is already registered for {collective}")
        _REGISTRY[key] = Algorithm(collective, name, fn, summary, cost, scratch)
        return fn

    return wrap


def names(collective: Collective) -> list[str]:
    """Registered algorithm names of ``collective``, in registration order."""
    return [name for (coll, name) in _REGISTRY if coll == collective]


def get(collective: Collective, name: str) -> Algorithm:
    """The algorithm ``name`` of ``collective``; ``ValueError`` listing the valid names if unknown."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; expected one of {COLLECTIVES}")
    try:
        return _REGISTRY[(collective, name)]
    except KeyError:
        raise ValueError(
            f"unknown {collective} algorithm {name!r}; valid: {', '.join(names(collective))}"
        ) from None
