"""Repository layout: one `harnessrl` import root over four top-level folders, no stdlib shadowing,
and the dependency direction core <- pipelines/jobs/serving <- CLI, for every import in every file
(the CLI reaches pipelines, jobs and serving only inside functions)."""

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
CLI_MODULES = ("harnessrl.cli", "harnessrl.cli_jobs", "harnessrl.cli_rewards", "harnessrl.cli_serve")
# the command line: its modules and `python -m harnessrl`
CLI_FILES = (*(CORE / f"{m.rsplit('.', 1)[1]}.py" for m in CLI_MODULES), CORE / "__main__.py")


def _imports(tree: ast.AST) -> list[tuple[str, bool]]:
    """Every import of a module as (module name, lazy): lazy when inside a function (it runs when
    the function is called); anything else runs at import time, `if`/`try` blocks and class
    bodies at module level included. `from harnessrl import pipelines` names harnessrl.pipelines."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, lazy))
                found.extend((f"{child.module}.{alias.name}", lazy) for alias in child.names)
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def _imported_modules(tree: ast.AST, lazy: bool | None = None) -> set[str]:
    """Names imported at module level (lazy=False), inside functions (lazy=True) or anywhere (None)."""
    return {name for name, is_lazy in _imports(tree) if lazy is None or is_lazy == lazy}


def _hits(names: set[str], forbidden: tuple[str, ...]) -> set[str]:
    return {n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)}


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


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
    """The core's modules other than the CLI."""
    return sorted(p for p in CORE.rglob("*.py") if p not in CLI_FILES)


def test_core_file_list_is_not_empty():
    names = {p.relative_to(CORE).as_posix() for p in _core_files()}
    assert {"rewards.py", "render.py", "formats/native.py", "algorithms/iql.py"} <= names
    assert not {"cli.py", "cli_jobs.py", "cli_rewards.py", "cli_serve.py", "__main__.py"} & names
    assert all(p.is_file() for p in CLI_FILES)


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: p.relative_to(CORE).as_posix())
def test_core_never_imports_outer_packages_or_the_cli(path):
    """The core holds the concepts: it depends on none of the folders that use it, at any level."""
    assert _hits(_imported_modules(_tree(path)), OUTER + CLI_MODULES) == set()


@pytest.mark.parametrize("path", CLI_FILES, ids=lambda p: p.name)
def test_cli_reaches_outer_packages_only_inside_functions(path):
    """The CLI drives the pipelines, jobs and service, but only inside the command that needs
    them (`harnessrl --help`, `rewards show` or a bad argument starts no Ray, MLflow or Serve
    import): never at module level."""
    assert _hits(_imported_modules(_tree(path), lazy=False), OUTER) == set()


def test_the_cli_does_use_outer_packages_lazily():
    """The rule above is about real imports: the CLI has them, inside its commands."""
    lazy = set().union(*(_imported_modules(_tree(p), lazy=True) for p in CLI_FILES))
    assert {"harnessrl.jobs.pipeline", "harnessrl.pipelines.ingest", "harnessrl.serving.app"} <= _hits(lazy, OUTER)


@pytest.mark.parametrize("path", sorted(p for d in ("pipelines", "jobs", "serving") for p in (ROOT / d).rglob("*.py")),
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_outer_packages_never_import_the_cli(path):
    """The CLI is the top: the service, jobs and pipelines take what they share from the core."""
    assert _hits(_imported_modules(_tree(path)), CLI_MODULES) == set()


@pytest.mark.parametrize("path", sorted((ROOT / "serving").rglob("*.py")), ids=lambda p: p.name)
def test_serving_does_not_import_pipelines_or_jobs(path):
    assert _hits(_imported_modules(_tree(path)), OUTER[:2]) == set()


def test_import_scanner_detects_forbidden_imports():
    """The scanner itself must be able to fail: module level includes `if`/`try` blocks and class
    bodies, lazy is inside a function (or a method)."""
    tree = ast.parse("import os\nfrom harnessrl.pipelines.ingest import ingest\nfrom harnessrl import jobs\n"
                     "try:\n    import harnessrl.serving.encoder\nexcept ImportError:\n    pass\n"
                     "if True:\n    from harnessrl.cli import main\n"
                     "class C:\n    import harnessrl.jobs.train\n    def m(self):\n        import harnessrl.jobs.evaluate\n"
                     "def f():\n    import harnessrl.serving.app\n")
    eager = _hits(_imported_modules(tree, lazy=False), OUTER + CLI_MODULES)
    assert eager == {"harnessrl.pipelines.ingest", "harnessrl.pipelines.ingest.ingest", "harnessrl.jobs",
                     "harnessrl.serving.encoder", "harnessrl.cli", "harnessrl.cli.main", "harnessrl.jobs.train"}
    assert _hits(_imported_modules(tree, lazy=True), OUTER) == {"harnessrl.jobs.evaluate", "harnessrl.serving.app"}
    assert _hits(_imported_modules(tree), OUTER + CLI_MODULES) == eager | {"harnessrl.jobs.evaluate",
                                                                          "harnessrl.serving.app"}
    assert _hits({"harnessrl.pipelinesx", "harnessrl", "os", "harnessrl.client"}, OUTER + CLI_MODULES) == set()
