"""`encoder.model` beyond the bundled MiniLM: a local sentence-transformers folder, or a Hugging
Face model id already in the local Hugging Face cache (offline: HF_HUB_OFFLINE=1, nothing is
downloaded), and a clear error for anything else. The cache here is a real Hugging Face hub
cache layout (models--ORG--NAME/snapshots/REV, refs/main) holding the bundled MiniLM's files, read
by huggingface_hub itself, in a fresh process (`harnessrl validate`, then loading the model)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    from harnessrl.encoders import BUILTIN_MINILM, resolve_model_path

    root = tmp_path_factory.mktemp("hf") / "hub"
    for repo in ("models--acme--minilm", "models--sentence-transformers--tiny-minilm"):
        snap = root / repo / "snapshots" / REV
        shutil.copytree(resolve_model_path(BUILTIN_MINILM), snap)
        (root / repo / "refs").mkdir()
        (root / repo / "refs" / "main").write_text(REV)
    return root


def _run(args: list[str], hub: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "HARNESSRL_HOME": str(home)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)


def _pipeline(tmp_path: Path, model: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(f"data: {{train: ['builtin:twx-train']}}\nencoder: {{model: '{model}', max_seq_length: 128}}\n")
    return p


@pytest.mark.parametrize("model,shown", [("acme/minilm", "acme/minilm"), ("tiny-minilm", "tiny-minilm")])
def test_a_cached_hugging_face_id_validates_and_loads(hub, tmp_path, model, shown):
    out = _run(["-m", "harnessrl", "validate", str(_pipeline(tmp_path, model))], hub, tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"encoder {shown} (dim 384)" in out.stdout
    prog = ("import sys; from harnessrl.encoders import load_encoder, encoder_identity, BUILTIN_MINILM; "
            "m, ident = load_encoder(sys.argv[1], 'cpu', 128); builtin = encoder_identity(BUILTIN_MINILM, 128); "
            "assert ident.weights_hash == builtin.weights_hash and ident.dim == 384, (ident, builtin); "
            "assert encoder_identity(sys.argv[1], 128) == ident; print(ident.model_name)")
    loaded = _run(["-c", prog, model], hub, tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.strip().splitlines()[-1] == shown  # the identity names the model as configured


def test_a_local_folder_is_accepted_and_a_folder_without_a_model_is_refused(hub, tmp_path):
    folder = hub / "models--acme--minilm" / "snapshots" / REV
    out = _run(["-m", "harnessrl", "validate", str(_pipeline(tmp_path, str(folder)))], hub, tmp_path)
    assert out.returncode == 0 and f"encoder {REV}" in out.stdout, out.stderr  # named by its folder
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    refused = _run(["-m", "harnessrl", "validate", str(_pipeline(tmp_path, str(empty)))], hub, tmp_path)
    assert refused.returncode == 2 and "is not a sentence-transformers model folder" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_id_not_in_the_cache_is_a_clear_error(hub, tmp_path):
    out = _run(["-m", "harnessrl", "validate", str(_pipeline(tmp_path, "acme/not-downloaded"))], hub, tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "not a Hugging Face model in the local cache" in out.stderr and str(hub) in out.stderr
    assert "hf download acme/not-downloaded" in out.stderr
