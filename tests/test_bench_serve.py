"""bench/serve.py in a tiny configuration, end to end: the naive baseline server and the real
harnessrl service (Ray Serve, its own local Ray in a subprocess), 4 agents for a few seconds each,
an untrained critic with the real MiniLM encoder (no pipeline run needed). Checks the output's
structure and that no answer was a 5xx, never wall time or throughput."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    work = tmp_path_factory.mktemp("bench_serve")
    env = {**os.environ, "HARNESSRL_HOME": str(work / "home")}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, str(ROOT / "bench" / "serve.py"), "--untrained", "--agents", "4", "--duration-s", "3",
           "--warmup-s", "1", "--open-duration-s", "3", "--work-dir", str(work / "run"),
           "--json", str(work / "serve.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"json": json.loads((work / "serve.json").read_text()), "stdout": proc.stdout}


def _check_phase(r: dict, mode: str) -> None:
    assert r["mode"] == mode and r["agents"] == 4
    for key in ("requests_ok", "throughput_rps", "p50_ms", "p99_ms", "status", "unfinished", "others_cpu_share",
                "loadavg_start", "loadavg_end"):
        assert key in r, key
    assert r["requests_ok"] == r["status"].get("200", 0) >= 0
    assert not [k for k in r["status"] if k.startswith("5") or k.startswith("error:")], r["status"]
    if r["requests_ok"]:
        assert 0 < r["p50_ms"] <= r["p99_ms"]


def test_both_systems_measured_without_server_errors(result):
    out = result["json"]
    assert out["agents"] == 4 and out["k"] == 8 and out["episodes"] > 0 and out["distinct_texts"] > 0
    _check_phase(out["baseline"], "closed")
    _check_phase(out["harnessrl"]["closed"], "closed")
    # the closed loop reached the service: its cache saw the requests' texts
    cache = out["harnessrl"]["closed"]["embedding_cache"]
    assert cache["hits"] + cache["misses"] > 0
    # the service's defaults, as /v1/model reports them (the untrained critic is a frozen head: no prior)
    assert out["harnessrl"]["prior"] == {"behaviour_prior": False, "prior_weight": 1.0}
    if out["harnessrl"]["closed"]["throughput_rps"] > 0:
        _check_phase(out["harnessrl"]["open"], "open")
        assert out["harnessrl"]["open"]["rate"] == pytest.approx(0.5 * out["harnessrl"]["closed"]["throughput_rps"])
    assert "ratio_throughput" in out and isinstance(out["target_met"], bool)


def test_report_names_every_row(result):
    text = result["stdout"]
    for row in ("(a) harnessrl, closed loop", "(b) baseline, closed loop", "throughput (a)/(b)"):
        assert row in text
