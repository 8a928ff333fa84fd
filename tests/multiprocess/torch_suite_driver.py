"""torch's own distributed test base on pccl, run as torch's ``test/distributed/test_distributed_spawn.py`` runs it
for gloo and NCCL: ``TestDistBackend`` + ``DistributedTest._DistTestBase``, the ranks spawned in ``setUp``, the
environment torch's ``run_test.py`` gives it (``BACKEND``, ``WORLD_SIZE``, ``TEMP_DIR``, ``INIT_METHOD``).

Two modes (``PCCL_TORCH_SUITE``):

- ``pccl``: ``BACKEND=pccl``, pccl added to the suite's feature sets it claims (``ddp``, ``subgroup``, and
  ``plugin``: available). Tests gated on the name ``gloo`` skip themselves, as they do for NCCL.
- ``forced``: gloo's run (``BACKEND=gloo``) with every ``init_process_group`` switched to pccl by
  ``pccl_torch.run.force_torch_backend()`` at import, so the spawned ranks get it too: pccl in gloo's place.

Nothing is skipped here: the tests expected to differ (:data:`EXPECTED_DIFFERENCES`) run as expected failures,
so one that starts passing is reported (an unexpected success). Run it as a script (the spawned ranks import
this file as their main module)::

    PCCL_TORCH_SUITE=forced python tests/multiprocess/torch_suite_driver.py --json out.json [-k NAME ...]

It prints one line per test and the counts, and writes them with every failure's traceback to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import unittest

MODES = ("pccl", "forced")
MODE = os.environ.setdefault("PCCL_TORCH_SUITE", "forced")
if MODE not in MODES:
    raise SystemExit(f"PCCL_TORCH_SUITE={MODE!r}: one of {MODES}")
# torch's run_test.py environment, read by torch's test base at import (the spawned ranks inherit it).
os.environ.setdefault("BACKEND", "pccl" if MODE == "pccl" else "gloo")
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("INIT_METHOD", "env://")
os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="pccl-torch-suite-"))
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "180")  # a hung test fails in 3 min, not torch's 5

import torch  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

import pccl_torch  # noqa: E402, F401 - registers the backend in the parent and in every spawned rank
from pccl_torch.run import force_torch_backend  # noqa: E402

if MODE == "pccl":
    for feature in ("ddp", "subgroup", "plugin"):
        DistTestCases.backend_feature[feature].add("pccl")
else:
    force_torch_backend()

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False  # as test_distributed_spawn.py

EXPECTED_DIFFERENCES: dict[str, dict[str, str]] = {
    "forced": {
        "test_get_backend": "the group is named pccl, by design (dist.get_backend answers 'pccl' where the test "
                            "asked for gloo)",
    },
    "pccl": {},
}
"""Per mode, the tests expected to fail on pccl, by name, with the reason: run as expected failures."""


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's test_distributed_spawn.py class: every rank spawned afresh for each test."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()


for _name in EXPECTED_DIFFERENCES[MODE]:
    setattr(TestDistBackendWithSpawn, _name, unittest.expectedFailure(getattr(DistributedTest._DistTestBase, _name)))


class _Recorded(unittest.TextTestResult):
    """A text result that also keeps each test's outcome by name (for the JSON report)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, str] = {}
        self.tracebacks: dict[str, str] = {}

    def _record(self, test: unittest.TestCase, outcome: str, err=None) -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = outcome
        if err is not None:
            self.tracebacks[name] = self._exc_info_to_string(err, test)[-4000:]

    def addSuccess(self, test):  # noqa: N802 - unittest's name
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", err)

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._record(test, "failed", err)

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped")

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._record(test, "expected difference")

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._record(test, "unexpected success")


def _selected(names: list[str]) -> unittest.TestSuite:
    """The class's tests, or only those named (each must exist: a renamed test in torch fails loudly)."""
    loader = unittest.TestLoader()
    if not names:
        return loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    missing = [n for n in names if not hasattr(TestDistBackendWithSpawn, n)]
    if missing:
        raise SystemExit(f"torch's test base has no {missing}")
    return unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-k", "--test", action="append", default=[], help="run only this test (repeatable)")
    parser.add_argument("--json", help="write the outcomes, counts and failures' tracebacks here")
    args = parser.parse_args()
    start = time.monotonic()
    result = unittest.TextTestRunner(resultclass=_Recorded, verbosity=2, stream=sys.stdout).run(_selected(args.test))
    counts: dict[str, int] = {}
    for outcome in result.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    report = {"mode": MODE, "backend": os.environ["BACKEND"], "world_size": int(os.environ["WORLD_SIZE"]),
              "seconds": round(time.monotonic() - start, 1), "counts": counts, "outcomes": result.outcomes,
              "tracebacks": result.tracebacks, "expected_differences": EXPECTED_DIFFERENCES[MODE]}
    print(f"{MODE} (BACKEND={report['backend']}, WORLD_SIZE={report['world_size']}): {counts} "
          f"in {report['seconds']} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0 if counts.get("failed", 0) == counts.get("unexpected success", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
