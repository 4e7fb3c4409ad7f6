"""`harnessrl serve` as a user runs it: joins a running Ray cluster by address, serves the
registered model over HTTP on the given port, and shuts the app down on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from conftest import MODEL, free_port

pytestmark = pytest.mark.integration


def test_cli_serve_joins_cluster_and_stops_on_interrupt(pipeline_run, ray_local):
    import ray

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "serve", "--model", f"{MODEL}@champion", "--port", str(port),
         "--address", ray.get_runtime_context().gcs_address],
        env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "service did not come up within 240 s"
            time.sleep(1)
        line = proc.stdout.readline()  # the CLI says it is serving once the deployment is complete
        assert f"serving models:/{MODEL}@champion at {url}" in line, line
        r = httpx.post(f"{url}/v1/score", json={"state": "Task: t\nNow: a room", "candidates": ["go east", "look"]},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"]["name"] == MODEL
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "stopping the service" in out
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/healthz", timeout=2)
