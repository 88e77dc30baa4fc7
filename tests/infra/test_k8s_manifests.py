"""The manifests of infra/k8s/ agree with each other, with the image build and with the code.

Each ``check_*`` returns problems as ``file: Kind/name: field.path: what is wrong``; the tests
assert there are none, and that an altered manifest is caught with the field named. The RayJob's
entrypoint goes through maze-train's own parser and the project's config loader
(``maze_engine.submit.build_job`` + ``maze_engine.config.load_config``), so a renamed config key
fails here.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from packaging.requirements import Requirement

from maze_engine.config import REFERENCE_CONFIG, MazerlConfig, load_config
from maze_engine.errors import ConfigError
from maze_engine.lora_sync import SyncLayout
from maze_engine.submit import FORWARDED_ENV_VARS, RayJob, build_job
from maze_trainer import cli

sys.path.insert(0, str(Path(__file__).parent))

import k8s_support as ks
from k8s_support import Manifest, Path_, field_path

CLAIM = "fsx-claim"
MOUNT = "/shared"
TRAIN_IMAGE, SERVE_IMAGE = "mazerl-train", "mazerl-serve"
IMAGE_DOCKERFILES = {TRAIN_IMAGE: "train.Dockerfile", SERVE_IMAGE: "serve.Dockerfile"}
"""The images the manifests use, by the name infra/images builds them under."""
IMAGES_DIR = ks.ROOT / "infra" / "images"
ALTERNATIVES = ("rayjob-train.yaml", "rayservice-serve.yaml", "serve-deployment.yaml")
"""Manifests left out of kustomization.yaml's default set, added with `kustomize edit`."""
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
RAY_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001, "serve": 8000, "metrics": 8080}
"""KubeRay's port names and default numbers (its head Service and probes go by them)."""
TRAINER_METRICS = "trainer-metrics"
SAGEMAKER_PORT = 8080
"""maze-serve's port in `serve` mode (the SageMaker container contract)."""
SERVE_APP = "ray.serve.llm:build_openai_app"
DOCKERFILE_EXPOSE = re.compile(r"^\s*EXPOSE\s+(.+)$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Setup:
    """What the checks compare: the manifests, the kustomization, the run's config."""

    manifests: list[Manifest]
    kustomization: dict[str, Any]
    config: MazerlConfig
    """The reference config as the RayJob's entrypoint and env vars load it."""
    job: RayJob
    """What ``maze-train --submit`` would submit for that entrypoint."""
    job_env: dict[str, str]
    """The RayJob's ``runtimeEnvYAML`` env vars."""

    def one(self, kind: str) -> Manifest:
        (m,) = [m for m in self.manifests if m.kind == kind]
        return m

    def all(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m.kind == kind]


def job_env(rayjob: Manifest) -> dict[str, str]:
    env: Any = yaml.safe_load(rayjob.obj["spec"].get("runtimeEnvYAML") or "{}") or {}
    return {str(k): str(v) for k, v in cast(dict[str, Any], env.get("env_vars") or {}).items()}


def parse_entrypoint(rayjob: Manifest) -> tuple[argparse.Namespace, list[str]]:
    """The RayJob's entrypoint through maze-train's parser: its arguments and overrides."""
    where = rayjob.where(("spec", "entrypoint"))
    argv = shlex.split(rayjob.obj["spec"]["entrypoint"])
    assert argv[:1] == [cli.PROG], f"{where}: runs {argv[:1]}, not {cli.PROG}"
    try:
        args, rest = cli._parser().parse_known_args(argv[1:])
    except SystemExit:
        raise AssertionError(f"{where}: {cli.PROG}'s parser refused {argv[1:]}") from None
    overrides = cli._split_overrides([*args.overrides, *rest])
    assert overrides is not None, f"{where}: arguments that are not key=value overrides"
    assert args.engine == "skyrl", f"{where}: --engine {args.engine}, the cluster runs skyrl"
    assert not args.submit and not args.dry_run, f"{where}: --submit/--dry-run inside the job"
    return args, overrides


def load_reference(
    rayjob: Manifest, monkeypatch: pytest.MonkeyPatch
) -> tuple[MazerlConfig, RayJob]:
    """The config and job the RayJob runs, loaded as the driver would (its env vars set)."""
    args, overrides = parse_entrypoint(rayjob)
    env = job_env(rayjob)
    for var in FORWARDED_ENV_VARS:
        if var in env:
            monkeypatch.setenv(var, env[var])
        else:
            monkeypatch.delenv(var, raising=False)
    name = args.config or REFERENCE_CONFIG
    try:
        job = build_job(name, overrides, "http://127.0.0.1:8265", engine=args.engine)
        config = load_config(name, overrides)
    except ConfigError as exc:
        raise AssertionError(f"{rayjob.where(('spec', 'entrypoint'))}: {exc}") from None
    return config, job


@pytest.fixture(scope="module")
def setup() -> Setup:
    manifests = ks.load_manifests()
    (rayjob,) = [m for m in manifests if m.kind == "RayJob"]
    with pytest.MonkeyPatch.context() as mp:  # the env vars only while the config loads
        config, job = load_reference(rayjob, mp)
    return Setup(manifests, ks.load_kustomization(), config, job, job_env(rayjob))


def altered(setup: Setup, kind: str, change: Callable[[dict[str, Any]], object]) -> Setup:
    """``setup`` with a deep copy of its one ``kind`` manifest changed in place by ``change``."""
    manifests = ks.deep(setup.manifests)
    (m,) = [m for m in manifests if m.kind == kind]
    change(m.obj)
    return replace(setup, manifests=manifests)


# --- helpers ------------------------------------------------------------------------------------


def at(obj: Any, path: Path_) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def templates(setup: Setup) -> Iterator[tuple[Manifest, Path_, dict[str, Any]]]:
    for m in setup.manifests:
        for path, template in ks.pod_templates(m.obj):
            yield m, path, template


def is_ray_group(path: Path_) -> bool:
    return path[-1] == "template" and "submitterPodTemplate" not in path and path[1] != "template"


def container_ports(container: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``name -> (index, containerPort)``."""
    return {
        p["name"]: (i, p["containerPort"])
        for i, p in enumerate(cast(list[dict[str, Any]], container.get("ports") or []))
        if "name" in p
    }


def gpus(container: dict[str, Any]) -> int:
    limits = cast(dict[str, Any], container.get("resources", {}).get("limits") or {})
    return int(limits.get("nvidia.com/gpu", 0))


def image_name(image: str) -> str:
    """``repo/name:tag`` -> ``repo/name`` (no digest or registry port in these manifests)."""
    return image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image


def image_tag(image: str) -> str:
    return image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""


_SUFFIX: dict[str, float] = {
    **{s: 2.0 ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18},
}


def quantity(value: object) -> float:
    """A Kubernetes resource quantity (``1200Gi``, ``500m``, ``40``) as a number."""
    m = re.fullmatch(r"([0-9.]+)([KMGTPE]i|[mkMGTPE]?)", str(value))
    assert m, f"{value!r} is not a quantity"
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def parse_ray_resources(value: str) -> dict[str, float]:
    """rayStartParams ``resources``: a shell-quoted JSON object, as ``ray start`` receives it."""
    (text,) = shlex.split(value)
    parsed = json.loads(text)
    assert isinstance(parsed, dict), f"{value!r} is not a JSON object"
    return {str(k): float(v) for k, v in cast(dict[str, Any], parsed).items()}


def training_clusters(setup: Setup) -> Iterator[tuple[Manifest, Path_, dict[str, Any]]]:
    """The cluster specs that run the training image (RayCluster and the RayJob's)."""
    for m in setup.manifests:
        for path, spec in ks.cluster_specs(m.obj):
            head = spec["headGroupSpec"]["template"]
            if image_name(ks.containers(head)[0]["image"]) == TRAIN_IMAGE:
                yield m, path, spec


def serve_config(rayservice: Manifest) -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load(rayservice.obj["spec"]["serveConfigV2"]))


@cache
def image_ray_version() -> str:
    """The Ray of the mazerl-train image: train.Dockerfile installs skyrl's ``fsdp`` extra over
    uv.lock, with infra/images/skyrl-fsdp-overrides.txt winning over skyrl's own ``ray==`` pin."""
    overrides = ks.ROOT / "infra" / "images" / "skyrl-fsdp-overrides.txt"
    lines = overrides.read_text().splitlines() if overrides.is_file() else []
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            req = Requirement(line)
            if req.name == "ray":
                return next(s.version for s in req.specifier if s.operator == "==")
    pins = {
        spec.version
        for text in importlib.metadata.requires("skyrl") or []
        if (req := Requirement(text)).name == "ray"
        for spec in req.specifier
        if spec.operator == "=="
    }
    assert len(pins) == 1, f"skyrl pins ray to {sorted(pins)}"
    return pins.pop()


def first_difference(a: Any, b: Any, path: Path_ = ()) -> Path_ | None:
    if isinstance(a, dict) and isinstance(b, dict):
        da, db = cast(dict[str, Any], a), cast(dict[str, Any], b)
        for k in sorted(set(da) | set(db)):
            if k not in da or k not in db:
                return (*path, k)
            if (d := first_difference(da[k], db[k], (*path, k))) is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        la, lb = cast(list[Any], a), cast(list[Any], b)
        for i, (x, y) in enumerate(zip(la, lb, strict=False)):
            if (d := first_difference(x, y, (*path, i))) is not None:
                return d
        return None if len(la) == len(lb) else (*path, min(len(la), len(lb)))
    return None if a == b else path


# --- checks -------------------------------------------------------------------------------------


def check_storage(setup: Setup) -> list[str]:
    """The FSx volume and the claim bind to each other, ReadWriteMany, through the FSx driver."""
    problems: list[str] = []
    pv, pvc = setup.one("PersistentVolume"), setup.one("PersistentVolumeClaim")
    if pvc.name != CLAIM:
        problems.append(
            pvc.where(("metadata", "name")) + f": {pvc.name!r}, the pods name {CLAIM!r}"
        )
    csi = pv.obj["spec"].get("csi", {})
    if csi.get("driver") != "fsx.csi.aws.com":
        problems.append(pv.where(("spec", "csi", "driver")) + ": not the FSx CSI driver")
    dns = str(csi.get("volumeAttributes", {}).get("dnsname", ""))
    if not dns.startswith(f"{csi.get('volumeHandle')}.fsx."):
        problems.append(
            pv.where(("spec", "csi", "volumeAttributes", "dnsname"))
            + f": {dns!r} is not the DNS name of file system {csi.get('volumeHandle')!r}"
        )
    if not csi.get("volumeAttributes", {}).get("mountname"):
        problems.append(pv.where(("spec", "csi", "volumeAttributes", "mountname")) + ": missing")
    for m in (pv, pvc):
        if m.obj["spec"].get("accessModes") != ["ReadWriteMany"]:
            problems.append(m.where(("spec", "accessModes")) + ": must be [ReadWriteMany]")
        if m.obj["spec"].get("storageClassName") != "":
            problems.append(m.where(("spec", "storageClassName")) + ': "" binds the static volume')
    if pvc.obj["spec"].get("volumeName") != pv.name:
        problems.append(pvc.where(("spec", "volumeName")) + f": does not name {pv.name!r}")
    request = pvc.obj["spec"]["resources"]["requests"]["storage"]
    if quantity(pv.obj["spec"]["capacity"]["storage"]) < quantity(request):
        problems.append(
            pv.where(("spec", "capacity", "storage")) + f": less than the claim's {request}"
        )
    return problems


def check_shared_mounts(setup: Setup) -> list[str]:
    """Every claim volume is the FSx claim, mounted at /shared; every Ray and serving pod has it."""
    problems: list[str] = []
    for m, path, template in templates(setup):
        spec = template["spec"]
        claim_volumes: set[str] = set()
        for i, volume in enumerate(cast(list[dict[str, Any]], spec.get("volumes") or [])):
            if "persistentVolumeClaim" in volume:
                claim_volumes.add(volume["name"])
                if volume["persistentVolumeClaim"].get("claimName") != CLAIM:
                    where = (*path, "spec", "volumes", i, "persistentVolumeClaim", "claimName")
                    problems.append(m.where(where) + f": not the FSx claim {CLAIM!r}")
        mounted = False
        for c_i, c in enumerate(cast(list[dict[str, Any]], spec.get("containers") or [])):
            for v_i, mount in enumerate(cast(list[dict[str, Any]], c.get("volumeMounts") or [])):
                if mount["name"] in claim_volumes:
                    mounted = True
                    if mount.get("mountPath") != MOUNT:
                        where = (*path, "spec", "containers", c_i, "volumeMounts", v_i, "mountPath")
                        problems.append(m.where(where) + f": the FSx claim goes at {MOUNT}")
        needs_shared = is_ray_group(path) or m.kind == "Deployment"
        if needs_shared and not mounted:
            problems.append(m.where((*path, "spec")) + f": does not mount the FSx claim at {MOUNT}")
    return problems


def check_scheduling(setup: Setup) -> list[str]:
    """Pods go only to healthy HyperPod nodes and run as the project's service account."""
    problems: list[str] = []
    (account,) = [m.name for m in setup.all("ServiceAccount")]
    for m, path, template in templates(setup):
        spec = template["spec"]
        if (spec.get("nodeSelector") or {}).get(HEALTH_LABEL) != "Schedulable":
            where = (*path, "spec", "nodeSelector", HEALTH_LABEL)
            problems.append(m.where(where) + ": must be Schedulable (healthy HyperPod nodes only)")
        if spec.get("serviceAccountName") != account:
            where = (*path, "spec", "serviceAccountName")
            problems.append(m.where(where) + f": not the service account {account!r}")
    return problems


def check_images(setup: Setup) -> list[str]:
    """Containers use the kustomization's image names; Ray training pods the training image."""
    problems: list[str] = []
    mapped = {str(i["name"]): i for i in setup.kustomization.get("images", [])}
    for name in IMAGE_DOCKERFILES:
        if name not in mapped:
            problems.append(f"kustomization.yaml: images: {name!r} is not mapped")
    for m, path, template in templates(setup):
        is_train = m.kind in {"RayCluster", "RayJob"}
        for i, c in enumerate(cast(list[dict[str, Any]], template["spec"]["containers"])):
            where = m.where((*path, "spec", "containers", i, "image"))
            name = image_name(c["image"])
            if name not in mapped:
                problems.append(f"{where}: {c['image']!r} is not in kustomization.yaml's images")
            expected = TRAIN_IMAGE if is_train else SERVE_IMAGE if m.kind == "Deployment" else None
            if expected and name != expected:
                problems.append(f"{where}: {c['image']!r}, expected the {expected} image")
    return problems


def check_ray_versions(setup: Setup) -> list[str]:
    """rayVersion is the Ray of the image: skyrl's pin for mazerl-train, the tag's for Ray LLM."""
    problems: list[str] = []
    ray = image_ray_version()
    for m, path, spec in training_clusters(setup):
        if spec.get("rayVersion") != ray:
            problems.append(
                m.where((*path, "rayVersion"))
                + f": {spec.get('rayVersion')!r}, the {TRAIN_IMAGE} image has Ray {ray}"
            )
    tags = {str(i["name"]): str(i.get("newTag", "")) for i in setup.kustomization["images"]}
    for m in setup.all("RayService"):
        (path, spec), *_ = ks.cluster_specs(m.obj)
        image = ks.containers(spec["headGroupSpec"]["template"])[0]["image"]
        for source, tag in (
            ("the image tag", image_tag(image)),
            ("kustomization.yaml's newTag", tags.get(image_name(image), "")),
        ):
            if tag and tag.split("-")[0] != spec.get("rayVersion"):
                problems.append(
                    m.where((*path, "rayVersion"))
                    + f": {spec.get('rayVersion')!r} but {source} is {tag!r}"
                )
    return problems


def check_kustomization(setup: Setup) -> list[str]:
    """Its resources exist; every manifest is a resource or a documented alternative."""
    problems: list[str] = []
    k = setup.kustomization
    text = (ks.K8S_DIR / "kustomization.yaml").read_text()
    listed = [str(r) for r in k.get("resources", [])]
    for i, r in enumerate(listed):
        if not (ks.K8S_DIR / r).is_file():
            problems.append(f"kustomization.yaml: resources[{i}]: {r} does not exist")
    top = sorted({m.file for m in setup.manifests if "/" not in m.file})
    for f in top:
        if f not in listed and f not in ALTERNATIVES:
            problems.append(
                f"kustomization.yaml: resources: {f} is neither listed nor an alternative"
            )
    for f in ALTERNATIVES:
        if f in listed or f not in text:
            problems.append(f"kustomization.yaml: {f}: should be named in the comments, not listed")
    for c in sorted({m.file.rsplit("/", 1)[0] for m in setup.manifests if "/" in m.file}):
        if not (ks.K8S_DIR / c / "kustomization.yaml").is_file() or c not in text:
            problems.append(f"kustomization.yaml: {c}: a component directory nobody names")
    if not k.get("namespace"):
        problems.append("kustomization.yaml: namespace: missing")
    return problems


def check_training_job(setup: Setup) -> list[str]:
    """The RayJob submits what maze-train would, retries, and resumes from /shared."""
    rayjob = setup.one("RayJob")
    spec = rayjob.obj["spec"]
    problems: list[str] = []
    if shlex.split(spec["entrypoint"]) != list(setup.job.entrypoint):
        problems.append(
            rayjob.where(("spec", "entrypoint"))
            + f": not what maze-train submits ({shlex.join(setup.job.entrypoint)})"
        )
    runtime_env = yaml.safe_load(spec.get("runtimeEnvYAML") or "{}")
    if runtime_env != setup.job.runtime_env:
        problems.append(
            rayjob.where(("spec", "runtimeEnvYAML"))
            + f": {runtime_env} differs from build_job's {setup.job.runtime_env}"
        )
    trainer = setup.config.skyrl.trainer
    if trainer.resume_mode != "latest":
        problems.append(
            rayjob.where(("spec", "entrypoint")) + ": trainer.resume_mode is not latest"
        )
    run_dir = f"{MOUNT}/runs/{trainer.run_name}/"
    paths = {
        "trainer.ckpt_path": trainer.ckpt_path,
        "trainer.export_path": f"{trainer.export_path}/",
        "trainer.log_path": trainer.log_path,
        "trainer.policy.model.lora.lora_sync_path": trainer.policy.model.lora.lora_sync_path,
        "data.train_data": setup.config.skyrl.data.train_data[0],
        "data.val_data": setup.config.skyrl.data.val_data[0],
    }
    for key, value in paths.items():
        if not str(value).startswith(run_dir):
            problems.append(
                rayjob.where(("spec", "entrypoint")) + f": {key}={value} is not under {run_dir}"
            )
    model = setup.job_env.get("MAZERL_SFT_CHECKPOINT", "")
    if not model.startswith(f"{MOUNT}/") or trainer.policy.model.path != model:
        problems.append(
            rayjob.where(("spec", "runtimeEnvYAML"))
            + f": MAZERL_SFT_CHECKPOINT {model!r} must be the model path, on {MOUNT}"
        )
    if not isinstance(spec.get("backoffLimit"), int) or spec["backoffLimit"] < 1:
        problems.append(rayjob.where(("spec", "backoffLimit")) + ": >= 1, so a failed run resumes")
    if spec.get("shutdownAfterJobFinishes") is not True:
        problems.append(rayjob.where(("spec", "shutdownAfterJobFinishes")) + ": must be true")
    if "submissionMode" not in spec:
        problems.append(rayjob.where(("spec", "submissionMode")) + ": missing")
    if "clusterSelector" in spec or "rayClusterSpec" not in spec:
        problems.append(
            rayjob.where(("spec", "rayClusterSpec")) + ": retries need the job's own cluster"
        )
    return problems


def check_cluster_shape(setup: Setup) -> list[str]:
    """The training clusters are the config's world: fixed size, one GPU per FSDP rank."""
    problems: list[str] = []
    rc, rayjob = setup.one("RayCluster"), setup.one("RayJob")
    diff = first_difference(rayjob.obj["spec"].get("rayClusterSpec"), rc.obj["spec"])
    if diff is not None:
        problems.append(
            rayjob.where(("spec", "rayClusterSpec", *diff))
            + f": differs from {rc.file}'s spec.{field_path(diff)}"
        )
    placement = setup.config.skyrl.trainer.placement
    engine = setup.config.skyrl.generator.inference_engine
    for m, path, spec in training_clusters(setup):
        if spec.get("enableInTreeAutoscaling"):
            problems.append(
                m.where((*path, "enableInTreeAutoscaling")) + ": resume needs a fixed size"
            )
        head = spec["headGroupSpec"]["template"]
        if any(gpus(c) for c in ks.containers(head)):
            problems.append(m.where((*path, "headGroupSpec")) + ": the head is a CPU node")
        nodes = total = 0
        for i, group in enumerate(cast(list[dict[str, Any]], spec["workerGroupSpecs"])):
            per_pod = sum(gpus(c) for c in ks.containers(group["template"]))
            if not per_pod:
                continue
            gp: Path_ = (*path, "workerGroupSpecs", i)
            n = group["replicas"]
            if not group.get("minReplicas") == n == group.get("maxReplicas"):
                problems.append(m.where((*gp, "replicas")) + ": min = replicas = max (fixed size)")
            if per_pod != placement.policy_num_gpus_per_node:
                problems.append(
                    m.where((*gp, "template")) + f": {per_pod} GPUs per pod, the config places "
                    f"{placement.policy_num_gpus_per_node} (trainer.placement.policy_num_gpus_per_node)"
                )
            nodes, total = nodes + n, total + n * per_pod
        if nodes != placement.policy_num_nodes:
            problems.append(
                m.where((*path, "workerGroupSpecs")) + f": {nodes} GPU pods, the config places "
                f"{placement.policy_num_nodes} (trainer.placement.policy_num_nodes)"
            )
        if total != engine.num_engines * engine.tensor_parallel_size:
            problems.append(
                m.where((*path, "workerGroupSpecs")) + f": {total} GPUs, the colocated vLLM "
                f"engines need {engine.num_engines * engine.tensor_parallel_size}"
            )
    return problems


def check_head_resource(setup: Setup) -> list[str]:
    """Only the training head advertises cluster.head_resource (LoRA consolidation runs there)."""
    problems: list[str] = []
    resource = setup.config.cluster.head_resource
    for m, path, spec in training_clusters(setup):
        groups: list[tuple[Path_, dict[str, Any]]] = [
            ((*path, "headGroupSpec"), spec["headGroupSpec"])
        ]
        groups += [
            ((*path, "workerGroupSpecs", i), g) for i, g in enumerate(spec["workerGroupSpecs"])
        ]
        for gp, group in groups:
            where = m.where((*gp, "rayStartParams", "resources"))
            raw = cast(dict[str, Any], group.get("rayStartParams") or {}).get("resources")
            try:
                declared = parse_ray_resources(raw) if raw else {}
            except (ValueError, AssertionError) as exc:
                problems.append(f"{where}: {raw!r} is not a quoted JSON object ({exc})")
                continue
            is_head = gp[-1] == "headGroupSpec"
            if is_head and declared.get(resource, 0) < 1:
                problems.append(f"{where}: must declare {resource!r} (cluster.head_resource)")
            if not is_head and resource in declared:
                problems.append(f"{where}: only the head declares {resource!r}")
    return problems


def check_ports(setup: Setup) -> list[str]:
    """Ray's ports carry KubeRay's names and numbers; metrics ports match rayStartParams."""
    problems: list[str] = []
    trainer_port = setup.config.cluster.prometheus_port
    training = {(m.file, path) for m, path, _ in training_clusters(setup)}
    for m in setup.manifests:
        for path, spec in ks.cluster_specs(m.obj):
            groups: list[tuple[Path_, dict[str, Any]]] = [
                ((*path, "headGroupSpec"), spec["headGroupSpec"])
            ]
            groups += [
                ((*path, "workerGroupSpecs", i), g) for i, g in enumerate(spec["workerGroupSpecs"])
            ]
            for gp, group in groups:
                is_head = gp[-1] == "headGroupSpec"
                cp: Path_ = (*gp, "template", "spec", "containers", 0, "ports")
                ports = container_ports(group["template"]["spec"]["containers"][0])
                required = ["metrics", *(["gcs-server", "dashboard"] if is_head else [])]
                if m.kind == "RayService":
                    required.append("serve")
                if (m.file, path) in training:
                    required.append(TRAINER_METRICS)
                for name in required:
                    if name not in ports:
                        problems.append(m.where(cp) + f": no port named {name!r}")
                for name, (i, number) in ports.items():
                    expected = trainer_port if name == TRAINER_METRICS else RAY_PORTS.get(name)
                    if expected is not None and number != expected:
                        problems.append(
                            m.where((*cp, i, "containerPort")) + f": {name} is {expected}"
                        )
                params: Any = group.get("rayStartParams") or {}
                for param, name in (
                    ("metrics-export-port", "metrics"),
                    ("dashboard-port", "dashboard"),
                    ("port", "gcs-server"),
                ):
                    if param in params and int(params[param]) != ports.get(name, (0, -1))[1]:
                        problems.append(
                            m.where((*gp, "rayStartParams", param)) + f": not the {name} port"
                        )
        if m.kind == "RayService":
            http = serve_config(m).get("http_options", {})
            if http.get("port", RAY_PORTS["serve"]) != RAY_PORTS["serve"]:
                problems.append(m.where(("spec", "serveConfigV2")) + ": http_options.port != 8000")
    return problems


def check_metrics_service(setup: Setup) -> list[str]:
    """The metrics Service selects every Ray pod and targets their named metrics ports."""
    problems: list[str] = []
    (svc,) = [m for m in setup.all("Service") if m.name == "mazerl-metrics"]
    selector = cast(dict[str, str], svc.obj["spec"]["selector"])
    ray_pods = [(m, p, t) for m, p, t in templates(setup) if is_ray_group(p)]
    numbers: dict[str, set[int]] = {}
    for m, path, template in ray_pods:
        labels = {**template["metadata"].get("labels", {}), "ray.io/is-ray-node": "yes"}
        if any(labels.get(k) != v for k, v in selector.items()):
            problems.append(
                m.where((*path, "metadata", "labels")) + f": not selected by {svc.name}"
            )
        for name, (_, number) in container_ports(ks.containers(template)[0]).items():
            numbers.setdefault(name, set()).add(number)
    for i, port in enumerate(svc.obj["spec"]["ports"]):
        target = port.get("targetPort")
        if target not in numbers:
            problems.append(
                svc.where(("spec", "ports", i, "targetPort")) + f": no pod port {target!r}"
            )
        elif numbers[target] != {port["port"]}:
            problems.append(
                svc.where(("spec", "ports", i, "port")) + f": pods serve it on {numbers[target]}"
            )
    return problems


def check_rayservice(setup: Setup) -> list[str]:
    """Ray Serve LLM's OpenAI app serves the run's adapters from its S3 mirror, on its base."""
    rs = setup.one("RayService")
    problems: list[str] = []
    where = rs.where(("spec", "serveConfigV2"))
    apps: Any = serve_config(rs).get("applications") or []
    if len(apps) != 1 or apps[0].get("import_path") != SERVE_APP:
        return [f"{where}: applications: one application, import_path {SERVE_APP}"]
    llms: Any = apps[0].get("args", {}).get("llm_configs") or []
    if len(llms) != 1:
        return [f"{where}: applications[0].args.llm_configs: exactly one"]
    llm: Any = llms[0]
    key = "applications[0].args.llm_configs[0]"
    loading: Any = llm.get("model_loading_config", {})
    if not loading.get("model_id"):
        problems.append(f"{where}: {key}.model_loading_config.model_id: missing")
    model = setup.job_env.get("MAZERL_SFT_CHECKPOINT")
    source = str(loading.get("model_source", ""))
    if not source.startswith(f"{MOUNT}/") or source != model:
        problems.append(
            f"{where}: {key}.model_loading_config.model_source: {source!r}, the run trains "
            f"{model!r} (MAZERL_SFT_CHECKPOINT)"
        )
    lora_path = str(llm.get("lora_config", {}).get("dynamic_lora_loading_path", ""))
    if not lora_path.startswith("s3://") or not lora_path.endswith("/"):
        problems.append(
            f"{where}: {key}.lora_config.dynamic_lora_loading_path: {lora_path!r} is not an "
            "s3:// prefix ending in /"
        )
    mirror = setup.job_env.get("MAZERL_S3_URI")
    if mirror and lora_path != f"{mirror.rstrip('/')}/":
        problems.append(
            f"{where}: {key}.lora_config.dynamic_lora_loading_path: {lora_path!r} is not the "
            f"run's S3 mirror {mirror!r} (MAZERL_S3_URI)"
        )
    engine: Any = llm.get("engine_kwargs", {})
    rank = setup.config.skyrl.trainer.policy.model.lora.rank
    if engine.get("enable_lora") is not True:
        problems.append(f"{where}: {key}.engine_kwargs.enable_lora: must be true")
    if not isinstance(engine.get("max_lora_rank"), int) or engine["max_lora_rank"] < rank:
        problems.append(
            f"{where}: {key}.engine_kwargs.max_lora_rank: {engine.get('max_lora_rank')!r} < "
            f"the trained rank {rank} (trainer.policy.model.lora.rank)"
        )
    gen = setup.config.skyrl.generator
    episode = int(gen.max_input_length or 0) + int(gen.sampling_params.max_generate_length or 0)
    trained_len = int(gen.inference_engine.engine_init_kwargs.get("max_model_len", episode))
    if engine.get("max_model_len", 0) < trained_len:
        problems.append(
            f"{where}: {key}.engine_kwargs.max_model_len: {engine.get('max_model_len')!r} < "
            f"{trained_len}, an episode's length in training"
        )
    images: Any = engine.get("limit_mm_per_prompt", {}).get("image", 0)
    if images < setup.config.max_turns:
        problems.append(
            f"{where}: {key}.engine_kwargs.limit_mm_per_prompt.image: {images} < "
            f"{setup.config.max_turns} (one image per turn, generator.max_turns)"
        )
    (path, spec), *_ = ks.cluster_specs(rs.obj)
    worker_gpus = sum(
        g["maxReplicas"] * sum(gpus(c) for c in ks.containers(g["template"]))
        for g in spec["workerGroupSpecs"]
    )
    scaling: Any = llm.get("deployment_config", {}).get("autoscaling_config", {})
    needed = int(scaling.get("max_replicas", 1)) * int(engine.get("tensor_parallel_size", 1))
    if not worker_gpus or needed > worker_gpus:
        problems.append(
            rs.where((*path, "workerGroupSpecs"))
            + f": {worker_gpus} GPUs for up to {needed} engine GPUs"
        )
    return problems


def check_maze_serve(setup: Setup) -> list[str]:
    """maze-serve follows the run's weight-sync store on the SageMaker port, ready on /ping."""
    problems: list[str] = []
    dep = setup.one("Deployment")
    pod = dep.obj["spec"]["template"]
    base: Path_ = ("spec", "template", "spec", "containers", 0)
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    env_index = {e["name"]: i for i, e in enumerate(c.get("env", []))}
    store = SyncLayout(Path(setup.config.skyrl.trainer.policy.model.lora.lora_sync_path)).store_root
    llm = serve_config(setup.one("RayService"))["applications"][0]["args"]["llm_configs"][0]
    for name, expected in {
        "MAZE_MODEL": setup.job_env.get("MAZERL_SFT_CHECKPOINT"),
        "MAZE_WATCH_DIR": str(store),
        "MAZE_SERVED_MODEL_NAME": llm["model_loading_config"]["model_id"],
    }.items():
        if env.get(name) != expected:
            where = (*base, "env", env_index.get(name, len(env)), "value")
            problems.append(dep.where(where) + f": {name}={env.get(name)!r}, expected {expected!r}")
    if c.get("args") != ["serve"]:
        problems.append(dep.where((*base, "args")) + ": ['serve'] (SageMaker mode)")
    ports = container_ports(c)
    if ports.get("http", (0, -1))[1] != SAGEMAKER_PORT:
        problems.append(dep.where((*base, "ports")) + f": 'http' must be {SAGEMAKER_PORT}")
    probe = c.get("readinessProbe", {}).get("httpGet", {})
    if probe.get("path") != "/ping" or probe.get("port") not in ("http", SAGEMAKER_PORT):
        problems.append(dep.where((*base, "readinessProbe", "httpGet")) + ": GET /ping on http")
    labels = pod["metadata"]["labels"]
    for key, value in dep.obj["spec"]["selector"]["matchLabels"].items():
        if labels.get(key) != value:
            problems.append(
                dep.where(("spec", "selector", "matchLabels", key)) + ": not on the pods"
            )
    (svc,) = [m for m in setup.all("Service") if m.name == dep.name]
    for key, value in svc.obj["spec"]["selector"].items():
        if labels.get(key) != value:
            problems.append(svc.where(("spec", "selector", key)) + ": not on the pods")
    for i, port in enumerate(svc.obj["spec"]["ports"]):
        if port.get("targetPort") not in ports:
            problems.append(svc.where(("spec", "ports", i, "targetPort")) + ": not a pod port")
    return problems


CHECKS = [
    check_storage,
    check_shared_mounts,
    check_scheduling,
    check_images,
    check_ray_versions,
    check_kustomization,
    check_training_job,
    check_cluster_shape,
    check_head_resource,
    check_ports,
    check_metrics_service,
    check_rayservice,
    check_maze_serve,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda f: f.__name__)
def test_manifests_agree(setup: Setup, check: Callable[[Setup], list[str]]) -> None:
    assert check(setup) == []


# --- each check catches an altered manifest, naming the field -----------------------------------


def _set(path: Path_, value: object) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        at(obj, path[:-1])[path[-1]] = value

    return change


def _delete(path: Path_) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        del at(obj, path[:-1])[path[-1]]

    return change


_W0 = ("spec", "workerGroupSpecs", 0)
_HEAD = ("spec", "headGroupSpec")
_SERVE_HEAD = ("spec", "rayClusterConfig", "headGroupSpec")
_JOB_HEAD_C0 = ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec", "containers", 0)
_SPEC_ENV = (
    "env_vars:\n  MAZERL_RUN: maze-grpo-qwen3vl8b\n"
    "  MAZERL_SFT_CHECKPOINT: /shared/models/visgym-sft-qwen3-vl-8b\n"
    "  MAZERL_S3_URI: s3://mazerl-artifacts/runs/maze-grpo-qwen3vl8b\n"
)


def _serve_config(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(obj: dict[str, Any]) -> None:
        cfg = yaml.safe_load(obj["spec"]["serveConfigV2"])
        change(cfg["applications"][0]["args"]["llm_configs"][0])
        obj["spec"]["serveConfigV2"] = yaml.safe_dump(cfg)

    return apply


NEGATIVE = [
    (
        check_storage,
        "PersistentVolumeClaim",
        _set(("spec", "volumeName"), "other-pv"),
        "fsx-storage.yaml: PersistentVolumeClaim/fsx-claim: spec.volumeName: does not name",
    ),
    (
        check_storage,
        "PersistentVolume",
        _set(("spec", "csi", "volumeAttributes", "dnsname"), "fs-1.fsx.us-west-2.amazonaws.com"),
        "PersistentVolume/fsx-pv: spec.csi.volumeAttributes.dnsname: 'fs-1.fsx.us-west-2",
    ),
    (
        check_shared_mounts,
        "RayCluster",
        _set((*_W0, "template", "spec", "volumes", 0, "persistentVolumeClaim", "claimName"), "x"),
        "RayCluster/mazerl: spec.workerGroupSpecs[0].template.spec.volumes[0]"
        ".persistentVolumeClaim.claimName: not the FSx claim",
    ),
    (
        check_shared_mounts,
        "RayJob",
        _set(
            (*_JOB_HEAD_C0, "volumeMounts", 0, "mountPath"),
            "/mnt/fsx",
        ),
        "spec.rayClusterSpec.headGroupSpec.template.spec.containers[0].volumeMounts[0].mountPath:"
        " the FSx claim goes at /shared",
    ),
    (
        check_scheduling,
        "RayJob",
        _delete(("spec", "submitterPodTemplate", "spec", "nodeSelector")),
        "spec.submitterPodTemplate.spec.nodeSelector.sagemaker.amazonaws.com/node-health-status:"
        " must be Schedulable",
    ),
    (
        check_images,
        "RayCluster",
        _set((*_W0, "template", "spec", "containers", 0, "image"), "mazerl-trainer"),
        "spec.workerGroupSpecs[0].template.spec.containers[0].image: 'mazerl-trainer' is not in "
        "kustomization.yaml's images",
    ),
    (
        check_ray_versions,
        "RayCluster",
        _set(("spec", "rayVersion"), "2.40.0"),
        "RayCluster/mazerl: spec.rayVersion: '2.40.0', the mazerl-train image has Ray 2.57.1",
    ),
    (
        check_ray_versions,
        "RayService",
        _set(("spec", "rayClusterConfig", "rayVersion"), "2.50.0"),
        "spec.rayClusterConfig.rayVersion: '2.50.0' but kustomization.yaml's newTag is '2.49.0",
    ),
    (
        check_training_job,
        "RayJob",
        _set(
            ("spec", "entrypoint"),
            "maze-train --config maze_grpo_qwen3vl8b --engine skyrl trainer.resume_mode=latest",
        ),
        "RayJob/maze-grpo-qwen3vl8b: spec.entrypoint: not what maze-train submits",
    ),
    (
        check_training_job,
        "RayJob",
        _set(("spec", "runtimeEnvYAML"), _SPEC_ENV),
        "spec.runtimeEnvYAML: {'env_vars': {'MAZERL_RUN'",  # RAY_OVERRIDE_JOB_RUNTIME_ENV gone
    ),
    (
        check_training_job,
        "RayJob",
        _set(("spec", "backoffLimit"), 0),
        "spec.backoffLimit: >= 1, so a failed run resumes",
    ),
    (
        check_cluster_shape,
        "RayJob",
        _set(("spec", "rayClusterSpec", "workerGroupSpecs", 0, "replicas"), 2),
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas: differs from raycluster.yaml's "
        "spec.workerGroupSpecs[0].replicas",
    ),
    (
        check_cluster_shape,
        "RayCluster",
        _set(
            (*_W0, "template", "spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"),
            "1",
        ),
        "spec.workerGroupSpecs[0].template: 1 GPUs per pod, the config places 2",
    ),
    (
        check_head_resource,
        "RayCluster",
        _set((*_HEAD, "rayStartParams", "resources"), '"{\\"head\\": 1}"'),
        "spec.headGroupSpec.rayStartParams.resources: must declare 'mazerl_head'",
    ),
    (
        check_head_resource,
        "RayCluster",
        _set((*_W0, "rayStartParams", "resources"), '"{\\"mazerl_head\\": 1}"'),
        "spec.workerGroupSpecs[0].rayStartParams.resources: only the head declares",
    ),
    (
        check_ports,
        "RayCluster",
        _set((*_HEAD, "template", "spec", "containers", 0, "ports", 1, "containerPort"), 8266),
        "spec.headGroupSpec.template.spec.containers[0].ports[1].containerPort: dashboard is 8265",
    ),
    (
        check_ports,
        "RayCluster",
        _set((*_W0, "template", "spec", "containers", 0, "ports", 1, "containerPort"), 9401),
        "spec.workerGroupSpecs[0].template.spec.containers[0].ports[1].containerPort: "
        "trainer-metrics is 9400",
    ),
    (
        check_ports,
        "RayService",
        _set((*_SERVE_HEAD, "rayStartParams", "metrics-export-port"), "9090"),
        "spec.rayClusterConfig.headGroupSpec.rayStartParams.metrics-export-port: not the metrics",
    ),
    (
        check_metrics_service,
        "RayService",
        _set((*_SERVE_HEAD, "template", "metadata", "labels", "app.kubernetes.io/part-of"), "x"),
        "spec.rayClusterConfig.headGroupSpec.template.metadata.labels: not selected by",
    ),
    (
        check_rayservice,
        "RayService",
        _serve_config(_set(("lora_config", "dynamic_lora_loading_path"), "/shared/adapters/")),
        "spec.serveConfigV2: applications[0].args.llm_configs[0].lora_config"
        ".dynamic_lora_loading_path: '/shared/adapters/' is not an s3:// prefix",
    ),
    (
        check_rayservice,
        "RayService",
        _serve_config(_set(("engine_kwargs", "max_lora_rank"), 16)),
        "applications[0].args.llm_configs[0].engine_kwargs.max_lora_rank: 16 < the trained rank 32",
    ),
    (
        check_rayservice,
        "RayService",
        _serve_config(_set(("engine_kwargs", "limit_mm_per_prompt", "image"), 16)),
        "engine_kwargs.limit_mm_per_prompt.image: 16 < 21",
    ),
    (
        check_maze_serve,
        "Deployment",
        _set(("spec", "template", "spec", "containers", 0, "env", 2, "value"), "/shared/x"),
        "spec.template.spec.containers[0].env[2].value: MAZE_WATCH_DIR='/shared/x', expected "
        "'/shared/runs/maze-grpo-qwen3vl8b/lora_sync/adapters'",
    ),
]


@pytest.mark.parametrize(
    ("check", "kind", "change", "expected"),
    NEGATIVE,
    ids=[f"{c.__name__}-{i}" for i, (c, *_) in enumerate(NEGATIVE)],
)
def test_check_rejects_altered_manifest(
    setup: Setup,
    check: Callable[[Setup], list[str]],
    kind: str,
    change: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    problems = check(altered(setup, kind, change))
    assert any(expected in p for p in problems), problems


def test_kustomization_check_rejects_an_unlisted_manifest(setup: Setup) -> None:
    k = ks.deep(setup.kustomization)
    k["resources"].remove("metrics-service.yaml")
    problems = check_kustomization(replace(setup, kustomization=k))
    assert problems == [
        "kustomization.yaml: resources: metrics-service.yaml is neither listed nor an alternative"
    ]


def test_entrypoint_overrides_are_checked_by_the_config_schema(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    rayjob = ks.deep(setup.one("RayJob"))
    rayjob.obj["spec"]["entrypoint"] = rayjob.obj["spec"]["entrypoint"].replace(
        "trainer.resume_mode=", "trainer.resume_mod="
    )
    with pytest.raises(AssertionError) as err:
        load_reference(rayjob, monkeypatch)
    assert str(err.value).startswith(
        "rayjob-train.yaml: RayJob/maze-grpo-qwen3vl8b: spec.entrypoint"
    )
    assert "trainer.resume_mod: unknown key" in str(err.value)


@pytest.mark.parametrize(
    ("entrypoint", "why"),
    [
        ("maze-train --engine gpu --config maze_grpo_qwen3vl8b", "parser refused"),
        ("maze-train --engine skyrl --config maze_grpo_qwen3vl8b resume", "not key=value"),
        ("maze-train --config maze_grpo_qwen3vl8b", "--engine local, the cluster runs skyrl"),
        ("python -m maze_trainer --engine skyrl", "not maze-train"),
    ],
)
def test_entrypoint_goes_through_maze_trains_parser(
    setup: Setup, entrypoint: str, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rayjob = ks.deep(setup.one("RayJob"))
    rayjob.obj["spec"]["entrypoint"] = entrypoint
    with pytest.raises(AssertionError, match=re.escape("spec.entrypoint")) as err:
        parse_entrypoint(rayjob)
    assert why in str(err.value)


# --- the image build --------------------------------------------------------------------------


def test_images_are_the_ones_the_image_build_defines(setup: Setup) -> None:
    mapped = {i["name"] for i in setup.kustomization["images"]}
    assert set(IMAGE_DOCKERFILES) <= mapped
    if not IMAGES_DIR.is_dir():
        pytest.skip("infra/images/ is not there: checked against IMAGE_DOCKERFILES only")
    for image, dockerfile in IMAGE_DOCKERFILES.items():
        path = IMAGES_DIR / dockerfile
        assert path.is_file(), f"{image}: infra/images/{dockerfile} missing"
        assert f"-t {image} " in path.read_text(), (
            f"infra/images/{dockerfile} does not build {image}"
        )
    train = (IMAGES_DIR / IMAGE_DOCKERFILES[TRAIN_IMAGE]).read_text()
    skyrl = re.search(r"^ARG SKYRL_VERSION=(\S+)", train, re.MULTILINE)
    assert skyrl and skyrl.group(1) == importlib.metadata.version("skyrl"), (
        "train.Dockerfile installs another skyrl than the lock's: rayVersion is checked against "
        "the locked skyrl's Ray pin"
    )
    serve = (IMAGES_DIR / IMAGE_DOCKERFILES[SERVE_IMAGE]).read_text()
    exposed = {p.split("/")[0] for line in DOCKERFILE_EXPOSE.findall(serve) for p in line.split()}
    assert str(SAGEMAKER_PORT) in exposed, (
        f"serve-deployment.yaml expects {SERVE_IMAGE} on {SAGEMAKER_PORT}, the Dockerfile "
        f"exposes {sorted(exposed)}"
    )
    entrypoint = re.search(r"^ENTRYPOINT\s+(.+)$", serve, re.MULTILINE)
    assert entrypoint and "maze-serve" in entrypoint.group(1), (
        "serve-deployment.yaml passes args ['serve'] to the maze-serve entrypoint"
    )
