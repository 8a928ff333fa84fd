"""The README and the documentation site: short README, a site that builds with every link resolved, pages
that cover what users look for, and references that match the code (paths, variables, flags, messages)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SOURCES = ("pccl_torch", "triton_kernels", "integrations")
REQUIRED_PAGES = ("usage.md", "architecture.md", "algorithms.md", "selection.md", "compression.md", "testbed.md",
                  "benchmarks.md", "reliability.md", "gpus.md", "configuration.md", "troubleshooting.md")
# A repository path in backticks: at least one slash (`pccl_torch/api.py`, `tests/unit/`, `.ci/run`).
PATH_LIKE = re.compile(r"`(\.?[A-Za-z0-9_\-][A-Za-z0-9_.\-]*(?:/[A-Za-z0-9_.\-]+)+/?|[A-Za-z0-9_\-]+/)`")


def _source_text() -> str:
    return "\n".join(path.read_text() for root in SOURCES for path in sorted((REPO / root).rglob("*.py")))


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _mkdocs_config() -> dict:
    text = (REPO / "mkdocs.yml").read_text()
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it: strict (a broken link, a page missing from the nav, a failing hook
    fail the build)."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 170, "README.md must stay within 170 lines; depth goes to docs/"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (REPO / target).exists(), f"README links to {target}, which does not exist"
    for command in ("make demo", "make test"):
        assert command in readme


def test_readme_names_no_commits() -> None:
    """The README is for users: the history (commits, dated runs) stays in docs/benchmarks.md."""
    readme = (REPO / "README.md").read_text()
    hashes = [word for word in re.findall(r"\b[0-9a-f]{7,40}\b", readme) if re.search(r"[a-f]", word)
              and re.search(r"[0-9]", word)]
    assert hashes == [], f"README.md names commits {hashes}; the history belongs in docs/benchmarks.md"


def test_docs_hold_pages_and_the_figures_they_show() -> None:
    """Run records (JSON, logs, tables) live in benchmarks/results/, so the built site stays small; docs/ keeps
    the pages and the images a page shows."""
    shown = {(page.parent / target).resolve() for page in DOCS.rglob("*.md")
             for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())}
    stray = sorted(str(path.relative_to(REPO)) for path in DOCS.rglob("*")
                   if path.is_file() and path.suffix != ".md" and path.resolve() not in shown)
    assert stray == [], f"docs/ holds files no page shows (run records go to benchmarks/results/): {stray}"


def test_site_builds_strict_and_covers_every_required_page(site: Path) -> None:
    pages = _nav_pages(_mkdocs_config()["nav"])
    for page in REQUIRED_PAGES:
        assert page in pages, f"{page} is not in mkdocs.yml's nav"
        assert (site / page.removesuffix(".md") / "index.html").exists(), f"{page} was not built"


def _docs_reference():
    """``scripts/docs_reference.py``, the generator of the pages' generated parts."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import docs_reference
    finally:
        sys.path.pop(0)
    return docs_reference


def test_generated_parts_of_the_pages_are_current() -> None:
    stale = _docs_reference().stale_pages()
    assert stale == [], f"generated parts differ from the code in {stale}: python scripts/docs_reference.py --write"


def test_the_committed_configuration_page_holds_its_tables() -> None:
    """Read in the repository (not the built site), the page shows every variable and tool, not a placeholder."""
    from pccl_torch.environment import VARIABLES

    text = (DOCS / "configuration.md").read_text()
    for variable in VARIABLES:
        assert f"| `{variable.name}` |" in text, f"{variable.name} has no row in docs/configuration.md"
    for tool in ("pccl-bench", "pccl-tune", "pccl-sim", "pccl-testbed"):
        assert f"### `{tool}`" in text, f"{tool} has no section in docs/configuration.md"


def test_troubleshooting_states_the_shipped_profile_s_metadata() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    assert _docs_reference().shipped_profile() in text
    assert "1 to 8 nodes" not in text  # the profile was trained on 2 to 8 nodes


def test_configuration_page_lists_every_variable_and_flag(site: Path) -> None:
    docs_reference = _docs_reference()
    from pccl_torch.environment import VARIABLES

    html = (site / "configuration" / "index.html").read_text()
    assert "generated:" not in html, "a generated-section marker was left unexpanded"
    for variable in VARIABLES:
        assert variable.name in html
    for _, parser in docs_reference._parsers():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in html, f"{parser.prog}'s {flag} is missing from the configuration page"


def test_environment_table_names_exactly_the_variables_the_code_reads() -> None:
    from pccl_torch.environment import VARIABLES

    source = _source_text().replace((REPO / "pccl_torch" / "environment.py").read_text(), "")
    in_code = set(re.findall(r"\bPCCL_[A-Z0-9_]*[A-Z0-9]\b", source))
    documented = {v.name for v in VARIABLES}
    assert in_code - documented == set(), f"read by the code but not in pccl_torch/environment.py: {in_code - documented}"
    assert documented - in_code == set(), f"documented but read nowhere: {documented - in_code}"
    for variable in VARIABLES:
        assert (DOCS / variable.page).exists(), f"{variable.name} points to a missing page {variable.page}"


def test_architecture_page_names_only_paths_that_exist() -> None:
    text = (DOCS / "architecture.md").read_text()
    paths = {match for match in PATH_LIKE.findall(text) if not match.startswith(("http", "~", "/"))}
    assert len(paths) >= 40, f"the architecture page should name the tree's paths; found {len(paths)}"
    missing = sorted(path for path in paths if not (REPO / path).exists())
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_module_appears_in_the_architecture_page() -> None:
    text = (DOCS / "architecture.md").read_text()
    for path in sorted((REPO / "pccl_torch").glob("*.py")):
        if path.name != "__init__.py":
            assert f"pccl_torch/{path.name}" in text, f"pccl_torch/{path.name} is not in docs/architecture.md"
    for package in sorted(p for p in (REPO / "pccl_torch").iterdir() if (p / "__init__.py").exists()):
        assert f"pccl_torch/{package.name}/" in text, f"pccl_torch/{package.name}/ is not in docs/architecture.md"


def test_troubleshooting_messages_are_the_code_s_own() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    fragments = re.findall(r"^Message: `([^`]+)`\s*$", text, flags=re.MULTILINE)
    assert len(fragments) >= 25, f"expected the user-facing errors listed; found {len(fragments)}"
    source = _source_text()
    stale = [fragment for fragment in fragments if fragment not in source]
    assert stale == [], f"docs/troubleshooting.md quotes messages the code no longer has: {stale}"
