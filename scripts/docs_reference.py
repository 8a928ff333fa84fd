"""The generated parts of the docs' configuration page: every ``PCCL_*`` variable and every command-line flag.

Used as a MkDocs hook (``hooks:`` in ``mkdocs.yml``): a page line ``<!-- generated: environment -->`` or
``<!-- generated: cli -->`` is replaced at build time by a table made from ``pccl_torch.environment`` or from
the argparse parsers of the CLIs themselves, so the reference cannot drift from the code. Run as a script it
prints both.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- generated: {} -->"


def _cell(text: str) -> str:
    """``text`` as one markdown table cell (no pipes, no line breaks)."""
    return " ".join(str(text).split()).replace("|", "\\|")


def environment_table() -> str:
    """The ``PCCL_*`` reference: one row per variable of :data:`pccl_torch.environment.VARIABLES`."""
    from pccl_torch.environment import VARIABLES

    rows = ["| variable | values | default | read at | what it does |", "|---|---|---|---|---|"]
    for v in sorted(VARIABLES, key=lambda v: v.name):
        rows.append(f"| `{v.name}` | {_cell(v.values)} | {_cell(v.default)} | {_cell(v.read)} | "
                    f"{_cell(v.meaning)} ([more]({v.page})) |")
    return "\n".join(rows)


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each command-line tool's parser, as (command, parser)."""
    from pccl_torch.bench.cli import build_parser as bench
    from pccl_torch.integrations.deepspeed import add_comm_arguments
    from pccl_torch.selector.cli import build_parser as tune
    from pccl_torch.sim.cli import parser as sim
    from pccl_torch.testbed.cli import build_parser as testbed

    yield "pccl-bench", bench()
    yield "pccl-tune", tune()
    yield "pccl-sim", sim()
    yield "pccl-testbed", testbed()
    yield "training scripts: add_comm_arguments(parser)", add_comm_arguments(
        argparse.ArgumentParser(prog="train.py", add_help=False))
    sys.path.insert(0, str(REPO / "examples" / "gpt"))
    try:
        import harness  # examples/gpt/harness.py: the flags every example training script takes
    finally:
        sys.path.pop(0)
    yield "examples/gpt training scripts", harness.build_parser(None)


def _flag(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings) or (action.metavar or action.dest)
    return f"`{names}`"


def _text(text: str) -> str:
    """Prose from a parser as one cell: reST literals as markdown ones, angle brackets shown, not parsed."""
    return _cell(text.replace("``", "`").replace("<", "&lt;").replace(">", "&gt;"))


def _default(action: argparse.Action) -> str:
    if action.option_strings and action.nargs == 0:
        return "off"
    if action.default in (None, argparse.SUPPRESS, "", []):
        return "" if action.option_strings else "(required)"
    return f"`{str(action.default).replace(str(Path.home()), '~')}`"


def _help(action: argparse.Action) -> str:
    text = (action.help or "") % {"default": action.default, "prog": ""} if action.help else ""
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text = f"{text} (one of: {', '.join(map(str, action.choices))})".strip()
    return _text(text)


def _parser_section(title: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = [f"{'#' * level} `{title}`", ""]
    summary = (parser.description or "").strip().split("\n\n")[0]
    if summary:
        lines += [_text(summary), ""]
    rows = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        lines += ["| flag | default | meaning |", "|---|---|---|"]
        lines += [f"| {_flag(a)} | {_default(a)} | {_help(a)} |" for a in rows]
        lines.append("")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines += _parser_section(f"{title} {name}", sub, level + 1)
    return lines


def cli_reference() -> str:
    """Every flag of every command-line tool, one table per command and subcommand."""
    lines: list[str] = []
    for command, parser in _parsers():
        lines += _parser_section(command, parser, 3)
    return "\n".join(lines).rstrip()


GENERATORS: dict[str, Callable[[], str]] = {"environment": environment_table, "cli": cli_reference}


def expand(markdown: str) -> str:
    """``markdown`` with every generated-section marker replaced by its table."""
    for name, generate in GENERATORS.items():
        marker = MARKER.format(name)
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown


def on_page_markdown(markdown: str, **_: object) -> str:
    """MkDocs hook: expand the markers of every page."""
    return expand(markdown)


if __name__ == "__main__":
    print(environment_table())
    print()
    print(cli_reference())
