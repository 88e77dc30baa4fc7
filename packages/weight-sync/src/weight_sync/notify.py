"""Tell a vLLM-compatible server to load a new adapter version (stdlib HTTP only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

from weight_sync.errors import NotifyError


def notify_vllm(
    base_url: str,
    lora_name: str,
    lora_path: str | Path,
    *,
    timeout: float = 30.0,
    api_key: str | None = None,
    load_inplace: bool = False,
) -> str:
    """``POST {base_url}/v1/load_lora_adapter`` with ``{"lora_name", "lora_path"}``.

    The server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``. vLLM refuses to load a
    ``lora_name`` that is already loaded, so either use one name per version or pass
    ``load_inplace=True`` on servers that support replacing in place. Returns the response
    body; raises ``NotifyError`` on a non-2xx status, timeout or connection failure.
    """
    if not lora_name:
        raise NotifyError("lora_name must not be empty")
    url = base_url.rstrip("/") + "/v1/load_lora_adapter"
    body: dict[str, object] = {"lora_name": lora_name, "lora_path": str(lora_path)}
    if load_inplace:
        body["load_inplace"] = True
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace").strip()[:500]
        raise NotifyError(
            f"POST {url} for {lora_name!r} -> HTTP {exc.code}: {detail or exc.reason}"
        ) from None
    except TimeoutError:
        raise NotifyError(f"POST {url} for {lora_name!r} timed out after {timeout}s") from None
    except urllib.error.URLError as exc:
        raise NotifyError(f"POST {url} for {lora_name!r} failed: {exc.reason}") from None
