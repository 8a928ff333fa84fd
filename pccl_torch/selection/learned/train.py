"""Training: cross-validate the candidate models on held-out message sizes, keep the one with the
least regret, and distill its choices into a decision tree that the profile stores as plain data."""

from __future__ import annotations

import datetime
import math
import socket
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np

from pccl_torch.selection.learned.dataset import Case
from pccl_torch.selection.learned.features import FEATURE_NAMES, feature_vector
from pccl_torch.selection.learned.models import CANDIDATES, Scores, first_valid, score
from pccl_torch.selection.learned.profile import Profile, tree_to_dict


def held_out_size_folds(cases: Sequence[Case], folds: int = 5) -> list[tuple[list[int], list[int]]]:
    """Folds that hold out whole message sizes (every case of a size is in the same fold)."""
    sizes = sorted({c.nbytes for c in cases})
    folds = max(2, min(folds, len(sizes)))
    fold_of = {s: i % folds for i, s in enumerate(sizes)}  # interleaved: each fold spans the size range
    return [([i for i, c in enumerate(cases) if fold_of[c.nbytes] != k],
             [i for i, c in enumerate(cases) if fold_of[c.nbytes] == k]) for k in range(folds)]


def cross_validate(cases: Sequence[Case], names: Sequence[str] | None = None
                   ) -> tuple[dict[str, Scores], dict[str, list[tuple[Case, str]]]]:
    """Scores of each candidate on held-out sizes, and its held-out choices (measured cases only)."""
    results, choices = {}, {}
    for name in names or CANDIDATES:
        held_out: list[tuple[Case, str]] = []
        for train_idx, test_idx in held_out_size_folds(cases):
            test = [cases[i] for i in test_idx if cases[i].source == "measured"]
            if test:
                _, chosen = score(CANDIDATES[name]().fit([cases[i] for i in train_idx]), test)
                held_out.extend(zip(test, chosen))
        regrets = [c.regret(a) for c, a in held_out]
        results[name] = Scores(float(np.mean(regrets)), float(np.mean([r <= 0.10 for r in regrets])),
                               float(np.mean([a == c.best for c, a in held_out])), len(held_out))
        choices[name] = held_out
    return results, choices


def _grid(cases: Sequence[Case]) -> list[tuple[str, int, int, int, int, float]]:
    """Every trained (collective, layout, dtype) at sizes 2^(k/2) across the trained size range."""
    lo = min(c.nbytes for c in cases)
    hi = max(c.nbytes for c in cases)
    sizes = sorted({int(2 ** (k / 2)) for k in range(int(2 * math.log2(lo)), int(2 * math.log2(hi)) + 1)})
    configs = {(c.collective, c.ranks, c.local_size, c.dtype_size, c.link_ratio) for c in cases}
    return [(coll, s, r, l, d, k) for coll, r, l, d, k in sorted(configs) for s in sizes]


def distill(selector, cases: Sequence[Case]):
    """A decision tree reproducing ``selector``'s valid choices on the cases and a dense size grid."""
    from sklearn.tree import DecisionTreeClassifier

    points = [(c.collective, c.nbytes, c.ranks, c.local_size, c.dtype_size, c.link_ratio) for c in cases] + _grid(cases)
    features = [feature_vector(*p) for p in points]
    labels = [first_valid(r, p[0]) for r, p in zip(selector.rank(features), points)]
    tree = DecisionTreeClassifier(random_state=0).fit(np.array(features), labels)
    fidelity = float(np.mean(tree.predict(np.array(features)) == np.array(labels)))
    return tree, fidelity


def train(cases: Sequence[Case], *, machine_profile: dict | None = None, versions: dict | None = None,
          candidates: Sequence[str] | None = None
          ) -> tuple[Profile, dict[str, Scores], list[tuple[Case, str]]]:
    """Cross-validate, pick the least-regret model, fit it on every case, distill it into a profile.

    Returns the profile, every candidate's held-out scores, and the chosen model's held-out choices.
    """
    if not any(c.source == "measured" for c in cases):
        raise ValueError("no measured cases: run pccl-bench --backends pccl:all (or pccl-tune) first")
    scores, held_out = cross_validate(cases, candidates)
    chosen = min(scores, key=lambda n: (scores[n].mean_regret, -scores[n].accuracy))
    selector = CANDIDATES[chosen]().fit(list(cases))
    tree, fidelity = distill(selector, cases)
    features = np.array([c.features() for c in cases])
    metadata = {
        "machine": socket.gethostname(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions or {},
        "model": chosen,
        "cross_validation": {name: asdict(s) for name, s in scores.items()},
        "distillation_fidelity": fidelity,
        "cases": {"measured": sum(c.source == "measured" for c in cases),
                  "model": sum(c.source == "model" for c in cases)},
        "layouts": sorted({(c.ranks, c.local_size) for c in cases}),
        "dtype_sizes": sorted({c.dtype_size for c in cases}),
        "feature_ranges": {n: [float(features[:, i].min()), float(features[:, i].max())]
                           for i, n in enumerate(FEATURE_NAMES)},
        # The link ratios trained on, one by one: a network between two of them (1 Gbit/s between one machine
        # and 200 Mbit/s) is not covered by interpolating the tree across the gap.
        "link_features": sorted({float(v) for v in features[:, FEATURE_NAMES.index("log2_link_ratio")]}),
        # The one-way latencies between nodes the runs measured: a link far slower to answer is left to the rules
        # that know latency (Selector.covers).
        "link_latency_s": [min(c.link_latency_s for c in cases), max(c.link_latency_s for c in cases)],
    }
    profile = Profile.build(tree=tree_to_dict(tree), metadata=metadata, machine_profile=machine_profile)
    return profile, scores, held_out[chosen]
