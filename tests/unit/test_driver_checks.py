"""The correctness driver's comparison (tests/multiprocess/driver.py) must reject every plausible wrong
reduction and accept every correct one, at p = 2..6 and every dtype.

Wrong results, applied to the driver's own inputs: one rank's contribution left out, one counted twice,
AVG divided by p - 1, PRODUCT missing a factor. Correct results: the reference rounded once, and a
left-to-right accumulation in the dtype itself (p - 1 roundings, then the scale: the worst a real schedule
does), forwards and backwards."""

from __future__ import annotations

import pytest
import torch

from pccl_torch.ops import FLOAT_DTYPES, INT_DTYPES, SUPPORTED_DTYPES
from tests.multiprocess.driver import PREMUL_FACTOR, make_input, matches, reference

RANKS = range(2, 7)
SUM_LIKE = ("sum", "avg", "premul_sum", "product")


def _inputs(p: int, numel: int, dtype: torch.dtype, op: str) -> list[torch.Tensor]:
    return [make_input(r, numel, dtype, op, seed=p * 100 + numel) for r in range(p)]


def _scale(op: str, divisor: int) -> float:
    return {"sum": 1.0, "product": 1.0, "avg": 1.0 / divisor, "premul_sum": PREMUL_FACTOR}[op]


def _combine(values: list[torch.Tensor], op: str) -> torch.Tensor:
    """Float64 / int64 combination of ``values`` with ``op``'s combining function (no scale)."""
    wide = torch.float64 if values[0].dtype.is_floating_point else torch.int64
    stack = torch.stack([v.to(wide) for v in values])
    if op == "product":
        return stack.prod(0)
    if op == "min":
        return stack.min(0).values
    if op == "max":
        return stack.max(0).values
    return stack.sum(0)


def _wrong_results(inputs: list[torch.Tensor], op: str) -> dict[str, torch.Tensor]:
    """What a broken collective might deliver (float64 / int64, before rounding to the dtype)."""
    p = len(inputs)
    wrong = {}
    for j in range(p):
        others = inputs[:j] + inputs[j + 1:]
        wrong[f"rank {j} dropped"] = _combine(others, op) * _scale(op, p) if op != "min" and op != "max" \
            else _combine(others, op)
        if op not in ("min", "max"):  # idempotent ops cannot see a double count
            wrong[f"rank {j} counted twice"] = _combine(inputs + [inputs[j]], op) * _scale(op, p)
    if op == "avg":
        wrong["avg divided by p - 1"] = _combine(inputs, "sum") / (p - 1)
    if op == "premul_sum":
        wrong["factor not applied"] = _combine(inputs, "sum")
    return wrong


def _in_dtype_accumulation(inputs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    """A correct reduction that rounds as often as any schedule may: every partial result in ``dtype``."""
    fn = {"product": torch.mul, "min": torch.minimum, "max": torch.maximum}.get(op, torch.add)
    acc = inputs[0].clone()
    for x in inputs[1:]:
        acc = fn(acc, x)
    if op in ("avg", "premul_sum"):
        acc = acc * _scale(op, len(inputs))
    return acc


def _ops(dtype: torch.dtype) -> tuple[str, ...]:
    return ("sum", "avg", "premul_sum", "product", "min", "max") if dtype in FLOAT_DTYPES else (
        "sum", "product", "min", "max")


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("p", RANKS)
def test_every_wrong_result_is_rejected(p: int, dtype: torch.dtype) -> None:
    for op in _ops(dtype):
        # One element is enough for the sum-like ops (the inputs bound every element away from the
        # tolerance); MIN/MAX need an element where the dropped rank held the extreme: 64 elements.
        for numel in ((1, 37) if op in SUM_LIKE else (64,)):
            inputs = _inputs(p, numel, dtype, op)
            expected = reference(inputs, op)
            for name, wrong in _wrong_results(inputs, op).items():
                result = wrong.to(dtype)
                problem = matches(result, expected, dtype, p, inputs=inputs, op=op)
                assert problem is not None, f"p={p} {dtype} {op} numel={numel}: {name} was accepted"


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("p", RANKS)
def test_every_correct_result_is_accepted(p: int, dtype: torch.dtype) -> None:
    for op in _ops(dtype):
        for numel in (1, 37, 4099):
            inputs = _inputs(p, numel, dtype, op)
            expected = reference(inputs, op)
            candidates = {"rounded once": expected.to(dtype),
                          "accumulated in the dtype": _in_dtype_accumulation(inputs, op, dtype),
                          "accumulated backwards": _in_dtype_accumulation(inputs[::-1], op, dtype)}
            for name, result in candidates.items():
                problem = matches(result, expected, dtype, p, inputs=inputs, op=op)
                assert problem is None, f"p={p} {dtype} {op} numel={numel}: {name} rejected: {problem}"


@pytest.mark.parametrize("dtype", [d for d in SUPPORTED_DTYPES if d in INT_DTYPES], ids=str)
def test_int_inputs_have_no_zero_to_hide_a_missing_rank(dtype: torch.dtype) -> None:
    for op in ("sum", "product", "min", "max"):
        x = make_input(3, 10_000, dtype, op, seed=1)
        assert bool((x != 0).all()), op


def test_float_inputs_keep_wrong_results_beyond_the_bound() -> None:
    """The premise of the bound: magnitudes in [1, 2), positive for AVG, PREMUL_SUM and PRODUCT."""
    for op in ("sum", "avg", "premul_sum", "product", "min", "max"):
        x = make_input(0, 10_000, torch.float64, op, seed=2)
        assert bool((x.abs() >= 1).all() and (x.abs() < 2).all()), op
        if op in ("avg", "premul_sum", "product"):
            assert bool((x > 0).all()), op
