"""Repository layout: one `harnessrl` import root over four top-level folders, no stdlib shadowing,
and the dependency direction core <- pipelines/jobs/serving (never the other way)."""

from __future__ import annotations

import ast
import platform as std_platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "platform" / "harnessrl"
OUTER = ("harnessrl.pipelines", "harnessrl.jobs", "harnessrl.serving")


def _imported_modules(tree: ast.AST, top_level_only: bool) -> set[str]:
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # `from harnessrl import pipelines` imports harnessrl.pipelines too
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _hits(names: set[str], forbidden: tuple[str, ...]) -> set[str]:
    return {n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)}


def test_stdlib_platform_not_shadowed_from_repo_root():
    proc = subprocess.run(
        [sys.executable, "-c", "import platform; print(platform.system())"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == std_platform.system()
    assert proc.stdout.strip() in {"Linux", "Darwin", "Windows"}


def test_platform_folder_is_not_a_package():
    assert (CORE / "__init__.py").is_file()
    assert not (ROOT / "platform" / "__init__.py").exists()


@pytest.mark.parametrize(
    "module, folder",
    [
        ("harnessrl", "platform/harnessrl"),
        ("harnessrl.pipelines", "pipelines"),
        ("harnessrl.jobs", "jobs"),
        ("harnessrl.serving", "serving"),
    ],
)
def test_package_maps_to_folder(module, folder):
    import importlib

    mod = importlib.import_module(module)
    assert Path(mod.__file__).resolve().parent == (ROOT / folder).resolve()


def _core_files() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if p.name != "cli.py" or p.parent != CORE)


def test_core_file_list_is_not_empty():
    names = {p.relative_to(CORE).as_posix() for p in _core_files()}
    assert {"rewards.py", "render.py", "formats/native.py", "algorithms/iql.py"} <= names
    assert "cli.py" not in names


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.relative_to(CORE).as_posix())
def test_core_does_not_import_outer_packages_at_module_level(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    assert _hits(_imported_modules(tree, top_level_only=True), OUTER) == set()


@pytest.mark.parametrize("path", sorted((ROOT / "serving").rglob("*.py")), ids=lambda p: p.name)
def test_serving_does_not_import_pipelines_or_jobs(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    assert _hits(_imported_modules(tree, top_level_only=False), OUTER[:2]) == set()


def test_import_scanner_detects_forbidden_imports():
    """The scanner itself must be able to fail."""
    tree = ast.parse("import os\nfrom harnessrl.pipelines.ingest import ingest\nfrom harnessrl import jobs\n"
                     "def f():\n    import harnessrl.serving.app\n")
    top = _imported_modules(tree, top_level_only=True)
    assert _hits(top, OUTER) == {"harnessrl.pipelines.ingest", "harnessrl.pipelines.ingest.ingest", "harnessrl.jobs"}
    everywhere = _hits(_imported_modules(tree, top_level_only=False), OUTER)
    assert everywhere == _hits(top, OUTER) | {"harnessrl.serving.app"}
    assert _hits({"harnessrl.pipelinesx", "harnessrl", "os"}, OUTER) == set()
