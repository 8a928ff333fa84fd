"""The Python snippets of README.md and docs/usage.md run as written, under the launchers shown with them
(issue 36), so the docs cannot drift from the code.

Convention: every ```python block of these pages is preceded, on the lines right above its fence, by one or
more HTML comments (invisible on GitHub and on the MkDocs site)::

    <!-- snippet: PCCL_LOCAL_SIZE=2 mpiexec -n 4 python train.py -->
    <!-- snippet: torchrun --standalone --nproc-per-node 2 train.py -->

each the command line the snippet, saved as ``train.py``, is run with, or by one comment
``<!-- snippet: skip REASON -->`` (a snippet that cannot run here: a GPU, a real cluster; keep these few).
A python block without a marker fails :func:`test_every_python_block_is_marked`, so a new snippet cannot be
added untested. A command is ``[VAR=value ...] LAUNCHER ... train.py [ARGS]`` with LAUNCHER one of

- ``mpiexec -n N`` (the environment's MPICH; ``-env VAR VALUE`` passes through),
- ``torchrun --standalone --nproc-per-node N`` (``--standalone``: a free port, no clash with other jobs),
- ``deepspeed --num_gpus N --master_port {port}`` (``{port}``: a free port chosen by the test);

``python`` / ``.venv/bin/python`` mean this environment's interpreter (``python -m pccl_torch.run train.py``
included). A snippet whose first line is a comment naming a launch command (``# run with: ... mpiexec ...``)
must list that command among its markers, so what the reader is told to run is what the test runs.

The snippets are complete programs (imports, tensors, models included): one that needs a name from another
block is wrong as written. Snippets with the same command run in one launch (but one launch per snippet
under torchrun, see :func:`_groups`), one after another in each process (``snippet_runner.py``: fresh
globals, ``sys.argv`` as the launcher gave it, pccl and torch.distributed torn down between snippets).
Checked per launch: the exit status is 0, every rank wrote its result after its
last snippet (``rank_result``), every snippet finished on every rank, and each used pccl (its default group's
backend names pccl, or pccl counted at least one collective)."""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .conftest import HERE, ROOT, collect_ranks, launcher_environment, mpiexec, run_checked
from .rank_result import RESULT_DIR_ENV

DOCS = [ROOT / "README.md", ROOT / "docs" / "usage.md"]
RUNNER = HERE / "snippet_runner.py"
SNIPPETS_ENV = "PCCL_DOC_SNIPPETS"  # = snippet_runner.SNIPPETS_ENV (a script, not imported here)
MARKER = re.compile(r"^\s*<!--\s*snippet:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^\s*(?P<fence>`{3,})\s*(?P<lang>[\w+-]*)")
LAUNCHERS = ("mpiexec", "torchrun", "deepspeed")
PYTHON = ("python", "python3", ".venv/bin/python")
# DeepSpeed builds its CPU extension once (~30 s); keep it between runs (as test_deepspeed.py does).
EXTENSIONS = {"TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))}
TIMEOUT_S = 300


@dataclass
class Snippet:
    doc: str
    line: int
    """1-based line of the opening fence."""
    code: str
    commands: list[str] = field(default_factory=list)
    skip: str | None = None
    marker_errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{Path(self.doc).stem}-L{self.line}"


def parse(path: Path) -> list[Snippet]:
    """Every ```python block of ``path`` with the snippet markers on the lines right above its fence."""
    lines = path.read_text().splitlines()
    doc = str(path.relative_to(ROOT))
    snippets: list[Snippet] = []
    markers: list[str] = []
    i = 0
    while i < len(lines):
        marker, fence = MARKER.match(lines[i]), FENCE.match(lines[i])
        if marker:
            markers.append(marker["body"])
            i += 1
            continue
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence["fence"]), len(lines))
            if fence["lang"].lower() in ("python", "py"):
                snippet = Snippet(doc, i + 1, textwrap.dedent("\n".join(lines[i + 1:end]) + "\n"))
                for body in markers:
                    if body == "skip" or body.startswith("skip "):
                        snippet.skip = body[4:].strip() or None
                        if not snippet.skip:
                            snippet.marker_errors.append("'skip' needs a reason")
                    else:
                        snippet.commands.append(body)
                if snippet.skip is not None and snippet.commands:
                    snippet.marker_errors.append("both 'skip' and commands")
                snippets.append(snippet)
            i = end + 1
            markers = []
            continue
        markers = []
        i += 1
    return snippets


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    ranks: int


def _option(tokens: list[str], *names: str) -> str | None:
    for k, token in enumerate(tokens):
        for name in names:
            if token == name and k + 1 < len(tokens):
                return tokens[k + 1]
            if token.startswith(name + "="):
                return token.split("=", 1)[1]
    return None


def to_launch(command: str, port: int = 0) -> Launch:
    """The argv (this environment's executables, ``train.py`` -> the runner), the variables set before it and the
    number of ranks of a marker's command; ValueError on a command outside the convention."""
    tokens = shlex.split(command.replace("{port}", str(port)))
    env: dict[str, str] = {}
    while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
        name, value = tokens.pop(0).split("=", 1)
        env[name] = value
    if not tokens or Path(tokens[0]).name not in LAUNCHERS:
        raise ValueError(f"{command!r}: the launcher must be one of {LAUNCHERS}")
    if tokens.count("train.py") != 1:
        raise ValueError(f"{command!r}: name the snippet as train.py, once")
    launcher = Path(tokens[0]).name
    if launcher == "mpiexec":
        ranks, head = _option(tokens, "-n", "-np"), [mpiexec()]
    elif launcher == "torchrun":
        if "--standalone" not in tokens:
            raise ValueError(f"{command!r}: torchrun needs --standalone here (a free port, no clash with other jobs)")
        ranks = _option(tokens, "--nproc-per-node", "--nproc_per_node")
        head = [sys.executable, "-m", "torch.distributed.run"]
    else:
        if "{port}" not in command:
            raise ValueError(f"{command!r}: give deepspeed --master_port {{port}} (its default 29500 clashes)")
        ranks, head = _option(tokens, "--num_gpus", "--num-gpus"), [str(Path(sys.prefix) / "bin" / "deepspeed")]
    if ranks is None or not ranks.isdigit():
        raise ValueError(f"{command!r}: no rank count (-n, --nproc-per-node, --num_gpus)")
    argv = head + [sys.executable if t in PYTHON else str(RUNNER) if t == "train.py" else t for t in tokens[1:]]
    return Launch(argv, env, int(ranks))


SNIPPETS = [snippet for doc in DOCS for snippet in parse(doc)]


def _groups() -> dict[str, tuple[str, list[Snippet]]]:
    """Runnable snippets by command, in document order (one launch each; the same code once per launch), by test
    id. Under torchrun each snippet has a launch of its own: pccl's levels over torchrun's store use fixed keys,
    so a second ``pccl_torch.init()`` in one torchrun process (after a ``shutdown()``) hangs on the first one's."""
    groups: dict[str, tuple[str, list[Snippet]]] = {}
    for snippet in SNIPPETS:
        if snippet.skip is None and not snippet.marker_errors:
            for command in snippet.commands:
                alone = Path(shlex.split(command)[0]).name == "torchrun"
                _, group = groups.setdefault(f"{command} [{snippet.name}]" if alone else command, (command, []))
                if all(other.code != snippet.code for other in group):
                    group.append(snippet)
    return groups


GROUPS = _groups()


def _command_in_comment(code: str) -> str | None:
    """The launch command a snippet's first line names (``# run with: PCCL_LOCAL_SIZE=2 mpiexec -n 4 ...``)."""
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    if not first.startswith("#") or not any(re.search(rf"\b{name}\b", first) for name in LAUNCHERS):
        return None
    return re.sub(r"^#\s*(run with:\s*)?", "", first).strip()


def test_every_python_block_is_marked() -> None:
    """Every python block has a marker, every marker is a command this test can run (or a skip with a reason),
    and a command named in a snippet's first comment is one of its markers."""
    counts = {str(doc.relative_to(ROOT)): 0 for doc in DOCS}
    problems = []
    for snippet in SNIPPETS:
        counts[snippet.doc] += 1
        where = f"{snippet.doc}:{snippet.line}"
        if not snippet.commands and snippet.skip is None:
            problems.append(f"{where}: python block without '<!-- snippet: COMMAND -->' or "
                            f"'<!-- snippet: skip REASON -->' on the line above its fence")
        problems += [f"{where}: {error}" for error in snippet.marker_errors]
        for command in snippet.commands:
            try:
                to_launch(command)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
        shown = _command_in_comment(snippet.code)
        if shown is not None and snippet.skip is None and shown not in snippet.commands:
            problems.append(f"{where}: the snippet says to run {shown!r}, its markers run {snippet.commands}")
    assert not problems, "\n".join(problems)
    assert all(counts.values()), f"no python block found in some page (parser broken?): {counts}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("launch_id", list(GROUPS))
def test_snippets_run(launch_id: str, tmp_path) -> None:
    command, snippets = GROUPS[launch_id]
    files = []
    for snippet in snippets:
        path = tmp_path / f"{snippet.name}.py"
        path.write_text(snippet.code)
        files.append(str(path))
    with socket.socket() as sock:  # for {port}: free now, taken by the launcher a moment later
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = to_launch(command, port)
    results = tmp_path / "ranks"
    results.mkdir()
    env = launcher_environment(env={**EXTENSIONS, **launch.env, RESULT_DIR_ENV: str(results),
                                    SNIPPETS_ENV: os.pathsep.join(files)})
    process = run_checked(launch.argv, env, TIMEOUT_S)
    names = [snippet.name for snippet in snippets]
    run = collect_ranks(process, launch.ranks, results, what=f"{command} ({', '.join(names)})")
    for rank, result in enumerate(run.ranks):
        assert [done["snippet"] for done in result["snippets"]] == names, f"rank {rank}: {result}"
        for done in result["snippets"]:
            assert "pccl" in (done["backend"] or "") or done["pccl_calls"] > 0, (
                f"rank {rank}, {done['snippet']}: pccl neither the default backend nor counting a collective: {done}")
