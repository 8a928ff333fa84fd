"""Candidate selectors, each a scikit-learn model behind one small interface: fit on cases, then
rank the algorithms of a call so that the best one valid for its collective can be taken."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pccl_torch.plan import valid_names
from pccl_torch.selection.learned.dataset import Case


def _classifier(name: str):
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC
    from sklearn.tree import DecisionTreeClassifier

    return {
        "svm": lambda: make_pipeline(StandardScaler(), SVC(C=10.0, gamma="scale", decision_function_shape="ovr")),
        "tree": lambda: DecisionTreeClassifier(random_state=0),
        "gbm": lambda: GradientBoostingClassifier(n_estimators=60, max_depth=3, random_state=0),
        "knn": lambda: make_pipeline(StandardScaler(), KNeighborsClassifier(n_neighbors=3, weights="distance")),
    }[name]()


class ClassifierSelector:
    """Learns the best algorithm's name as a class (PCCL's approach, with an SVM)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.model = None
        self.constant: str | None = None

    def fit(self, cases: Sequence[Case]) -> "ClassifierSelector":
        labels = [c.best for c in cases]
        if len(set(labels)) == 1:  # scikit-learn classifiers need two classes
            self.constant = labels[0]
            return self
        self.model = _classifier(self.kind).fit(np.array([c.features() for c in cases]), labels)
        return self

    def rank(self, features: Sequence[Sequence[float]]) -> list[list[str]]:
        if self.constant is not None:
            return [[self.constant] for _ in features]
        x = np.asarray(features)
        classes = list(self.model.classes_)
        if self.kind == "svm":  # one-vs-rest decision values rank the classes
            scores = self.model.decision_function(x)
            if scores.ndim == 1:
                scores = np.stack([-scores, scores], axis=1)
        else:
            scores = self.model.predict_proba(x)
        return [[classes[i] for i in np.argsort(-row, kind="stable")] for row in scores]


class RegressorSelector:
    """One regressor of log time per algorithm; picks the smallest prediction (uses every time, not
    just the winner's name)."""

    kind = "per_algorithm"

    def __init__(self) -> None:
        self.models: dict[str, object] = {}

    def fit(self, cases: Sequence[Case]) -> "RegressorSelector":
        from sklearn.ensemble import GradientBoostingRegressor

        algorithms = sorted({a for c in cases for a in c.times})
        for algorithm in algorithms:
            seen = [c for c in cases if algorithm in c.times]
            x = np.array([c.features() for c in seen])
            y = np.array([math.log(c.times[algorithm]) for c in seen])
            self.models[algorithm] = GradientBoostingRegressor(n_estimators=80, max_depth=3, random_state=0).fit(x, y)
        return self

    def rank(self, features: Sequence[Sequence[float]]) -> list[list[str]]:
        x = np.asarray(features)
        names = list(self.models)
        predicted = np.stack([self.models[a].predict(x) for a in names], axis=1)
        return [[names[i] for i in np.argsort(row, kind="stable")] for row in predicted]


CANDIDATES: dict[str, Callable[[], object]] = {
    "svm": lambda: ClassifierSelector("svm"),
    "tree": lambda: ClassifierSelector("tree"),
    "gbm": lambda: ClassifierSelector("gbm"),
    "knn": lambda: ClassifierSelector("knn"),
    "per_algorithm": RegressorSelector,
}


def first_valid(ranking: Sequence[str], collective: str, allowed: Sequence[str] | None = None) -> str:
    """The highest-ranked algorithm that exists for ``collective`` (and is in ``allowed``)."""
    valid = set(valid_names(collective)) if allowed is None else set(allowed) & set(valid_names(collective))
    for name in ranking:
        if name in valid:
            return name
    raise ValueError(f"no ranked algorithm is valid for {collective}: {list(ranking)}")


@dataclass(frozen=True, slots=True)
class Scores:
    """Cross-validated quality of a selector on held-out cases."""

    mean_regret: float
    within_10pct: float
    accuracy: float
    cases: int


def score(selector, cases: Sequence[Case]) -> tuple[Scores, list[str]]:
    """Choices of ``selector`` on ``cases`` (restricted to the algorithms each case measured)."""
    rankings = selector.rank([c.features() for c in cases])
    chosen = [first_valid(r + list(c.times), c.collective, list(c.times)) for r, c in zip(rankings, cases)]
    regrets = [c.regret(a) for c, a in zip(cases, chosen)]
    return Scores(
        mean_regret=float(np.mean(regrets)),
        within_10pct=float(np.mean([r <= 0.10 for r in regrets])),
        accuracy=float(np.mean([a == c.best for c, a in zip(cases, chosen)])),
        cases=len(cases),
    ), chosen
