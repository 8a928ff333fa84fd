"""The ``collective:value,...`` variables (``PCCL_ALGO``, ``PCCL_COMPRESSION``): one parser, blanks dropped,
repeats refused, and every error names its variable."""
from __future__ import annotations

import pytest

from pccl_torch.algorithms import COLLECTIVES
from pccl_torch import environment
from pccl_torch.compression.config import env_formats
from pccl_torch.plan import env_overrides


def test_values_are_trimmed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCCL_ALGO", " all_reduce : ring , all_gather : hier : bruck ")
    assert env_overrides() == {"all_reduce": "ring", "all_gather": "hier:bruck"}
    monkeypatch.setenv("PCCL_COMPRESSION", " all_gather : int8 ,reduce_scatter: None ")
    assert env_formats() == {"all_gather": "int8"}
    monkeypatch.setenv("PCCL_COMPRESSION", " bf16 ")
    assert env_formats() == dict.fromkeys(COLLECTIVES, "bf16")


@pytest.mark.parametrize("variable, value, message", [
    ("PCCL_ALGO", "all_reduce:foo", "PCCL_ALGO='all_reduce:foo': unknown all_reduce algorithm 'foo'; valid: ring"),
    ("PCCL_ALGO", "all_reduce:ring,all_reduce:mpi",
     "PCCL_ALGO='all_reduce:ring,all_reduce:mpi': all_reduce is given twice ('ring' and 'mpi')"),
    ("PCCL_ALGO", "ring", "PCCL_ALGO='ring': entry 'ring' is not collective:value"),
    ("PCCL_ALGO", "all_reduce:ring,", "PCCL_ALGO='all_reduce:ring,': entry '' is not collective:value"),
    ("PCCL_ALGO", "allreduce:ring", "PCCL_ALGO='allreduce:ring': unknown collective 'allreduce'; each entry must "
     "look like 'all_reduce:ring', with a collective of all_gather, reduce_scatter, all_reduce"),
    ("PCCL_COMPRESSION", "int4", "PCCL_COMPRESSION='int4': unknown compression 'int4'; expected None or one of"),
    ("PCCL_COMPRESSION", "all_gather:int4", "PCCL_COMPRESSION='all_gather:int4': unknown compression 'int4'"),
    ("PCCL_COMPRESSION", "all_gather:int8,all_gather:bf16",
     "PCCL_COMPRESSION='all_gather:int8,all_gather:bf16': all_gather is given twice ('int8' and 'bf16')"),
    ("PCCL_COMPRESSION", "allgather:int8", "PCCL_COMPRESSION='allgather:int8': unknown collective 'allgather'"),
])
def test_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    read = env_overrides if variable == "PCCL_ALGO" else env_formats
    with pytest.raises(ValueError) as raised:
        read()
    assert str(raised.value).startswith(message), str(raised.value)


def test_unset_and_blank_are_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PCCL_ALGO", raising=False)
    monkeypatch.setenv("PCCL_COMPRESSION", "   ")
    assert env_overrides() == {} and env_formats() == {}


def test_the_parser_leaves_values_to_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PCCL_X", "a:1, b : 2")
    seen: list[tuple[str, str]] = []
    assert environment.per_collective("PCCL_X", ("a", "b"), lambda c, v: seen.append((c, v)), "a:1") == \
        {"a": "1", "b": "2"}
    assert seen == [("a", "1"), ("b", "2")]
