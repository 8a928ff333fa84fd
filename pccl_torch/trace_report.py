"""``pccl-trace <dir>``: read every rank's flight-recorder dump (``pccl_torch.trace_dump``) and say who is behind,
where, and which calls do not match.

For each communicator (process group) of the dumps: per rank the last completed call and the first incomplete one
(collective, sequence number, state, the phase and level reached, the peers it was waiting for); the ranks behind
(whose latest call is older than the group's latest), the ranks waiting for a rank that left no dump (a killed
process), and the calls whose collective, algorithm, dtype or sizes differ between ranks at one sequence number.
``--json`` prints the same as one JSON object. torch's own analyzer reads the same files: ``torchfrtrace <dir>``
(``python -m torch.distributed.flight_recorder.fr_trace``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

_RANKED = re.compile(r"(\d+)$")


class Where(NamedTuple):
    """One call of one rank, as the report names it."""

    seq: int
    collective: str
    algorithm: str
    state: str
    phase: str | None
    level: str | None
    step: int
    peers: list[int]
    error: str | None

    def describe(self) -> str:
        text = f"{self.collective} #{self.seq} ({self.algorithm}) {self.state}"
        if self.phase:
            text += f", in phase {self.phase}" + (f" chunk {self.step}" if self.step >= 0 else "")
        if self.peers:
            text += f", waiting for rank(s) {self.peers}"
        if self.error:
            text += f", failed: {self.error.splitlines()[0][:100]}"
        return text


def load(directory: Path) -> dict[int, dict[str, Any]]:
    """Every dump in ``directory`` by rank (the digits that end its name); a clear error when there is none."""
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a folder of flight-recorder dumps")
    dumps = {}
    for path in sorted(directory.iterdir()):
        match = _RANKED.search(path.name)
        if not match or path.name.startswith("."):
            continue
        with open(path, "rb") as file:
            dump = pickle.load(file)
        if isinstance(dump, dict) and "entries" in dump:
            dumps[int(match.group(1))] = dump
    if not dumps:
        raise FileNotFoundError(f"no flight-recorder dumps in {directory} (files named <prefix><rank>)")
    return dumps


def _where(entry: dict[str, Any]) -> Where:
    extra = entry.get("pccl", {})
    return Where(entry["collective_seq_id"], extra.get("collective", entry["profiling_name"].split(":")[-1]),
                 extra.get("algorithm", "?"), entry["state"], extra.get("phase"), extra.get("level"),
                 extra.get("step", -1), extra.get("peers", []), extra.get("error"))


def _signature(entry: dict[str, Any]) -> tuple:
    """What must agree across ranks at one sequence number."""
    extra = entry.get("pccl", {})
    return (extra.get("collective", entry["profiling_name"]), extra.get("algorithm"), tuple(entry["input_dtypes"]),
            str(entry["input_sizes"]), str(entry["output_sizes"]))


def analyse(dumps: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The report as data: per group, each rank's last completed and first incomplete call, the ranks behind,
    the mismatched calls."""
    groups: dict[str, dict[str, Any]] = {}
    for rank, dump in sorted(dumps.items()):
        for name, config in dump["pg_config"].items():
            group = groups.setdefault(name, {"ranks": config["ranks"], "by_rank": {}})
            group["by_rank"][rank] = [e for e in dump["entries"] if e["process_group"][0] == name]
    report: dict[str, Any] = {"ranks_dumped": sorted(dumps), "reasons": {r: d.get("reason") for r, d in
                                                                           sorted(dumps.items())}, "groups": {}}
    for name, group in groups.items():
        expected = set(json.loads(group["ranks"]))
        by_rank = group["by_rank"]
        ranks: dict[int, dict[str, Any]] = {}
        for rank, entries in sorted(by_rank.items()):
            done = [e for e in entries if e["state"] == "completed"]
            pending = [e for e in entries if e["state"] != "completed"]
            ranks[rank] = {"last_completed": _where(done[-1])._asdict() if done else None,
                           "first_incomplete": _where(pending[0])._asdict() if pending else None,
                           "latest_seq": max((e["collective_seq_id"] for e in entries), default=0)}
        latest = max((r["latest_seq"] for r in ranks.values()), default=0)
        behind = {rank: {"latest_seq": info["latest_seq"], "missing": f"#{info['latest_seq'] + 1}..#{latest}"}
                  for rank, info in ranks.items() if info["latest_seq"] < latest}
        first_missing = min((info["latest_seq"] + 1 for info in behind.values()), default=None)
        missed = None
        if first_missing is not None:
            for entries in by_rank.values():
                found = next((e for e in entries if e["collective_seq_id"] == first_missing), None)
                if found is not None:
                    missed = _where(found)._asdict()
                    break
        no_dump = sorted(expected - set(by_rank))
        waiting_on_no_dump = {rank: found for rank, info in ranks.items() if info["first_incomplete"]
                              and (found := sorted(set(info["first_incomplete"]["peers"]) & set(no_dump)))}
        report["groups"][name] = {
            "ranks": sorted(expected), "no_dump": no_dump, "per_rank": ranks, "behind": behind,
            "call_not_joined": missed, "waiting_on_no_dump": waiting_on_no_dump, "mismatches": _mismatches(by_rank),
        }
    return report


def _mismatches(by_rank: dict[int, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Sequence numbers where ranks' calls differ: the majority's call and each odd rank's."""
    at: dict[int, dict[int, dict[str, Any]]] = {}
    for rank, entries in by_rank.items():
        for e in entries:
            at.setdefault(e["collective_seq_id"], {})[rank] = e
    found = []
    for seq, calls in sorted(at.items()):
        counts = Counter(_signature(e) for e in calls.values())
        if len(counts) < 2:
            continue
        usual = counts.most_common(1)[0][0]
        odd = {rank: _describe_call(e) for rank, e in sorted(calls.items()) if _signature(e) != usual}
        typical = next(e for e in calls.values() if _signature(e) == usual)
        found.append({"seq": seq, "expected": _describe_call(typical), "odd_ranks": odd})
    return found


def _describe_call(entry: dict[str, Any]) -> str:
    extra = entry.get("pccl", {})
    return (f"{extra.get('collective', entry['profiling_name'])} ({extra.get('algorithm', '?')}) "
            f"{'/'.join(entry['input_dtypes'])} in {entry['input_sizes']} out {entry['output_sizes']}")


def render(report: dict[str, Any]) -> str:
    """The report as a few lines of text."""
    lines = [f"flight-recorder dumps of ranks {report['ranks_dumped']}"]
    for name, group in report["groups"].items():
        lines.append(f"group {name} (ranks {group['ranks']}):")
        if group["no_dump"]:
            lines.append(f"  no dump from rank(s) {group['no_dump']}")
        for rank, info in group["per_rank"].items():
            last = info["last_completed"]
            first = info["first_incomplete"]
            text = f"  rank {rank}: last completed " + (f"{last['collective']} #{last['seq']}" if last else "none")
            if first:
                text += "; first incomplete: " + Where(**first).describe()
            lines.append(text)
        for rank, info in group["behind"].items():
            missed = group["call_not_joined"]
            call = f" ({missed['collective']} #{missed['seq']}, {missed['algorithm']})" if missed else ""
            lines.append(f"  BEHIND: rank {rank} never started call #{info['latest_seq'] + 1}{call}; "
                         f"its last call was #{info['latest_seq']}")
        for rank, peers in group["waiting_on_no_dump"].items():
            where = group["per_rank"][rank]["first_incomplete"]
            phase = f", phase {where['phase']}" if where["phase"] else ""
            lines.append(f"  WAITING: rank {rank} waits for rank(s) {peers}, which left no dump (killed or dead), "
                         f"in {where['collective']} #{where['seq']}{phase}")
        for mismatch in group["mismatches"]:
            for rank, call in mismatch["odd_ranks"].items():
                lines.append(f"  MISMATCH at #{mismatch['seq']}: rank {rank} called {call}; the others called "
                             f"{mismatch['expected']}")
        if not group["behind"] and not group["mismatches"]:
            lines.append(f"  every rank{' that dumped' if group['no_dump'] else ''} reached the same call and the "
                         "calls match")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pccl-trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="the folder of dumps (PCCL_TRACE_DIR; default /tmp/pccl_trace)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        report = analyse(load(args.directory))
    except (FileNotFoundError, pickle.UnpicklingError, KeyError) as exc:
        print(f"pccl-trace: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1, default=str) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
