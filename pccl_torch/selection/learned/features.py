"""The features a selector sees for one call: what PCCL's SVM used (message size, GPU count) and more."""

from __future__ import annotations

import math

LEARNED_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives a profile is trained on (one feature each); the others (all-to-all) are chosen by the rules."""

FEATURE_NAMES: tuple[str, ...] = (
    "is_all_gather", "is_reduce_scatter", "is_all_reduce",
    "log2_bytes", "log2_ranks", "log2_nodes", "log2_local_size", "dtype_size",
    "ranks_power_of_two", "nodes_power_of_two", "log2_link_ratio",
)
"""``log2_link_ratio``: how many times slower the link between nodes is than the one inside a node, measured at
``init()`` (``pccl_torch.selection.links``); 0 on emulated nodes sharing memory, ~3 at 1 Gbit/s here, ~5.5 at 200 Mbit/s."""


def _pow2(x: int) -> float:
    return float(x > 0 and x & (x - 1) == 0)


def feature_vector(collective: str, nbytes: int, ranks: int, local_size: int, dtype_size: int,
                   link_ratio: float = 1.0) -> list[float]:
    """Features of one call; ``nbytes`` is the full buffer (AG output, RS input, AR buffer); ``link_ratio``: the
    intra-node link's bandwidth over the inter-node link's (``Links.ratio``)."""
    if collective not in LEARNED_COLLECTIVES:
        raise ValueError(f"no selector features for collective {collective!r}; expected one of "
                         f"{', '.join(LEARNED_COLLECTIVES)}")
    nodes = max(ranks // max(local_size, 1), 1)
    return [
        *(float(collective == c) for c in LEARNED_COLLECTIVES),
        math.log2(max(nbytes, 1)), math.log2(ranks), math.log2(nodes), math.log2(local_size), float(dtype_size),
        _pow2(ranks), _pow2(nodes), link_feature(link_ratio),
    ]


def link_feature(link_ratio: float) -> float:
    """The link ratio as the selector sees it: log2, to a tenth (ratios measured a few percent apart are one)."""
    return round(math.log2(max(link_ratio, 1.0)), 1)
