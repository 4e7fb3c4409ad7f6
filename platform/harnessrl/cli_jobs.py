"""`harnessrl lineage`, `submit` and `jobs`: where a model came from, and pipelines run as Ray jobs.

A submitted pipeline is the same `harnessrl run` a laptop runs, started by Ray's job
supervisor on the cluster: the resolved pipeline config travels as the job's working dir,
this package's code as a `py_modules` entry (so the cluster runs the submitter's version),
and the tracking/storage settings named below as environment variables. Secrets travel only
when named with `--env` (the runtime environment is visible in the Ray dashboard).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from harnessrl.errors import ConfigError, HarnessError
from harnessrl.ray_runtime import ARROW_POOL
from harnessrl.settings import redact

EXIT_LINEAGE_MISMATCH = 6
EXIT_JOB_FAILED = 7
# Forwarded to a submitted job when set here: where to track and store, never credentials.
FORWARDED_ENV = ("MLFLOW_TRACKING_URI", "HARNESSRL_HOME", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                 "AWS_DEFAULT_REGION", "AWS_REGION", "HF_HUB_OFFLINE", "ARROW_DEFAULT_MEMORY_POOL")


# ---- lineage --------------------------------------------------------------------------------------
def cmd_lineage(args: argparse.Namespace) -> int:
    from harnessrl import lineage, registry

    uri = registry.model_uri(args.model, "lineage")
    if not registry.in_registry(uri):
        raise ConfigError(f"{args.model!r}: lineage is kept in the registry; give NAME@ALIAS or NAME/VERSION")
    chain = lineage.chain(uri)
    if args.verify:
        lineage.verify(chain)
    print(json.dumps(chain.to_dict(), indent=2) if args.json else lineage.render(chain))
    return EXIT_LINEAGE_MISMATCH if args.verify and not chain.verified else 0


# ---- Ray jobs -------------------------------------------------------------------------------------
def job_client(address: str | None):
    """A JobSubmissionClient for the cluster (any --address form; harnessrl.addresses)."""
    from harnessrl import addresses

    return addresses.api_client("job", address)


def _absolute(path: str | None) -> str | None:
    if path is None or path.startswith("builtin:") or "://" in path:
        return path
    return str(Path(path).absolute())


def resolved_pipeline(path: str, overrides: list[str]) -> dict:
    """The pipeline config as the job will run it: overrides applied, validated here (a bad
    config fails before anything is sent), local paths made absolute for a shared disk."""
    from harnessrl.config import load_pipeline

    cfg = load_pipeline(path, overrides)
    data = cfg.model_dump(mode="json")
    data["data"]["train"] = [_absolute(p) for p in cfg.data.train]
    data["data"]["heldout"] = [_absolute(p) for p in cfg.data.heldout]
    data["data"]["outcomes"] = _absolute(cfg.data.outcomes)
    data["output_dir"] = _absolute(cfg.output_dir)
    data["ray_address"] = None  # the job joins the cluster it runs on (the supervisor sets RAY_ADDRESS)
    return data


def package_snapshot(dest: Path) -> Path:
    """This package's code as one importable folder `dest/harnessrl` (an editable install maps
    harnessrl.jobs, .pipelines and .serving from other folders; a py_modules entry must hold all)."""
    import shutil

    import harnessrl
    import harnessrl.jobs
    import harnessrl.pipelines
    import harnessrl.serving

    root = Path(harnessrl.__path__[0]).resolve()
    out = dest / "harnessrl"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(root, out, ignore=ignore)
    for sub in (harnessrl.jobs, harnessrl.pipelines, harnessrl.serving):
        src = Path(sub.__path__[0]).resolve()
        if not src.is_relative_to(root):
            shutil.copytree(src, out / sub.__name__.rsplit(".", 1)[1], ignore=ignore, dirs_exist_ok=True)
    return out


def runtime_env(pipeline: dict, workdir: Path, forward: list[str], pip: list[str], image: str | None) -> dict:
    (workdir / "job").mkdir()
    (workdir / "job" / "pipeline.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    env_vars = {k: os.environ[k] for k in (*FORWARDED_ENV, *forward) if k in os.environ}
    env_vars.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_POOL)  # the job's workers allocate as a local run's do
    missing = [k for k in forward if k not in os.environ]
    if missing:
        raise ConfigError(f"--env {', '.join(missing)}: not set in this environment")
    env: dict = {"working_dir": str(workdir / "job"), "py_modules": [str(package_snapshot(workdir))],
                 "env_vars": env_vars}
    if pip:
        env["pip"] = pip
    if image:
        env["image_uri"] = image
    return env


def run_entrypoint(args: argparse.Namespace) -> str:
    """The job's command: `harnessrl run` on the shipped pipeline with the submit flags it shares."""
    return ("python -m harnessrl run pipeline.yaml" + (" --json" if args.json else "")
            + (" --force" if args.force else "") + (f" --until {args.until}" if args.until else ""))


def cmd_submit(args: argparse.Namespace) -> int:
    pipeline = resolved_pipeline(args.pipeline, args.set)
    client = job_client(args.address)
    with tempfile.TemporaryDirectory(prefix="harnessrl-submit-") as tmp:
        env = runtime_env(pipeline, Path(tmp), args.env, args.pip, args.image)
        job_id = client.submit_job(
            entrypoint=run_entrypoint(args),
            runtime_env=env, submission_id=args.job_id,
            metadata={"harnessrl.pipeline": pipeline.get("name", ""), "submitted_from": os.uname().nodename},
            entrypoint_num_cpus=0,
        )
    print(f"submitted {job_id} (pipeline '{pipeline.get('name')}'); follow with: harnessrl jobs logs {job_id} "
          f"--address {redact(args.address or '')} --follow", file=sys.stderr)
    print(job_id)
    if not args.wait:
        return 0
    return _wait(client, job_id, args.timeout_s)


def _wait(client, job_id: str, timeout_s: float) -> int:
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        status = client.get_job_status(job_id)
        if status.is_terminal():
            print(f"{job_id}: {status.value}", file=sys.stderr)
            return 0 if status == JobStatus.SUCCEEDED else EXIT_JOB_FAILED
        time.sleep(2)
    print(f"{job_id}: still running after {timeout_s:.0f} s", file=sys.stderr)
    return EXIT_JOB_FAILED


def cmd_jobs(args: argparse.Namespace) -> int:
    client = job_client(args.address)
    if args.action == "list":
        rows = [{"job_id": j.submission_id, "status": j.status.value, "entrypoint": j.entrypoint,
                 "pipeline": (j.metadata or {}).get("harnessrl.pipeline", ""),
                 "start": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.start_time / 1000)) if j.start_time else ""}
                for j in client.list_jobs() if j.submission_id]
        if args.json:
            print(json.dumps(rows, indent=2))
        for r in [] if args.json else rows:
            print(f"{r['job_id']:<28} {r['status']:<10} {r['start']:<20} {r['pipeline']}")
        return 0
    if not args.job_id:
        raise ConfigError(f"jobs {args.action}: give the job id")
    try:
        if args.action == "status":
            info = client.get_job_info(args.job_id)
            out = {"job_id": args.job_id, "status": info.status.value, "message": info.message,
                   "entrypoint": info.entrypoint, "driver_exit_code": info.driver_exit_code}
            print(json.dumps(out, indent=2))
            return 0
        if args.action == "logs":
            if args.follow:
                return _follow(client, args.job_id)
            print(client.get_job_logs(args.job_id), end="")
            return 0
        stopped = client.stop_job(args.job_id)
        print(f"{args.job_id}: {'stop requested' if stopped else 'already finished'}")
        return 0
    except RuntimeError as exc:  # the job API answers an unknown id with a RuntimeError
        if "does not exist" in str(exc) or "not found" in str(exc).lower():
            raise HarnessError(f"no job {args.job_id!r} on this cluster") from None
        raise


def _follow(client, job_id: str) -> int:
    import asyncio

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)

    asyncio.run(tail())
    from ray.job_submission import JobStatus

    return 0 if client.get_job_status(job_id) == JobStatus.SUCCEEDED else EXIT_JOB_FAILED


def register(sub: argparse._SubParsersAction) -> None:
    from harnessrl.cli import UNTIL, UNTIL_HELP

    lin = sub.add_parser("lineage", help="the chain from raw logs to a registered model version")
    lin.add_argument("model", help="the registered model: NAME@ALIAS, NAME/VERSION or models:/...")
    lin.add_argument("--verify", action="store_true",
                     help=f"recompute every dataset digest now; exit {EXIT_LINEAGE_MISMATCH} on any mismatch")
    lin.add_argument("--json", action="store_true", help="print the chain as JSON")
    lin.set_defaults(fn=cmd_lineage)

    sb = sub.add_parser("submit", help="run a pipeline YAML on a Ray cluster as a Ray job")
    sb.add_argument("pipeline", help="pipeline YAML (validated here before anything is sent)")
    sb.add_argument("--address", help="the cluster: http://HEAD:8265 (its dashboard), or HEAD:6379 / ray://HEAD / auto, "
                                      "taken to mean its dashboard (default: RAY_ADDRESS)")
    sb.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    sb.add_argument("--env", action="append", default=[], metavar="NAME",
                    help="forward this environment variable too (e.g. credentials)")
    sb.add_argument("--pip", action="append", default=[], metavar="REQ", help="pip requirement for the job's env")
    sb.add_argument("--image", help="container image for the job (runtime_env image_uri)")
    sb.add_argument("--job-id", help="submission id (default: Ray's)")
    sb.add_argument("--wait", action="store_true", help=f"wait for the end; exit {EXIT_JOB_FAILED} if it failed")
    sb.add_argument("--timeout-s", type=float, default=3600, help="with --wait: give up after this long")
    sb.add_argument("--json", action="store_true", help="the job prints its summary as JSON")
    sb.add_argument("--force", action="store_true", help="rerun stages whose output exists for the same input")
    sb.add_argument("--until", choices=UNTIL, help=UNTIL_HELP)
    sb.set_defaults(fn=cmd_submit)

    jb = sub.add_parser("jobs", help="list, inspect, follow or stop submitted jobs")
    jb.add_argument("action", choices=["list", "status", "logs", "stop"], help="what to do")
    jb.add_argument("job_id", nargs="?", help="the job (status, logs, stop)")
    jb.add_argument("--address", help="the cluster: http://HEAD:8265 (its dashboard), or HEAD:6379 / ray://HEAD / auto, "
                                      "taken to mean its dashboard (default: RAY_ADDRESS)")
    jb.add_argument("--follow", action="store_true", help="logs: stream until the job ends")
    jb.add_argument("--json", action="store_true", help="list, status: print JSON")
    jb.set_defaults(fn=cmd_jobs)
