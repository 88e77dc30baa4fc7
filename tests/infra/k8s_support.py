"""Loading and validating the Kubernetes manifests of ``infra/k8s/``.

Three validators, each returning problems as ``"<field path>: <what is wrong>"`` strings:

* :func:`crd_errors`: a KubeRay custom resource against its CRD's ``openAPIV3Schema``, vendored
  in ``data/kuberay/`` (see its README). Plain JSON Schema does not know the Kubernetes
  extensions, so they are implemented here: ``x-kubernetes-int-or-string`` (an integer or a
  string, the pattern applying to strings: resource quantities), ``x-kubernetes-list-type``
  ``map`` (no two items with the same ``x-kubernetes-list-map-keys``, e.g. container names) and
  ``set``, ``nullable``, ``format: int32/int64`` ranges, and unknown fields as errors (objects
  whose schema lists properties accept no others), as ``kubectl apply``'s default strict field
  validation reports them. CEL rules (``x-kubernetes-validations``) are not evaluated.
* :func:`core_errors`: built-in objects (PersistentVolume, Service, Deployment, ...) with
  ``kubernetes-validate``'s strict schemas of :data:`KUBERNETES_VERSION`.
* :func:`pod_template_errors`: the pod templates inside the custom resources (and workloads),
  each validated by ``kubernetes-validate`` as a core ``PodTemplate``.

:func:`kuberay_rule_errors` adds rules the KubeRay operator enforces itself (names, replica
bounds, RayJob modes) that no schema expresses.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

import kubernetes_validate
import yaml
from jsonschema import Draft4Validator, FormatChecker, ValidationError, validators

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "infra" / "k8s"
KUBERAY_DATA = Path(__file__).resolve().parent / "data" / "kuberay"
KUBERNETES_VERSION = "1.34"
"""The Kubernetes API version core objects are checked against: in EKS standard support."""
CRD_FILES = {"RayCluster": "rayclusters", "RayJob": "rayjobs", "RayService": "rayservices"}
"""Kind -> stem of its vendored ``<stem>.v1.schema.json.gz``."""
KUSTOMIZE_KINDS = ("Kustomization", "Component")

Path_ = tuple[str | int, ...]
"""A field path inside a manifest: mapping keys and list indexes."""


@dataclass(frozen=True)
class Manifest:
    """One object of a YAML file under ``infra/k8s/``."""

    file: str
    """Path relative to ``infra/k8s/``."""
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.obj.get("metadata", {}).get("name", ""))

    def where(self, path: Path_ = ()) -> str:
        """``file: Kind/name: field.path``, for messages."""
        label = f"{self.file}: {self.kind}/{self.name}"
        return f"{label}: {field_path(path)}" if path else label


def field_path(parts: Iterable[str | int]) -> str:
    """``("spec", "containers", 0, "image")`` -> ``spec.containers[0].image``."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def load_manifests(root: Path = K8S_DIR) -> list[Manifest]:
    """Every Kubernetes object in the YAML files under ``root`` (kustomizations excluded)."""
    out: list[Manifest] = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root).as_posix()
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and cast(dict[str, Any], doc).get("kind") not in (
                *KUSTOMIZE_KINDS,
                None,
            ):
                out.append(Manifest(rel, cast(dict[str, Any], doc)))
    return out


def load_kustomization(directory: Path = K8S_DIR) -> dict[str, Any]:
    """The ``kustomization.yaml`` of ``directory``."""
    return cast(dict[str, Any], yaml.safe_load((directory / "kustomization.yaml").read_text()))


# ---------------------------------------------------------------------------------------------
# Error formatting


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(error: ValidationError, prefix: Path_ = ()) -> list[str]:
    """One or more ``path: message`` lines for a schema error, naming the offending field."""
    path: Path_ = (*prefix, *error.absolute_path)
    instance: Any = error.instance
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = cast(dict[str, Any], error.schema).get("properties", {})
        extra = sorted(k for k in cast(dict[str, Any], instance) if k not in known)
        return [f"{field_path((*path, k))}: unknown field" for k in extra]
    if error.validator == "required" and isinstance(instance, dict):
        missing = [k for k in cast(list[str], error.validator_value) if k not in instance]
        return [f"{field_path((*path, k))}: required field missing" for k in missing]
    if instance is None and error.validator == "type":
        return [
            f"{field_path(path)}: null (leave the field out, or give it a value of type "
            f"{error.validator_value!r})"
        ]
    return [f"{field_path(path)}: {_short(error.message)}"]


# ---------------------------------------------------------------------------------------------
# KubeRay CRD schemas


def kuberay_version() -> str:
    """The KubeRay release the vendored CRD schemas come from."""
    return (KUBERAY_DATA / "VERSION").read_text().strip()


def _strict(node: Any) -> Any:
    """A copy of a structural schema with unknown fields refused and int-or-string simplified."""
    if isinstance(node, list):
        return [_strict(x) for x in cast(list[Any], node)]
    if not isinstance(node, dict):
        return node
    schema = {k: _strict(v) for k, v in cast(dict[str, Any], node).items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string"):
        # The anyOf [integer, string] that controller-gen writes beside the extension says the
        # same as the extension; one check gives one clear message.
        schema.pop("anyOf", None)
    return schema


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The vendored ``openAPIV3Schema`` of a KubeRay kind, prepared by :func:`_strict`."""
    raw = gzip.decompress((KUBERAY_DATA / f"{CRD_FILES[kind]}.v1.schema.json.gz").read_bytes())
    return cast(dict[str, Any], _strict(json.loads(raw)))


def _type(
    validator: Any, types: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if instance is None and schema.get("nullable"):
        return
    yield from Draft4Validator.VALIDATORS["type"](validator, types, instance, schema)


def _int_or_string(
    validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    del validator, schema
    if value and (isinstance(instance, bool) or not isinstance(instance, int | str)):
        yield ValidationError(
            f"{instance!r} is not an integer or a string (x-kubernetes-int-or-string: quote "
            "fractional quantities, e.g. '0.5' or 500m)"
        )


def _list_type(
    validator: Any, value: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    del validator
    if not isinstance(instance, list):
        return
    items = cast(list[Any], instance)
    seen: dict[str, int] = {}
    if value == "map":
        keys = cast(list[str], schema.get("x-kubernetes-list-map-keys", []))
        props = cast(dict[str, Any], schema.get("items", {})).get("properties", {})
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            entry = cast(dict[str, Any], item)
            key = {k: entry.get(k, props.get(k, {}).get("default")) for k in keys}
            text = json.dumps(key, sort_keys=True)
            if text in seen:
                yield ValidationError(
                    f"duplicate entry {key} (already at [{seen[text]}]): list-map keys "
                    f"{keys} must be unique",
                    path=[i],
                )
            seen.setdefault(text, i)
    elif value == "set":
        for i, item in enumerate(items):
            text = json.dumps(item, sort_keys=True)
            if text in seen:
                yield ValidationError(
                    f"duplicate item (already at [{seen[text]}]) in a set", path=[i]
                )
            seen.setdefault(text, i)


def _format_checker() -> FormatChecker:
    checker = FormatChecker(formats=())
    for name, bits in (("int32", 32), ("int64", 64)):

        def in_range(instance: object, bits: int = bits) -> bool:
            return not isinstance(instance, int) or -(2 ** (bits - 1)) <= instance < 2 ** (bits - 1)

        checker.checks(name)(in_range)
    return checker


KubeValidator = cast(
    Any,
    validators.extend(
        Draft4Validator,
        validators={
            "type": _type,
            "x-kubernetes-int-or-string": _int_or_string,
            "x-kubernetes-list-type": _list_type,
        },
    ),
)
"""JSON Schema draft 4 (what OpenAPI 3.0 schemas build on) with the Kubernetes extensions."""


@cache
def crd_validator(kind: str) -> Any:
    """A validator for one KubeRay kind (compiled once)."""
    return KubeValidator(crd_schema(kind), format_checker=_format_checker())


def crd_errors(obj: Mapping[str, Any]) -> list[str]:
    """Schema problems of a KubeRay object (RayCluster, RayJob, RayService)."""
    kind = str(obj.get("kind"))
    if obj.get("apiVersion") != "ray.io/v1":
        return [f"apiVersion: {obj.get('apiVersion')!r}, expected 'ray.io/v1'"]
    errors = sorted(crd_validator(kind).iter_errors(obj), key=lambda e: list(map(str, e.path)))
    return [line for e in errors for line in describe(e)]


# ---------------------------------------------------------------------------------------------
# Core objects and pod templates


def core_errors(obj: Mapping[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """Schema problems of a built-in object (``kubernetes-validate``, strict: no unknown fields).

    ``kubernetes-validate`` stops at the first problem, so this lists at most one.
    """
    try:
        kubernetes_validate.validate(dict(obj), version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return describe(e)
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"apiVersion/kind: {e.message}"]
    return []


def pod_templates(obj: Mapping[str, Any]) -> list[tuple[Path_, dict[str, Any]]]:
    """``(path, PodTemplateSpec)`` of every pod template an object carries."""
    spec = cast(dict[str, Any], obj.get("spec") or {})
    found: list[tuple[Path_, dict[str, Any]]] = []

    def cluster(base: Path_, cluster_spec: Any) -> None:
        if not isinstance(cluster_spec, dict):
            return
        cs = cast(dict[str, Any], cluster_spec)
        head = cast(dict[str, Any], cs.get("headGroupSpec") or {})
        if isinstance(head.get("template"), dict):
            found.append(((*base, "headGroupSpec", "template"), head["template"]))
        for i, group in enumerate(cast(list[Any], cs.get("workerGroupSpecs") or [])):
            if isinstance(group, dict) and isinstance(group.get("template"), dict):
                template = cast(dict[str, Any], group)["template"]
                found.append(((*base, "workerGroupSpecs", i, "template"), template))

    kind = obj.get("kind")
    if kind == "RayCluster":
        cluster(("spec",), spec)
    elif kind == "RayJob":
        cluster(("spec", "rayClusterSpec"), spec.get("rayClusterSpec"))
        if isinstance(spec.get("submitterPodTemplate"), dict):
            found.append((("spec", "submitterPodTemplate"), spec["submitterPodTemplate"]))
    elif kind == "RayService":
        cluster(("spec", "rayClusterConfig"), spec.get("rayClusterConfig"))
    elif isinstance(spec.get("template"), dict):  # Deployment, StatefulSet, Job, ...
        found.append((("spec", "template"), spec["template"]))
    return found


def pod_template_errors(obj: Mapping[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """Problems of every embedded pod template, each checked as a core ``PodTemplate``."""
    problems: list[str] = []
    for path, template in pod_templates(obj):
        wrapper = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "pod-template"},
            "template": template,
        }
        try:
            kubernetes_validate.validate(wrapper, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            # The error's path starts at the wrapper's "template" key: put the real path there.
            inner = list(e.absolute_path)[1:]
            e.path.clear()
            e.path.extend(inner)
            problems += describe(e, prefix=path)
    return problems


# ---------------------------------------------------------------------------------------------
# Rules of the KubeRay operator that no schema carries (its own admission checks)

MAX_NAME_LENGTH = {"RayCluster": 53, "RayJob": 47, "RayService": 47}
"""KubeRay derives child names from these (cluster name + suffixes), hence the limits."""
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def cluster_specs(obj: Mapping[str, Any]) -> list[tuple[Path_, dict[str, Any]]]:
    """``(path, RayClusterSpec)`` of a KubeRay object (none for other kinds)."""
    spec = cast(dict[str, Any], obj.get("spec") or {})
    kind = obj.get("kind")
    if kind == "RayCluster":
        return [(("spec",), spec)]
    key = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}.get(str(kind))
    if key and isinstance(spec.get(key), dict):
        return [(("spec", key), cast(dict[str, Any], spec[key]))]
    return []


def kuberay_rule_errors(obj: Mapping[str, Any]) -> list[str]:
    """Problems the KubeRay operator would refuse the object for, beyond its schema."""
    kind = str(obj.get("kind"))
    problems: list[str] = []
    name = str(cast(dict[str, Any], obj.get("metadata") or {}).get("name", ""))
    if kind in MAX_NAME_LENGTH:
        if len(name) > MAX_NAME_LENGTH[kind]:
            problems.append(f"metadata.name: longer than {MAX_NAME_LENGTH[kind]} characters")
        if not _DNS1035.fullmatch(name):
            problems.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    for base, cs in cluster_specs(obj):
        autoscaling = bool(cs.get("enableInTreeAutoscaling"))
        groups: list[tuple[Path_, dict[str, Any]]] = [
            ((*base, "headGroupSpec"), cast(dict[str, Any], cs.get("headGroupSpec") or {}))
        ]
        for i, g in enumerate(cast(list[dict[str, Any]], cs.get("workerGroupSpecs") or [])):
            gp: Path_ = (*base, "workerGroupSpecs", i)
            groups.append((gp, g))
            lo, n, hi = g.get("minReplicas"), g.get("replicas"), g.get("maxReplicas")
            if not autoscaling and (lo is None or hi is None):
                problems.append(
                    f"{field_path(gp)}: minReplicas and maxReplicas are both required when "
                    "enableInTreeAutoscaling is off"
                )
            if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                problems.append(f"{field_path((*gp, 'minReplicas'))}: greater than maxReplicas")
            if (
                isinstance(n, int)
                and isinstance(lo, int)
                and isinstance(hi, int)
                and not lo <= n <= hi
            ):
                problems.append(
                    f"{field_path((*gp, 'replicas'))}: outside minReplicas..maxReplicas"
                )
        for gp, g in groups:
            params = cast(dict[str, Any], g.get("rayStartParams") or {})
            if g.get("resources") and any(
                params.get(k) for k in ("num-cpus", "num-gpus", "memory", "resources")
            ):
                problems.append(
                    f"{field_path((*gp, 'resources'))}: set in both rayStartParams and resources"
                )
            if "labels" in params:
                problems.append(
                    f"{field_path((*gp, 'rayStartParams', 'labels'))}: not supported, use the "
                    "group's labels field"
                )
            template = cast(dict[str, Any], g.get("template") or {})
            if not cast(dict[str, Any], template.get("spec") or {}).get("containers"):
                problems.append(f"{field_path((*gp, 'template'))}: no containers")
    spec = cast(dict[str, Any], obj.get("spec") or {})
    if kind == "RayJob":
        problems += _rayjob_rules(spec)
    return problems


def _rayjob_rules(spec: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    selector = bool(spec.get("clusterSelector"))
    if selector == ("rayClusterSpec" in spec):
        problems.append(
            "spec.rayClusterSpec: give exactly one of rayClusterSpec and clusterSelector"
        )
    backoff = spec.get("backoffLimit")
    if selector and isinstance(backoff, int) and backoff > 0:
        problems.append("spec.backoffLimit: not allowed with clusterSelector")
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode == "InteractiveMode" and isinstance(backoff, int) and backoff > 0:
        problems.append("spec.backoffLimit: not allowed in InteractiveMode")
    if mode == "SidecarMode" and "submitterPodTemplate" in spec:
        problems.append("spec.submitterPodTemplate: not allowed in SidecarMode")
    if spec.get("ttlSecondsAfterFinished") and not spec.get("shutdownAfterJobFinishes"):
        problems.append("spec.ttlSecondsAfterFinished: needs shutdownAfterJobFinishes: true")
    try:
        env = yaml.safe_load(spec.get("runtimeEnvYAML") or "{}")
    except yaml.YAMLError as e:
        return [*problems, f"spec.runtimeEnvYAML: not YAML ({_short(str(e))})"]
    if not isinstance(env, dict):
        problems.append("spec.runtimeEnvYAML: must be a YAML mapping")
    return problems


# ---------------------------------------------------------------------------------------------


def validate(manifest: Manifest) -> list[str]:
    """Every problem of one object, by the validators that apply to its kind, located."""
    obj = manifest.obj
    if obj.get("kind") in CRD_FILES:
        problems = crd_errors(obj) + kuberay_rule_errors(obj) + pod_template_errors(obj)
    else:
        problems = core_errors(obj) + pod_template_errors(obj)
    return [f"{manifest.where()}: {p}" for p in problems]


def containers(template: Mapping[str, Any]) -> Sequence[dict[str, Any]]:
    """The containers and init containers of a pod template."""
    spec = cast(dict[str, Any], template.get("spec") or {})
    return [
        *cast(list[dict[str, Any]], spec.get("initContainers") or []),
        *cast(list[dict[str, Any]], spec.get("containers") or []),
    ]


def deep(obj: Any) -> Any:
    """A deep copy, for altering a manifest in a test."""
    return copy.deepcopy(obj)
