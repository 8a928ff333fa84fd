"""The persisted selector: plain JSON that cannot execute code when loaded.

A profile is a decision tree stored as arrays (``feature``, ``threshold``, ``left``, ``right`` and, per
leaf, the algorithms ranked by training weight), its metadata (machine, date, versions, model, scores,
feature ranges) and, optionally, the fitted machine parameters for the cost-model fallback. A SHA-256 of
the content is stored with it; a profile edited after training, or anything that is not such a JSON
document (a pickle, say), is rejected with a clear error before it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch.plan import valid_names
from pccl_torch.selection.learned.features import FEATURE_NAMES

FORMAT = "pccl-selector"
VERSION = 1
PROFILE_ENV = "PCCL_PROFILE"
LINK_MARGIN = 0.5
"""How far (log2) a call's link ratio may lie from one the profile was trained on: a factor 1.4."""
_KEYS = {"format", "version", "features", "classes", "tree", "metadata", "machine_profile", "checksum"}
_TREE_KEYS = {"feature", "threshold", "left", "right", "ranking"}


class ProfileError(ValueError):
    """A selector profile that cannot be trusted or used; the message says why and what to do."""


def tree_to_dict(tree) -> dict[str, Any]:
    """Arrays of a fitted ``DecisionTreeClassifier``; each leaf keeps its classes ranked by weight."""
    t = tree.tree_
    classes = [str(c) for c in tree.classes_]
    ranking = []
    for node in range(t.node_count):
        weights = t.value[node][0]
        order = sorted((i for i in range(len(classes)) if weights[i] > 0), key=lambda i: -weights[i])
        ranking.append(order if t.children_left[node] == -1 else [])
    return {"classes": classes, "feature": [int(f) for f in t.feature], "threshold": [float(x) for x in t.threshold],
            "left": [int(x) for x in t.children_left], "right": [int(x) for x in t.children_right],
            "ranking": ranking}


def _checksum(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Profile:
    """A validated selector profile (see the module docstring)."""

    classes: list[str]
    tree: dict[str, list]
    metadata: dict[str, Any]
    machine_profile: dict[str, Any] | None

    @classmethod
    def build(cls, *, tree: dict[str, Any], metadata: dict[str, Any], machine_profile: dict | None) -> "Profile":
        tree = dict(tree)
        classes = tree.pop("classes")
        profile = cls(classes, tree, metadata, machine_profile)
        profile._validate()
        return profile

    def payload(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "features": list(FEATURE_NAMES), "classes": self.classes,
                "tree": self.tree, "metadata": self.metadata, "machine_profile": self.machine_profile}

    def to_json(self) -> str:
        payload = self.payload()
        payload["checksum"] = _checksum(payload)
        return json.dumps(payload, indent=1)

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(self.to_json())

    @classmethod
    def from_json(cls, text: str, origin: str = "<string>") -> "Profile":
        """Parse and validate; ``ProfileError`` for anything but an intact pccl selector profile."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{origin} is not a pccl selector profile (expected JSON written by pccl-tune): "
                               f"{exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ProfileError(f"{origin} is not a pccl selector profile (format {FORMAT!r} expected)")
        if data.get("version") != VERSION:
            raise ProfileError(f"{origin} has profile version {data.get('version')!r}; this pccl reads "
                               f"version {VERSION}: run pccl-tune again")
        if set(data) != _KEYS:
            raise ProfileError(f"{origin} has unexpected keys {sorted(set(data) ^ _KEYS)}")
        claimed = data.pop("checksum")
        if claimed != _checksum(data):
            raise ProfileError(f"{origin} was modified after pccl-tune wrote it (checksum mismatch): "
                               "retrain with pccl-tune rather than editing it")
        if data["features"] != list(FEATURE_NAMES):
            raise ProfileError(f"{origin} was trained on features {data['features']}, this pccl uses "
                               f"{list(FEATURE_NAMES)}: run pccl-tune again")
        profile = cls(data["classes"], data["tree"], data["metadata"], data["machine_profile"])
        profile._validate(origin)
        return profile

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Profile":
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise ProfileError(f"cannot read selector profile {path}: {exc.strerror}") from None
        return cls.from_json(raw.decode("utf-8", errors="replace"), str(path))

    def _validate(self, origin: str = "profile") -> None:
        known = {n for c in COLLECTIVES for n in valid_names(c)}
        if not self.classes or any(not isinstance(c, str) or c not in known for c in self.classes):
            raise ProfileError(f"{origin} names unknown algorithms: {[c for c in self.classes if c not in known]}")
        tree = self.tree
        if not isinstance(tree, dict) or set(tree) != _TREE_KEYS:
            raise ProfileError(f"{origin}: the tree must have exactly the arrays {sorted(_TREE_KEYS)}")
        nodes = len(tree["feature"])
        if nodes == 0 or any(len(tree[k]) != nodes for k in _TREE_KEYS):
            raise ProfileError(f"{origin}: the tree arrays have different lengths")
        children = [c for i in range(nodes) if tree["left"][i] != -1 for c in (tree["left"][i], tree["right"][i])]
        if sorted(children) != list(range(1, nodes)):
            raise ProfileError(f"{origin}: the tree has invalid children (every node but the root needs one parent)")
        for i in range(nodes):
            left, right, feature = tree["left"][i], tree["right"][i], tree["feature"][i]
            if left == -1:
                ranking = tree["ranking"][i]
                if not ranking or any(not isinstance(k, int) or not 0 <= k < len(self.classes) for k in ranking):
                    raise ProfileError(f"{origin}: leaf {i} has an invalid ranking {ranking}")
            elif not (isinstance(left, int) and isinstance(right, int) and i < left < nodes and i < right < nodes
                      and isinstance(feature, int) and 0 <= feature < len(FEATURE_NAMES)):
                raise ProfileError(f"{origin}: node {i} has invalid children or feature")

    def rank(self, features: list[float]) -> list[str]:
        """Algorithms ranked for one feature vector (walk the tree to a leaf)."""
        tree, node = self.tree, 0
        while tree["left"][node] != -1:
            node = tree["left"][node] if features[tree["feature"][node]] <= tree["threshold"][node] \
                else tree["right"][node]
        return [self.classes[k] for k in tree["ranking"][node]]

    def in_range(self, features: list[float]) -> bool:
        """Whether a call's features lie inside what the profile was trained on (sizes with a factor-2 margin),
        its link ratio within a factor 1.4 of one trained on."""
        trained_links = self.metadata.get("link_features")
        link = features[FEATURE_NAMES.index("log2_link_ratio")]
        if trained_links is not None and not any(abs(link - t) <= LINK_MARGIN for t in trained_links):
            return False
        ranges = self.metadata.get("feature_ranges", {})
        for i, name in enumerate(FEATURE_NAMES):
            lo, hi = ranges.get(name, (-float("inf"), float("inf")))
            margin = {"log2_bytes": 1.0, "log2_link_ratio": LINK_MARGIN}.get(name, 0.0)
            if not lo - margin <= features[i] <= hi + margin:
                return False
        return True
