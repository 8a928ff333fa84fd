"""The command-line tools answer bad input with the usage line and ``<tool>: error: <message>``, exit status 2,
never a traceback; their help is plain text with every flag explained, and their tables fit their content."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from pccl_torch.bench import cli as bench_cli
from pccl_torch.selection.learned import cli as tune_cli
from pccl_torch.sim import cli as sim_cli
from pccl_torch.testbed import cli as testbed_cli
from pccl_torch.units import plain, table

PARSERS = {"pccl-bench": bench_cli.build_parser, "pccl-tune": tune_cli.build_parser, "pccl-sim": sim_cli.parser,
           "pccl-testbed": testbed_cli.build_parser}


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
    assert "pccl-tune: error: " in capsys.readouterr().err


def test_fit_on_rows_that_are_not_pccl_bench_rows(tmp_path, capsys) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"collective": "all_reduce"}]))
    assert sim_cli.main(["fit", str(rows), "-o", str(tmp_path / "out.yaml")]) == 2
    assert "row 0 is not a pccl-bench row: missing backend" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv, env, message", [
    ("pccl_torch.selection.learned.cli", ["--explain", "--ranks", "6", "--local-size", "4"], {},
     "local size 4 does not divide the world size 6"),
    ("pccl_torch.bench.cli", ["-b", "1K", "-e", "1K", "-c", "all_reduce", "--no-progress"],
     {"PCCL_ALGO": "all_reduce:foo"}, "PCCL_ALGO='all_reduce:foo': unknown all_reduce algorithm 'foo'"),
    ("pccl_torch.sim.cli", ["fit", os.curdir, "-o", "unused.yaml"], {}, "Is a directory"),
    ("pccl_torch.testbed.cli", ["up", "--rate", "fast"], {}, "rate 'fast'"),
], ids=["pccl-tune", "pccl-bench", "pccl-sim", "pccl-testbed"])
def test_each_tool_answers_bad_input_with_a_usage_error(module, argv, env, message, tmp_path) -> None:
    tool = next(name for name, build in PARSERS.items() if build.__module__ == module)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PCCL_")} | env
    done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=environment,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert re.search(rf"^{tool}: error: .*{re.escape(message)}", done.stderr, re.MULTILINE), done.stderr


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every tool's parser and each of its subcommands' parsers."""
    pending = [(name, build()) for name, build in PARSERS.items()]
    while pending:
        name, parser = pending.pop()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending += [(f"{name} {sub}", p) for sub, p in action.choices.items()]


@pytest.mark.parametrize("name, parser", [pytest.param(*entry, id=entry[0]) for entry in _parsers()])
def test_help_is_plain_text_with_every_flag_explained(name: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert "``" not in text and not re.search(r":[a-z]+:`", text), f"{name} --help shows reST markup"
    unexplained = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert unexplained == [], f"{name}: flags without help: {unexplained}"


def test_plain_drops_rest_markup() -> None:
    assert plain("``x`` :func:`pkg.f` :mod:`~pkg.mod` `y`") == "x pkg.f mod y"


def test_tables_fit_their_longest_cell() -> None:
    lines = table(("algorithm", "time(us)"), [("hier-gloo:recursive_doubling", "1.0"), ("ring", "123456.5")], "<>")
    assert lines == ["algorithm                     time(us)",
                     "hier-gloo:recursive_doubling       1.0",
                     "ring                          123456.5"]


def test_predict_table_columns_line_up(capsys) -> None:
    assert sim_cli.main(["predict", "-c", "all_gather", "--bytes", "1M", "--gpus", "16", "--machine", "frontier"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:-1]
    header, rows = lines[0], lines[1:]
    assert any(len(row.split()[0]) > 26 for row in rows)  # names longer than the old fixed width
    end = header.index("time(us)") + len("time(us)")
    assert all(re.match(r"\d+\.\d$", row[:end].split()[-1]) and row[end] == " " for row in rows), lines
