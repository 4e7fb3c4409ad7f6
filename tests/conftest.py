"""Shared fixtures: one local Ray per test session (loopback), a private HARNESSRL_HOME with a
SQLite MLflow store, and small slices of the bundled TextWorldExpress sample."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest
import yaml
import pyarrow.dataset as pads

TRAIN_EPISODES = 40
TEST_EPISODES = 12
MODEL = "it-critic"


@pytest.fixture(scope="session")
def harnessrl_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("harnessrl_home")
    # Set before Ray starts: a local Ray's workers inherit this environment.
    os.environ["HARNESSRL_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("RAY_ADDRESS", None)
    return home


@pytest.fixture(scope="session")
def ray_local(harnessrl_home, s3):
    """Started after the S3 endpoint so that Ray's workers inherit its AWS_* environment."""
    from harnessrl.ray_runtime import init_ray, shutdown_ray

    init_ray(num_cpus=2)
    yield
    shutdown_ray()


def _slice(name: str, n: int, out: Path) -> Path:
    src = resources.files("harnessrl.examples").joinpath(f"data/{name}.jsonl.gz")
    lines = gzip.decompress(src.read_bytes()).splitlines(keepends=True)[:n]
    out.write_bytes(b"".join(lines))
    return out


@pytest.fixture(scope="session")
def sample_slice(tmp_path_factory) -> dict[str, Path]:
    """The first episodes of the bundled sample: `train` (train seeds) and `test` (held-out seeds)."""
    d = tmp_path_factory.mktemp("sample")
    return {"train": _slice("twx_train", TRAIN_EPISODES, d / "train.jsonl"),
            "test": _slice("twx_test", TEST_EPISODES, d / "test.jsonl")}


@pytest.fixture
def torch_one_thread():
    """Tiny tensors: one thread is fastest; a second one only spins on a shared 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def batches_of(table, size: int) -> list:
    """pyarrow batches as Ray Data's iter_batches(batch_format="pyarrow") yields them: tables."""
    return [table.slice(i, size) for i in range(0, table.num_rows, size)]


class ShardReader:
    """A shard reader like Ray Train's DataIterator.iter_batches over a pyarrow table: batches of
    `batch_size` (the last may be short), in an order shuffled by `local_shuffle_seed` when a buffer
    is asked for; `epochs` counts the passes a worker asked for."""

    def __init__(self, table):
        self.table, self.epochs = table, 0

    def __call__(self, batch_size, batch_format, prefetch_batches=1, local_shuffle_buffer_size=None,
                 local_shuffle_seed=None):
        import numpy as np

        self.epochs += 1
        t = self.table
        if local_shuffle_buffer_size:
            t = t.take(np.random.default_rng(local_shuffle_seed).permutation(t.num_rows))
        return iter(batches_of(t, batch_size))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(store: Path, artifacts: str, port: int, env: dict[str, str], log: Path,
                        timeout_s: float = 120) -> subprocess.Popen:
    """`mlflow server` (SQLite store at `store`) on 127.0.0.1:`port` in a process group of its own
    (stop it with os.killpg), returned once /health answers; its output goes to `log`."""
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store}",
         "--artifacts-destination", artifacts, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if time.time() > deadline:
            raise RuntimeError(f"mlflow server not healthy after {timeout_s:.0f} s: {log.read_text()[-3000:]}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def pipeline_run(ray_local, sample_slice, tmp_path_factory):
    """The quickstart pipeline on a slice of the sample with the frozen head (the fastest to train; the
    tests of this fixture read its state vectors, tool head and penalty); its model is registered as
    MODEL@champion. The default head's run is tests/test_reader_head.py's."""
    from harnessrl.config import parse_pipeline
    from harnessrl.jobs.pipeline import run_pipeline

    raw = {
        "name": "integration",
        "output_dir": str(tmp_path_factory.mktemp("integration")),
        "data": {"train": [str(sample_slice["train"])], "heldout": [str(sample_slice["test"])]},
        "render": {"window": 3, "max_chars": 1500, "tool_from": "first_word"},
        "encoder": {"batch_size": 32, "max_seq_length": 128},
        "train": {"head": "frozen", "steps": 300, "batch_size": 128, "checkpoint_every": 150, "log_every": 50,
                  "alpha": 0.3},
        "registry": {"experiment": "integration", "model_name": MODEL, "alias": "champion"},
        "evaluate": {"max_heldout_steps": 200},
        "serve": {"port": free_port(), "smoke_requests": 3},
    }
    summary = run_pipeline(parse_pipeline(raw))
    # The same pipeline as a YAML file, for tests that drive the CLI against this run.
    summary["pipeline_yaml"] = Path(raw["output_dir"]) / "pipeline.yaml"
    summary["pipeline_yaml"].write_text(yaml.safe_dump(raw))
    return summary


def twx_unavailable() -> str | None:
    """Why TextWorldExpress games cannot be played here (None: they can): tests that play skip."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("textworld_express") is None:
        return "textworld_express is not installed (pip install 'harnessrl[twx]')"
    if shutil.which("java") is None:
        return "java is not on PATH (TextWorldExpress runs in a JVM)"
    return None


def import_bench(name: str):
    """A bench/ script as a module (bench/ is no package: its scripts import each other by name)."""
    import importlib

    folder = str(Path(__file__).resolve().parents[1] / "bench")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def table(path: Path):
    return pads.dataset(str(path), format="parquet").to_table()


BROKEN = [
    b"{not json",
    b'{"steps": [{"action": "x"}]}',
    b'{"episode_id": "bad-utf8", "steps": [{"action": "\xff\xfe"}]}',
    b'{"episode_id": "empty", "steps": []}',
    b'{"episode_id": "no-action", "steps": [{"observation": "o"}]}',
    b"[1, 2, 3]",
]


@pytest.fixture(scope="session")
def work(tmp_path_factory, sample_slice):
    """Sources for the stage chain: the sample slice plus one broken record of each kind."""
    d = tmp_path_factory.mktemp("stages")
    broken = d / "broken.jsonl"
    # One broken line of each kind, plus a duplicate of the sample's first episode.
    first = sample_slice["train"].read_bytes().splitlines()[0]
    broken.write_bytes(b"\n".join([*BROKEN, first]) + b"\n")
    return {"dir": d, "sources": [str(sample_slice["train"]), str(broken)]}


@pytest.fixture(scope="session")
def ingested(ray_local, work):
    from harnessrl.pipelines.ingest import ingest

    return ingest(work["sources"], str(work["dir"] / "ingest"))


@pytest.fixture(scope="session")
def transitions(ingested, work):
    from harnessrl.config import RenderConfig
    from harnessrl.pipelines.transitions import build_transitions
    from harnessrl.rewards import load_recipe

    return build_transitions(str(work["dir"] / "ingest"), str(work["dir"] / "transitions"), load_recipe("default"),
                             RenderConfig(window=3, max_chars=1500, tool_from="first_word", details=4))


@pytest.fixture(scope="session")
def encoded(transitions, work):
    from harnessrl.config import EncoderConfig
    from harnessrl.pipelines.encode import encode

    return encode(str(work["dir"] / "transitions"), str(work["dir"] / "encoded"),
                  EncoderConfig(batch_size=32, max_seq_length=128))




@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A real S3 HTTP endpoint on loopback (moto's server mode) with one bucket; boto3 and
    pyarrow reach it through AWS_ENDPOINT_URL. Stopped by its PID at the end of the session."""
    import secrets
    import subprocess
    import sys
    import time

    import boto3

    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
           # distinctive and per session, so that tests/reliability/test_security.py can look for leaks
           "AWS_SECRET_ACCESS_KEY": "s3-secret-" + secrets.token_hex(12), "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = boto3.client("s3")
        for _ in range(100):  # up to ~20 s for the server to listen
            try:
                client.create_bucket(Bucket="harnessrl-test")
                break
            except Exception:
                if proc.poll() is not None:
                    raise RuntimeError(f"moto server exited: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        else:
            raise RuntimeError("moto server did not come up")
        yield {"endpoint": env["AWS_ENDPOINT_URL"], "bucket": "harnessrl-test", "client": client}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
