#!/usr/bin/env python3
"""Writes the KubeRay manifests under infra/k8s/ from one cluster description and the project's
own files, so that they cannot drift from the code:

  raycluster.yaml   a standing cluster: CPU head, autoscaling GPU worker group
                    (for `harnessrl submit` and `harnessrl serve deploy`)
  rayjob.yaml       a pipeline run on a cluster of its own: `python -m harnessrl run` on
                    infra/pipeline.yaml (mounted from a ConfigMap)
  rayservice.yaml   the critic service: serveConfigV2 whose application `args` are serving/serve.yaml

The image tag comes from infra/Dockerfile (its `FROM rayproject/ray:...` line) and the package
version from pyproject.toml. The RayService's serveConfigV2 is the Ray Serve config file that
`harnessrl serve config` prints (harnessrl/serve_file.py), with the proxy on every pod interface.
Needs PyYAML and pydantic (it reads serve.yaml with harnessrl's ServeConfig), not Ray.

  python infra/render.py                          # rewrite infra/k8s/{raycluster,rayjob,rayservice}.yaml
  python infra/render.py --check                  # exit 1 when a committed file differs from its rendering
  python infra/render.py --image REG/harnessrl:T --serve my-serve.yaml --out deploy/   # your image and settings
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
OUT = INFRA / "k8s"
sys.path.insert(0, str(ROOT / "platform"))  # this checkout's harnessrl, installed or not

from harnessrl import serve_file  # noqa: E402
from harnessrl.config import load_serve  # noqa: E402

MLFLOW_URI = "http://mlflow:5000"               # the Service in infra/k8s/mlflow.yaml
HOME = "/home/ray/.harnessrl"                   # HARNESSRL_HOME in the image
PIPELINE_MOUNT = "/home/ray/pipeline"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def base_image_tag() -> str:
    """`2.60.0-py311-cu128` from infra/Dockerfile's FROM line."""
    m = re.search(r"^FROM\s+rayproject/ray:(\S+)", (INFRA / "Dockerfile").read_text(), re.M)
    if not m:
        raise SystemExit("infra/Dockerfile: no `FROM rayproject/ray:TAG` line")
    return m[1]


def package_version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    return m[1] if m else "0.0.0"


def default_image() -> str:
    return f"harnessrl:{package_version()}-ray{base_image_tag()}"


def ray_version() -> str:
    return base_image_tag().split("-")[0]


def _env(serving: bool) -> list[dict]:
    env = [{"name": "MLFLOW_TRACKING_URI", "value": MLFLOW_URI},
           {"name": "HARNESSRL_HOME", "value": HOME}]
    if serving:  # bearer token of /v1/* (serving/auth.py). Not optional: the proxy listens on 0.0.0.0, and a
        # missing Secret must keep the pods from starting rather than serve an open API
        env.append({"name": "HARNESSRL_API_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "harnessrl-api-token", "key": "token"}}})
    return env


# AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION (and AWS_ENDPOINT_URL for a non-AWS
# S3): the pipeline's s3:// data and outputs. MLflow artifacts go through the MLflow server.
ENV_FROM = [{"secretRef": {"name": "harnessrl-s3"}}]
STOP = {"preStop": {"exec": {"command": ["/bin/sh", "-c", "ray stop"]}}}


def _resources(cpu: str, memory: str, gpus: int = 0) -> dict:
    amount = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"requests": dict(amount), "limits": dict(amount)}


def cluster_spec(image: str, *, serving: bool, min_gpu_workers: int, max_gpu_workers: int,
                 head_mounts: list[dict] | None = None, head_volumes: list[dict] | None = None) -> dict:
    """One RayClusterSpec (ray.io/v1) for all three manifests."""
    ports = [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
             {"containerPort": 10001, "name": "client"}, {"containerPort": 8080, "name": "metrics"}]
    if serving:
        ports.append({"containerPort": 8000, "name": "serve"})
    head = {"name": "ray-head", "image": image, "imagePullPolicy": "IfNotPresent", "env": _env(serving),
            "envFrom": ENV_FROM, "ports": ports, "resources": _resources("4", "16Gi"), "lifecycle": STOP}
    if head_mounts:
        head["volumeMounts"] = head_mounts
    head_pod = {"containers": [head]}
    if head_volumes:
        head_pod["volumes"] = head_volumes
    worker = {"name": "ray-worker", "image": image, "imagePullPolicy": "IfNotPresent", "env": _env(serving),
              "envFrom": ENV_FROM, "resources": _resources("8", "48Gi", gpus=1), "lifecycle": STOP}
    return {
        "rayVersion": ray_version(),
        # Ray token auth (Ray >= 2.52, KubeRay >= 1.5.1): KubeRay makes the token Secret and sets
        # RAY_AUTH_MODE/RAY_AUTH_TOKEN in every Ray container and its own clients.
        "authOptions": {"mode": "token"},
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": {"upscalingMode": "Default", "idleTimeoutSeconds": 300,
                              "resources": _resources("500m", "512Mi")},
        "headGroupSpec": {
            "serviceType": "ClusterIP",
            # The head runs the driver, the encoder's read tasks and CPU Serve replicas: no GPU.
            "rayStartParams": {"dashboard-host": "0.0.0.0", "metrics-export-port": "8080"},
            "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "harnessrl"}},
                         "spec": head_pod},
        },
        "workerGroupSpecs": [{
            "groupName": "gpu",
            "replicas": min_gpu_workers,
            "minReplicas": min_gpu_workers,
            "maxReplicas": max_gpu_workers,
            "rayStartParams": {},  # GPUs and CPUs from the container's limits
            "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "harnessrl"}},
                         "spec": {"containers": [worker], "tolerations": [GPU_TOLERATION]}},
        }],
    }


def _meta(name: str, component: str) -> dict:
    return {"name": name, "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "harnessrl",
                                     "app.kubernetes.io/component": component}}


def raycluster(image: str) -> list[dict]:
    return [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": _meta("harnessrl", "ray"),
             # min 1 GPU worker: the encode stage sizes its pool from the GPUs present when it starts
             "spec": cluster_spec(image, serving=False, min_gpu_workers=1, max_gpu_workers=4)}]


def rayjob(image: str) -> list[dict]:
    pipeline = (INFRA / "pipeline.yaml").read_text()
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta("harnessrl-pipeline", "pipeline"),
                  "data": {"pipeline.yaml": pipeline}}
    spec = cluster_spec(image, serving=False, min_gpu_workers=1, max_gpu_workers=4,
                        head_mounts=[{"name": "pipeline", "mountPath": PIPELINE_MOUNT, "readOnly": True}],
                        head_volumes=[{"name": "pipeline", "configMap": {"name": "harnessrl-pipeline"}}])
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": _meta("harnessrl-pipeline", "pipeline"),
           "spec": {
               "entrypoint": f"python -m harnessrl run {PIPELINE_MOUNT}/pipeline.yaml",
               "runtimeEnvYAML": "env_vars:\n  RAY_TRAIN_ENABLE_PRINT_PATCH: \"0\"\n",
               "submissionMode": "K8sJobMode",
               "shutdownAfterJobFinishes": True,
               "ttlSecondsAfterFinished": 3600,
               "activeDeadlineSeconds": 86400,
               "backoffLimit": 0,
               "rayClusterSpec": spec,
           }}
    return [config_map, job]


def serve_config_v2(serve_yaml: Path) -> str:
    """The Ray Serve config file of serve.yaml (`harnessrl serve config`), the proxy on 0.0.0.0."""
    return yaml.safe_dump(serve_file.serve_config(load_serve(serve_yaml), host="0.0.0.0"), sort_keys=False)


def rayservice(image: str, serve_yaml: Path | None = None) -> list[dict]:
    return [{"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": _meta("harnessrl-critic", "serving"),
             "spec": {
                 "serveConfigV2": serve_config_v2(serve_yaml or ROOT / "serving" / "serve.yaml"),
                 # serve.yaml asks for CPU replicas (num_gpus: 0): they run on the head; with num_gpus > 0
                 # the autoscaler adds GPU workers.
                 "rayClusterConfig": cluster_spec(image, serving=True, min_gpu_workers=0, max_gpu_workers=2),
             }}]


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: list[dict], source: str) -> str:
    head = (f"# Generated by infra/render.py from {source}; edit those, then run `python infra/render.py`.\n"
            "# tests/test_infra.py checks that this file equals its rendering.\n")
    return head + "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=120) for d in docs)


def render(image: str | None = None, serve_yaml: Path | None = None) -> dict[str, str]:
    image = image or default_image()
    return {
        "raycluster.yaml": dump(raycluster(image), "infra/render.py and infra/Dockerfile"),
        "rayjob.yaml": dump(rayjob(image), "infra/pipeline.yaml"),
        "rayservice.yaml": dump(rayservice(image, serve_yaml), "serving/serve.yaml"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--image", help=f"container image of the Ray pods (default: {default_image()})")
    p.add_argument("--serve", type=Path, help="ServeConfig YAML of the RayService (default: serving/serve.yaml)")
    p.add_argument("--out", type=Path, default=OUT, help="folder to write to (default: infra/k8s)")
    p.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing")
    args = p.parse_args(argv)
    stale = []
    for name, text in render(args.image, args.serve).items():
        path = args.out / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python infra/render.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
