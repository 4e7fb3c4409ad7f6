"""`harnessrl serve` as a user runs it: joins a running Ray cluster by address, serves the
registered model over HTTP on the given port, and shuts the app down on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conftest import MODEL, free_port

pytestmark = pytest.mark.integration


def test_cli_serve_joins_cluster_and_stops_on_interrupt(pipeline_run, ray_local):
    """With the encoder as a deployment of its own (`--set encoder=...`); deploy below runs it inline."""
    import ray

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harnessrl", "serve", "--model", f"{MODEL}@champion", "--port", str(port),
         "--set", "encoder={num_cpus: 0.5, max_batch_size: 16}", "--address", ray.get_runtime_context().gcs_address],
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
        assert "harnessrl_encoder_cache_misses_total 3.0" in httpx.get(f"{url}/metrics", timeout=30).text
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "stopping the service" in out
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/healthz", timeout=2)


SHIPPED = Path(__file__).resolve().parents[1] / "serving" / "serve.yaml"


def test_shipped_serve_yaml_validates_and_a_bad_field_is_exit_code_2(tmp_path, capsys):
    from harnessrl.cli import main
    from harnessrl.config import load_serve
    from harnessrl.serving.app import deployment_options

    cfg = load_serve(SHIPPED)
    assert cfg.model and cfg.autoscaling is not None and cfg.max_candidates >= 1 and cfg.prior_weight == 1.0
    opts = deployment_options(cfg)
    assert opts["autoscaling_config"]["max_replicas"] == cfg.autoscaling.max_replicas
    assert "num_replicas" not in opts and opts["ray_actor_options"]["num_cpus"] == cfg.num_cpus
    fixed = load_serve(SHIPPED, ["autoscaling=null", "replicas=3"])
    assert deployment_options(fixed)["num_replicas"] == 3

    bad = tmp_path / "bad.yaml"
    bad.write_text(SHIPPED.read_text() + "max_candidatez: 9\n")
    assert main(["serve", "--config", str(bad)]) == 2  # before any Ray starts
    err = capsys.readouterr().err
    assert "invalid serve configuration" in err and "max_candidatez: Extra inputs are not permitted" in err
    assert main(["serve", "--config", str(SHIPPED), "--set", "replicas=2"]) == 2  # replicas and autoscaling
    assert "either replicas" in capsys.readouterr().err
    assert main(["serve", "deploy", "--config", str(SHIPPED), "--port", "-1"]) == 2
    assert "port" in capsys.readouterr().err


def test_cli_deploys_the_shipped_yaml_to_a_cluster_and_returns(pipeline_run, ray_local):
    import ray

    from harnessrl.serving import app as serving

    port = free_port()
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "harnessrl", "serve", "deploy", "--config", str(SHIPPED),
           "--model", f"{MODEL}@champion", "--port", str(port), "--address", address]
    url = f"http://127.0.0.1:{port}"
    try:
        done = subprocess.run(cmd, env=os.environ.copy(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"deployed models:/{MODEL}@champion at {url}" in done.stdout
        # the command has exited; the app keeps serving on the cluster
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
        r = httpx.post(f"{url}/v1/score", json={"state": "Task: t\nNow: a room", "candidates": ["go east", "look"]},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"]["name"] == MODEL
        stop = subprocess.run([sys.executable, "-m", "harnessrl", "serve", "stop", "--address", address],
                              env=os.environ.copy(), capture_output=True, text=True, timeout=300)
        assert stop.returncode == 0, stop.stderr[-3000:]
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 404  # the proxy is up, the app is gone
    finally:
        serving.stop()


def _wait_healthy(url: str, timeout_s: float = 300) -> None:
    deadline = time.time() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, f"{url} did not come up within {timeout_s:.0f} s"
        time.sleep(2)


def test_deploy_through_the_dashboard_and_with_rays_own_serve_cli(pipeline_run, ray_local, tmp_path):
    """Ray's convention, `--address http://HEAD:8265`: `harnessrl serve deploy` and `serve stop`
    go through the dashboard's Serve REST API; the file `harnessrl serve config` prints deploys
    with Ray's own `serve deploy`. The session's local Ray stands in for a cluster: its dashboard
    is at RAY_API_SERVER_ADDRESS, and its processes have this session's HARNESSRL_HOME (the
    registry the app builder resolves the model in)."""
    from harnessrl.serving import app as serving

    dashboard = os.environ["RAY_API_SERVER_ADDRESS"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RAY_AUTH_MODE": "token"} if (Path.home() / ".ray" / "auth_token").is_file() else dict(
        os.environ)
    flags = ["--config", str(SHIPPED), "--model", f"{MODEL}@champion", "--port", str(port), "--set", "autoscaling=null",
             "--set", "replicas=1", "--set", "reload_every_s=0"]
    state = {"state": "Task: t\nNow: a room", "candidates": ["go east", "look"]}

    def harnessrl(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harnessrl", *args], env=env, capture_output=True, text=True,
                              timeout=600)

    try:
        done = harnessrl("serve", "deploy", *flags, "--address", dashboard)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"deployed models:/{MODEL}@champion on the cluster at {dashboard}" in done.stdout, done.stdout
        r = httpx.post(f"{url}/v1/score", json=state, timeout=60)
        assert r.status_code == 200 and r.json()["model"]["name"] == MODEL
        stop = harnessrl("serve", "stop", "--address", dashboard)
        assert stop.returncode == 0 and "removed the app 'harnessrl'" in stop.stdout, stop.stderr[-3000:]
        assert httpx.get(f"{url}/healthz", timeout=30).status_code == 404  # the proxy is up, the app is gone

        printed = harnessrl("serve", "config", *flags)
        assert printed.returncode == 0, printed.stderr
        app_file = tmp_path / "serve_app.yaml"
        app_file.write_text(printed.stdout)
        # Ray's own `serve` command (its console-script entry point, whichever venv holds the script)
        serve_cli = "import sys; from ray.serve.scripts import cli; sys.argv[0] = 'serve'; sys.exit(cli())"
        ray_serve = subprocess.run([sys.executable, "-c", serve_cli, "deploy", str(app_file), "--address", dashboard],
                                   env=env, capture_output=True, text=True, timeout=300)
        assert ray_serve.returncode == 0, ray_serve.stderr[-3000:]
        _wait_healthy(url)
        r = httpx.post(f"{url}/v1/score", json=state, timeout=60)
        assert r.status_code == 200 and r.json()["model"]["name"] == MODEL
    finally:
        serving.stop()
