"""The shipped RayService manifest: Ray Serve LLM's OpenAI app with dynamic LoRA from S3."""

from __future__ import annotations

from maze_serving import deploy


def test_rayservice_uses_build_openai_app_with_dynamic_lora() -> None:
    loaded = deploy.rayservice_manifest()
    manifest, serve = loaded["manifest"], loaded["serve_config"]
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"
    (app,) = serve["applications"]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    (llm,) = app["args"]["llm_configs"]
    loading = llm["model_loading_config"]
    assert loading["model_id"] and loading["model_source"].startswith("/shared/")
    lora_path = llm["lora_config"]["dynamic_lora_loading_path"]
    assert lora_path.startswith("s3://") and lora_path.endswith("/")
    engine = llm["engine_kwargs"]
    assert engine["enable_lora"] is True and engine["max_lora_rank"] == 32
    assert engine["max_model_len"] >= 4096 and engine["limit_mm_per_prompt"]["image"] >= 1
    workers = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert any(
        c["resources"]["limits"].get("nvidia.com/gpu")
        for w in workers
        for c in w["template"]["spec"]["containers"]
    )
    assert "build_openai_app" in deploy.rayservice_text()
