"""No import cycles between pccl-torch's modules (module-level imports; a package's ``__init__`` is the
package's public face, imported implicitly with every submodule, so edges into it are not counted)."""
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


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The known, non-package modules ``name`` imports at module level (not inside functions)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known}
    return {t for t in found if not t.endswith("__init__")}


def test_module_imports_have_no_cycle() -> None:
    modules = _modules()
    names = {n.removesuffix(".__init__") for n in modules}
    plain = {n: p for n, p in modules.items() if not n.endswith(".__init__")}
    graph = {n: _imports(n, p, set(plain)) for n, p in plain.items()}
    assert len(graph) > 40 and sum(map(len, graph.values())) > 60, "the import graph looks empty"
    assert names  # packages exist
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
