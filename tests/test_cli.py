"""The CLI's contract for user mistakes: one clear line on stderr, no stack trace, a meaningful exit code."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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
    (["score", "--model", "m@champion", "--state", "s", "--candidate", "a", "--prior-weight", "-1"],
     "--prior-weight must be a finite number >= 0"),
    (["evaluate", "--model", "m@champion", "--data", "x.jsonl", "--prior-weight", "nan"],
     "--prior-weight must be a finite number >= 0"),
])
def test_score_and_evaluate_argument_errors(tmp_path, args, text):
    _assert_clean_error(harnessrl(*args, home=tmp_path), 2, text)


def test_version_and_top_level_help(tmp_path):
    from harnessrl import __version__

    out = harnessrl("--version", home=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == f"harnessrl {__version__}"
    helped = harnessrl("--help", home=tmp_path)
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    # the description is a whole sentence, and every exit code is listed
    assert "learn a critic for LLM agents from their logs with offline RL, on Ray, and serve it." in text
    for code in ("0 ok", "1 internal error", "2 bad arguments", "7 a submitted job failed", "8 the Ray cluster cannot "
                 "be reached", "130 interrupted"):
        assert code in text, code


def test_every_flag_and_argument_has_help():
    import argparse

    from harnessrl.cli import build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "harnessrl")
    assert not missing, missing


def test_validate_and_dry_run_check_without_running(tmp_path):
    started = time.time()
    ok = harnessrl("validate", "pipelines/quickstart.yaml", home=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "valid: pipeline 'quickstart'" in ok.stdout and "encoder builtin:all-MiniLM-L6-v2 (dim 384)" in ok.stdout
    dry = harnessrl("run", "pipelines/quickstart.yaml", "--dry-run", "--set", "train.steps=5", home=tmp_path)
    assert dry.returncode == 0 and "valid:" in dry.stdout, dry.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()  # nothing ran
    bad = tmp_path / "p.yaml"
    for text, code, message in [
        (f"data: {{train: ['{tmp_path}/absent.jsonl']}}\n", 3, "source not found"),
        ("data: {train: ['builtin:twx-train'], outcomes: /absent/outcomes.jsonl}\n", 3, "outcomes file not found"),
        ("data: {train: ['builtin:twx-train']}\nrewards: no-such-recipe\n", 2, "unknown builtin reward recipe"),
        ("data: {train: ['builtin:twx-train']}\nencoder: {model: /absent/model}\n", 2, "encoder model"),
        ("data: {train: ['builtin:twx-train']}\ntrain: {stepz: 3}\n", 2, "train.stepz"),
    ]:
        bad.write_text(text)
        for cmd in (["validate", str(bad)], ["run", str(bad), "--dry-run"]):
            _assert_clean_error(harnessrl(*cmd, home=tmp_path), code, message)
    assert time.time() - started < 120  # no Ray was started for any of it
    assert not list(tmp_path.glob("runs"))


@pytest.mark.parametrize("args", [
    ["ingest", "/absent/logs", "--out", "OUT"],
    ["ingest", "/absent/decisions", "--format", "decisions", "--out", "OUT"],
    ["ingest", "builtin:twx-train", "--outcomes", "/absent/outcomes.jsonl", "--out", "OUT"],
    ["evaluate", "--model", "m@champion", "--data", "/absent/heldout.jsonl"],
])
def test_missing_paths_fail_before_ray_starts(tmp_path, args):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    started = time.time()
    out = harnessrl(*args, home=tmp_path)
    _assert_clean_error(out, 3, "not found")
    assert "Token authentication" not in out.stderr and "ray" not in out.stderr.lower().split("error:")[0]
    assert time.time() - started < 60, "Ray was started before the path was checked"


@pytest.mark.parametrize("args,code,text", [
    (["jobs", "list", "--address", "http://127.0.0.1:1"], 8, "cannot reach the Ray job API at http://127.0.0.1:1"),
    (["jobs", "list", "--address", "127.0.0.2:1"], 8, "http://127.0.0.2:8265 (Ray's default dashboard port"),
    (["serve", "deploy", "--model", "m@champion", "--address", "http://127.0.0.1:1"], 8, "cannot reach the Ray job API"),
    (["serve", "stop", "--address", "http://127.0.0.1:1"], 8, "cannot reach the Ray job API"),
    (["serve", "stop", "--address", "127.0.0.1:1"], 8, "cannot reach the Ray cluster at 127.0.0.1:1"),
    (["run", "pipelines/quickstart.yaml", "--address", "127.0.0.1:1"], 8, "cannot reach the Ray cluster at 127.0.0.1:1"),
    (["run", "pipelines/quickstart.yaml", "--address", "http://127.0.0.1:1"], 8, "cannot reach the Ray cluster at "
                                                                                  "127.0.0.1:6379"),
    (["run", "pipelines/quickstart.yaml", "--address", "not a host:x"], 2, "not a Ray address"),
    (["jobs", "list", "--address", "host:99999"], 2, "not a Ray address"),
])
def test_unreachable_or_malformed_addresses_are_one_line(tmp_path, args, code, text):
    out = harnessrl(*args, home=tmp_path)
    _assert_clean_error(out, code, text)
    # one line of error; harnessrl's own stage lines (the console's first) may come before it
    assert len([line for line in out.stderr.splitlines() if not line.startswith("[harnessrl ")]) == 1, out.stderr


def test_addresses_convert_as_each_command_needs(monkeypatch):
    from harnessrl import addresses

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    assert addresses.gcs_address(None) is None
    assert addresses.gcs_address("auto") == "auto"
    assert addresses.gcs_address("ray://head:10001") == "ray://head:10001"
    assert addresses.gcs_address("head:6380") == "head:6380" and addresses.gcs_address("head") == "head:6379"
    assert addresses.gcs_address("http://head:8265") == "head:6379"
    assert addresses.gcs_address("https://[::1]:8265/") == "[::1]:6379"
    assert addresses.job_api_url("http://head:8265/") == "http://head:8265"
    assert addresses.job_api_url("head:6379") == "http://head:8265"
    assert addresses.job_api_url("ray://head:10001") == "http://head:8265"
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.5:8265")
    assert addresses.gcs_address(None) == "10.0.0.5:6379" and addresses.job_api_url(None) == "http://10.0.0.5:8265"


def test_serve_port_or_host_that_cannot_be_bound_is_one_line_before_ray(tmp_path):
    import socket

    model = tmp_path / "critic"
    model.mkdir()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        started = time.time()
        out = harnessrl("serve", "--model", str(model), "--port", str(port), home=tmp_path)
        _assert_clean_error(out, 2, f"cannot serve on 127.0.0.1:{port}")
        assert time.time() - started < 60 and "Token authentication" not in out.stderr  # Ray never started
    elsewhere = harnessrl("serve", "--model", str(model), "--host", "192.0.2.1", "--port", "8000", home=tmp_path)
    _assert_clean_error(elsewhere, 2, "cannot serve on 192.0.2.1:8000")


@pytest.mark.parametrize("flags", [[], ["--until", "encode"], ["--json", "--force", "--until", "train"]])
def test_a_submitted_job_runs_the_pipeline_with_the_submit_flags(flags):
    """`submit`'s --json, --force and --until reach the job: its entrypoint, read by `harnessrl`'s own
    parser, is `run pipeline.yaml` with the same values."""
    import shlex

    from harnessrl.cli import build_parser
    from harnessrl.cli_jobs import run_entrypoint

    parser = build_parser()
    submitted = parser.parse_args(["submit", "p.yaml", *flags])
    command = shlex.split(run_entrypoint(submitted))
    assert command[:3] == ["python", "-m", "harnessrl"]
    job = parser.parse_args(command[3:])
    assert job.command == "run" and job.pipeline == "pipeline.yaml"
    assert (job.json, job.force, job.until) == (submitted.json, submitted.force, submitted.until)
    assert job.until == (flags[flags.index("--until") + 1] if "--until" in flags else None)
