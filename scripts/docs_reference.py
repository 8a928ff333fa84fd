"""The generated parts of the docs: every ``PCCL_*`` variable, every command-line flag, the shipped selector
profile's range.

A page holds each generated part between ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` lines,
rendered into the committed Markdown, so the pages read right in the repository too. ``--write`` renders every
part again from the code (``pccl_torch.environment``, the argparse parsers of the tools, the shipped profile's
metadata); ``--check`` exits 1 when a page differs from what the code gives now (``tests/unit/test_docs.py``
runs it, so the pages cannot drift). As a MkDocs hook (``hooks:`` in ``mkdocs.yml``) it renders the parts of
each page as the site is built.

    python scripts/docs_reference.py --write
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
REGION = re.compile(r"^<!-- generated: (?P<name>[\w-]+) -->\n.*?^<!-- end generated -->$", re.DOTALL | re.MULTILINE)
UNDOCUMENTED_ENVIRONMENT = ("LOCAL_RANK", "PCCL_MACHINES_DIR")
"""Variables that change the parsers' defaults or choices (the machine profiles listed): unset while generating."""


@contextlib.contextmanager
def _documented_environment() -> Iterator[None]:
    """The process environment without :data:`UNDOCUMENTED_ENVIRONMENT`, so that the text is the same anywhere."""
    saved = {name: os.environ.pop(name) for name in UNDOCUMENTED_ENVIRONMENT if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


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
    from pccl_torch.selection.learned.cli import build_parser as tune
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


def _span(bounds: list[float], unit: str) -> str:
    """``[1, 6]`` (log2 bounds) -> ``2 to 64 ranks``."""
    low, high = (int(2 ** bound) for bound in bounds)
    return f"{low} {unit}" if low == high else f"{low} to {high} {unit}"


def _size(log2_bytes: float) -> str:
    from pccl_torch.units import format_size

    return format_size(int(2 ** log2_bytes))


def shipped_profile() -> str:
    """What the shipped selector profile was trained on, from its metadata (``configs/selector/default.json``)."""
    from pccl_torch.selection.learned.runtime import SHIPPED

    meta = json.loads(SHIPPED.read_text())["metadata"]
    ranges = meta["feature_ranges"]
    powers = {name: " (powers of two)" if ranges[name] == [1.0, 1.0] else "" for name in
              ("ranks_power_of_two", "nodes_power_of_two")}
    elements = " or ".join(f"{size}-byte" for size in meta["dtype_sizes"])
    ratios = " or ".join(f"{2 ** ratio:g}" for ratio in meta["link_features"])
    return (f"The shipped profile (`{SHIPPED.relative_to(REPO)}`, trained on {meta['machine']} "
            f"{meta['date'][:10]}) covers {_span(ranges['log2_ranks'], 'ranks')}{powers['ranks_power_of_two']} as "
            f"{_span(ranges['log2_nodes'], 'nodes')}{powers['nodes_power_of_two']} of "
            f"{_span(ranges['log2_local_size'], 'ranks')}, {elements} elements, and links whose intra- over inter-node "
            f"bandwidth ratio is {ratios} (1: the nodes share one machine); sizes from "
            f"{_size(ranges['log2_bytes'][0])} to {_size(ranges['log2_bytes'][1])} are trained, others are decided as "
            "the nearest of them. A call of another layout, element size or link ratio warns.")


GENERATORS: dict[str, Callable[[], str]] = {"environment": environment_table, "cli": cli_reference,
                                            "shipped-profile": shipped_profile}


def _render(name: str) -> str:
    """The generated part ``name``, as the code gives it now."""
    if name not in GENERATORS:
        raise ValueError(f"unknown generated part {name!r}; known: {', '.join(GENERATORS)}")
    with _documented_environment():
        return GENERATORS[name]().strip()


def expand(markdown: str, *, markers: bool = True) -> str:
    """``markdown`` with every generated part rendered from the code as it is now; without ``markers``, the
    marker lines are left out (the built site)."""
    def render(region: re.Match[str]) -> str:
        text = _render(region["name"])
        return f"<!-- generated: {region['name']} -->\n\n{text}\n\n<!-- end generated -->" if markers else text

    return REGION.sub(render, markdown)


def stale_pages() -> list[Path]:
    """The pages whose generated parts differ from what the code gives now."""
    return [page for page in sorted(DOCS.rglob("*.md")) if expand(text := page.read_text()) != text]


def on_page_markdown(markdown: str, **_: object) -> str:
    """MkDocs hook: render the generated parts of every page, without their markers."""
    return expand(markdown, markers=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the generated parts of docs/*.md from the code.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the pages whose generated parts are stale")
    action.add_argument("--check", action="store_true", help="exit 1 naming the pages whose generated parts are stale")
    args = parser.parse_args(argv)
    stale = stale_pages()
    for page in stale:
        if args.write:
            page.write_text(expand(page.read_text()))
        print(f"{'rewrote' if args.write else 'stale'}: {page.relative_to(REPO)}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
