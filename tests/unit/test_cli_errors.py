"""The command-line tools answer bad input with one line naming it and exit status 2, never a traceback."""
from __future__ import annotations

import json

import pytest

from pccl_torch.bench import cli as bench_cli
from pccl_torch.selector import cli as tune_cli
from pccl_torch.sim import cli as sim_cli


@pytest.mark.parametrize("main, argv, message", [
    (bench_cli.main, ["-b", "4Q"], "argument -b/--minbytes: cannot read size '4Q'"),
    (bench_cli.main, ["--iter-budget", "lots"], "argument --iter-budget: cannot read size 'lots'"),
    (tune_cli.main, ["--explain", "--bytes", "1X"], "argument --bytes: cannot read size '1X'"),
    (sim_cli.main, ["sweep", "--machine", "frontier", "--sizes", "1M,4Q"], "argument --sizes: cannot read size '4Q'"),
    (sim_cli.main, ["predict", "-c", "all_reduce", "--bytes", "x", "--gpus", "8", "--machine", "frontier"],
     "argument --bytes: cannot read size 'x'"),
    (bench_cli.main, ["-b", "1M", "-e", "1K"], "need 0 < minbytes <= maxbytes and factor > 1"),
    (tune_cli.main, ["-f", "1"], "need 0 < minbytes <= maxbytes and factor > 1"),
    (tune_cli.main, ["--explain", "-c", "broadcast"], "argument -c/--collective: invalid choice: 'broadcast'"),
])
def test_bad_values_are_usage_errors(main, argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_explain_with_a_file_that_is_not_a_profile(tmp_path, capsys) -> None:
    path = tmp_path / "not-a-profile.json"
    path.write_text(json.dumps({"format": "something-else"}))
    assert tune_cli.main(["--explain", "--profile", str(path)]) == 2
    assert "pccl-tune: " in capsys.readouterr().err


def test_fit_on_rows_that_are_not_pccl_bench_rows(tmp_path, capsys) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"collective": "all_reduce"}]))
    assert sim_cli.main(["fit", str(rows), "-o", str(tmp_path / "out.yaml")]) == 2
    assert "row 0 is not a pccl-bench row: missing backend" in capsys.readouterr().err
