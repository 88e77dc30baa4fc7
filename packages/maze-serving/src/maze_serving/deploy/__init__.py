"""Deployment manifests shipped with the package (the GPU path: Ray Serve LLM on KubeRay)."""

from __future__ import annotations

from importlib.resources import files
from typing import Any, cast

import yaml

RAYSERVICE = "rayservice.yaml"


def rayservice_manifest() -> dict[str, Any]:
    """The KubeRay RayService manifest, with ``spec.serveConfigV2`` parsed into a dict too.

    Returns ``{"manifest": <RayService dict>, "serve_config": <serveConfigV2 dict>}``.
    """
    text = files(__package__).joinpath(RAYSERVICE).read_text()
    manifest = cast(dict[str, Any], yaml.safe_load(text))
    serve = cast(dict[str, Any], yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    return {"manifest": manifest, "serve_config": serve}


def rayservice_text() -> str:
    """The manifest as shipped (``kubectl apply -f -`` input)."""
    return files(__package__).joinpath(RAYSERVICE).read_text()
