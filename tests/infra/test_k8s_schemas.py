"""Every manifest of infra/k8s/ against its schema: KubeRay's CRDs, Kubernetes' core objects.

Each validator also gets an altered manifest it must reject, naming the field.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

import k8s_support as ks

MANIFESTS = ks.load_manifests()


def _obj(kind: str) -> dict[str, Any]:
    (m,) = [m for m in MANIFESTS if m.kind == kind]
    return ks.deep(m.obj)


def test_vendored_schemas_are_kuberays_v1_crds() -> None:
    assert re.fullmatch(r"v\d+\.\d+\.\d+", ks.kuberay_version())
    for kind, fields in {
        "RayCluster": {"headGroupSpec", "workerGroupSpecs", "rayVersion"},
        "RayJob": {"entrypoint", "backoffLimit", "rayClusterSpec", "clusterSelector"},
        "RayService": {"serveConfigV2", "rayClusterConfig"},
    }.items():
        schema = ks.crd_schema(kind)
        assert {"apiVersion", "kind", "metadata", "spec"} <= set(schema["properties"])
        assert fields <= set(schema["properties"]["spec"]["properties"]), kind
        # Prepared for strict field validation.
        assert schema["properties"]["spec"]["additionalProperties"] is False


def test_manifests_cover_every_kind() -> None:
    kinds = {m.kind for m in MANIFESTS}
    assert {"RayCluster", "RayJob", "RayService", "PersistentVolume"} <= kinds
    assert {"PersistentVolumeClaim", "StorageClass", "Service", "ServiceAccount"} <= kinds


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda m: f"{m.file}:{m.kind}/{m.name}")
def test_manifest_validates(manifest: ks.Manifest) -> None:
    assert ks.validate(manifest) == []


# --- The CRD validator ------------------------------------------------------------------------


def test_crd_validator_names_unknown_and_mistyped_fields() -> None:
    rc = _obj("RayCluster")
    rc["spec"]["workerGroupSpecs"][0]["rayStartParam"] = {}  # typo of rayStartParams
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = "three"
    rc["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 0  # must be a string
    del rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["name"]
    assert ks.crd_errors(rc) == [
        "spec.headGroupSpec.rayStartParams.num-gpus: 0 is not of type 'string'",
        "spec.headGroupSpec.template.spec.containers[0].name: required field missing",
        "spec.workerGroupSpecs[0].rayStartParam: unknown field",
        "spec.workerGroupSpecs[0].replicas: 'three' is not of type 'integer'",
    ]


@pytest.mark.parametrize(
    ("cpu", "ok"),
    [
        (40, True),
        ("40", True),
        ("500m", True),
        ("0.5", True),
        ("1e3", True),
        (0.5, False),
        (True, False),
        ("forty", False),
        ("40 cores", False),
        ([40], False),
    ],
)
def test_int_or_string_quantities(cpu: object, ok: bool) -> None:
    rj = _obj("RayJob")
    limits = rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][
        0
    ]["resources"]["limits"]
    limits["cpu"] = cpu
    errors = ks.crd_errors(rj)
    where = (
        "spec.rayClusterSpec.workerGroupSpecs[0].template.spec.containers[0].resources.limits.cpu"
    )
    assert errors == [] if ok else [e.split(": ")[0] for e in errors] == [where]


def test_list_map_keys_are_unique() -> None:
    rs = _obj("RayService")
    pod = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    pod["containers"].append(ks.deep(pod["containers"][0]))  # two containers named ray-worker
    pod["containers"][0]["ports"].append({"name": "serve2", "containerPort": 8000})
    (dup_port, dup_container) = ks.crd_errors(rs)
    base = "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers"
    assert dup_port.startswith(f"{base}[0].ports[2]: duplicate entry")
    assert "'containerPort': 8000, 'protocol': 'TCP'" in dup_port  # protocol: its default
    assert dup_container.startswith(f"{base}[1]: duplicate entry {{'name': 'ray-worker'}}")


def test_int32_fields_are_range_checked() -> None:
    rj = _obj("RayJob")
    rj["spec"]["backoffLimit"] = 2**31
    assert ks.crd_errors(rj) == [f"spec.backoffLimit: {2**31} is not a 'int32'"]


def test_null_is_refused_where_not_nullable() -> None:
    rc = _obj("RayCluster")
    rc["spec"]["rayVersion"] = None
    assert ks.crd_errors(rc) == [
        "spec.rayVersion: null (leave the field out, or give it a value of type 'string')"
    ]


# --- kubernetes-validate: core objects and embedded pod templates ------------------------------


def test_core_validator_names_the_field() -> None:
    pvc = _obj("PersistentVolumeClaim")
    pvc["spec"]["accessMode"] = pvc["spec"].pop("accessModes")
    assert ks.core_errors(pvc) == ["spec.accessMode: unknown field"]
    pv = _obj("PersistentVolume")
    pv["spec"]["csi"]["volumeHandle"] = 12
    assert ks.core_errors(pv) == ["spec.csi.volumeHandle: 12 is not of type 'string'"]


def test_pod_template_validator_names_the_field_in_the_custom_resource() -> None:
    rs = _obj("RayService")
    port = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][
        0
    ]["ports"][0]
    port["containerPort"] = "serve"
    assert ks.pod_template_errors(rs) == [
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].ports[0]"
        ".containerPort: 'serve' is not of type 'integer'"
    ]
    rj = _obj("RayJob")
    rj["spec"]["submitterPodTemplate"]["spec"]["restartPolicy"] = ["Never"]
    (error,) = ks.pod_template_errors(rj)
    assert error.startswith("spec.submitterPodTemplate.spec.restartPolicy: ")


# --- KubeRay's own rules ------------------------------------------------------------------------


def test_kuberay_rules_name_the_field() -> None:
    rj = _obj("RayJob")
    rj["metadata"]["name"] = "maze-grpo-qwen3vl8b-with-a-much-longer-experiment-name"
    rj["spec"]["clusterSelector"] = {"ray.io/cluster": "mazerl"}
    rj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = 4
    assert ks.kuberay_rule_errors(rj) == [
        "metadata.name: longer than 47 characters",
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas: outside minReplicas..maxReplicas",
        "spec.rayClusterSpec: give exactly one of rayClusterSpec and clusterSelector",
        "spec.backoffLimit: not allowed with clusterSelector",
    ]
    rc = _obj("RayCluster")
    rc["spec"]["headGroupSpec"]["resources"] = {"mazerl_head": "1"}
    assert ks.kuberay_rule_errors(rc) == [
        "spec.headGroupSpec.resources: set in both rayStartParams and resources"
    ]


def test_validate_locates_the_problem() -> None:
    (m,) = [m for m in MANIFESTS if m.kind == "StorageClass"]
    altered = ks.Manifest(m.file, {**ks.deep(m.obj), "reclaimPolicy": 1})
    assert ks.validate(altered) == [
        "components/fsx-dynamic/storageclass.yaml: StorageClass/fsx-sc: reclaimPolicy: 1 is not "
        "of type 'string', 'null'"
    ]


# --- What kustomize builds ---------------------------------------------------------------------


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    proc = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_kustomize_builds_valid_objects_with_every_option(tmp_path: Path) -> None:
    # The default set, then every alternative plus the dynamic-FSx component, as `kustomize edit
    # add resource/component` would list them, and images set as `kustomize edit set image` does.
    default = _kustomize(ks.K8S_DIR)
    assert {d["kind"] for d in default} == {
        "ServiceAccount",
        "PersistentVolume",
        "PersistentVolumeClaim",
        "Service",
        "RayCluster",
    }
    shutil.copytree(ks.K8S_DIR, tmp_path / "k8s")
    kustomization = ks.load_kustomization(tmp_path / "k8s")
    kustomization["resources"] += ["rayjob-train.yaml", "rayservice-serve.yaml"]
    kustomization["resources"] += ["serve-deployment.yaml"]
    kustomization["components"] = ["components/fsx-dynamic"]
    kustomization["namespace"] = "team-a"
    for image in kustomization["images"]:
        if image["name"].startswith("mazerl-"):
            image.update(newName=f"registry.example/{image['name']}", newTag="abc123")
    (tmp_path / "k8s" / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    built = _kustomize(tmp_path / "k8s")

    problems: list[str] = []
    images: set[str] = set()
    for i, obj in enumerate(built):
        problems += ks.validate(ks.Manifest(f"built[{i}]", obj))
        for _, template in ks.pod_templates(obj):
            images |= {c["image"] for c in ks.containers(template)}
        cluster_scoped = obj["kind"] in {"PersistentVolume", "StorageClass"}
        assert ("namespace" in obj["metadata"]) != cluster_scoped, obj["kind"]
        assert obj["metadata"].get("namespace", "team-a") == "team-a"
    assert problems == []
    assert images == {
        "registry.example/mazerl-train:abc123",
        "registry.example/mazerl-serve:abc123",
        "rayproject/ray-llm:2.49.0-py311-cu128",
    }
    kinds = [d["kind"] for d in built]
    assert "PersistentVolume" not in kinds and "StorageClass" in kinds  # the component's
    (pvc,) = [d for d in built if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["spec"]["storageClassName"] == "fsx-sc" and "volumeName" not in pvc["spec"]
