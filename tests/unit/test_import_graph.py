"""No import cycles between pccl-torch's modules: every import counts, at module level or inside a function
(a function-level import that closes a loop is a cycle deferred to run time, not a broken one). A package's
``__init__`` is the package's public face, imported implicitly with every submodule, so edges into it are not
counted."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Source folder -> the dotted name it is installed as (pyproject's package-dir).
ROOTS = {"pccl_torch": "pccl_torch", "triton_kernels": "pccl_torch.triton_kernels",
         "integrations": "pccl_torch.integrations"}


def _modules() -> dict[str, Path]:
    modules = {}
    for folder, dotted in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            modules[".".join((dotted, *parts))] = path
    return modules


def _targets(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement may load (a ``from`` import: the module and each name in it)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known, non-package modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = {t for node in ast.walk(ast.parse(path.read_text())) for t in _targets(node, package) if t in known}
    return found - {name}


def _graph() -> dict[str, set[str]]:
    plain = {n: p for n, p in _modules().items() if not n.endswith(".__init__")}
    return {n: _imports(n, p, set(plain)) for n, p in plain.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_module_imports_have_no_cycle() -> None:
    graph = _graph()
    assert len(graph) > 40 and sum(map(len, graph.values())) > 60, "the import graph looks empty"
    cycles = _cycles(graph)
    assert cycles == [], "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_imports_inside_functions_are_edges() -> None:
    """``pccl-bench --testbed`` imports the testbed inside a function: that import is an edge too."""
    assert "pccl_torch.testbed.launch" in _graph()["pccl_torch.bench.cli"]


def test_a_cycle_through_a_function_level_import_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
