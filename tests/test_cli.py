"""The CLI's contract for user mistakes: one clear line on stderr, no stack trace, a meaningful exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def harnessrl(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESSRL_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "harnessrl.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def _assert_clean_error(out: subprocess.CompletedProcess, code: int, text: str) -> None:
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr
    assert text in out.stderr


def test_missing_pipeline_file(tmp_path):
    _assert_clean_error(harnessrl("run", str(tmp_path / "nope.yaml"), home=tmp_path), 2, "pipeline file not found")


def test_invalid_pipeline_key(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("data: {train: [x]}\ntrain: {stepz: 3}\n")
    _assert_clean_error(harnessrl("run", str(p), home=tmp_path), 2, "train.stepz")


def test_bad_override(tmp_path):
    _assert_clean_error(harnessrl("run", "pipelines/quickstart.yaml", "--set", "train.steps", home=tmp_path), 2,
                        "key=value")


def test_missing_source_fails_before_any_work(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(f"data: {{train: ['{tmp_path}/absent/*.jsonl']}}\n")
    _assert_clean_error(harnessrl("run", str(p), home=tmp_path), 3, "no files match")


def test_unknown_model(tmp_path):
    out = harnessrl("score", "--model", "nosuch@champion", "--state", "s", "--candidate", "a", home=tmp_path)
    _assert_clean_error(out, 4, "not found in the registry")


@pytest.mark.parametrize("args,text", [
    (["score", "--model", "plainname", "--state", "s", "--candidate", "a"], "expected NAME@ALIAS"),
    (["score", "--model", "m@champion", "--state", "s"], "at least one --candidate"),
])
def test_score_argument_errors(tmp_path, args, text):
    _assert_clean_error(harnessrl(*args, home=tmp_path), 2, text)
