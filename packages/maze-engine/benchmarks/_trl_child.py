"""TRL side of ``bench_trl.py``: ``GRPOTrainer`` on the tiny VLM, timed per training step.

Runs in TRL's own environment (started by ``bench_trl.py`` with ``uv run --isolated``), so it
imports nothing from this repository: the model comes from a directory through plain
transformers, the prompts from the JSON file ``bench_trl.py`` writes. Prints one JSON line,
prefixed ``TRL_RESULT``, with the wall time and sampled completion tokens of every step.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import itertools
import json
import re
import time
from pathlib import Path
from typing import Any, cast

import torch

RESULT_PREFIX = "TRL_RESULT "
ACTION = re.compile(r"<action>\s*([a-z]+)\s*</action>")


def main() -> None:
    """Train ``--steps`` GRPO steps with TRL and print the per-step figures."""
    p = argparse.ArgumentParser()
    p.add_argument("--spec", type=Path, required=True, help="JSON written by bench_trl.py")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args()
    spec = cast(dict[str, Any], json.loads(args.spec.read_text()))
    torch.set_num_threads(int(spec["threads"]))

    import transformers
    from peft import LoraConfig
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor, TrainerCallback

    # trl is installed only in this process's environment, not where the repo type-checks.
    trl: Any = importlib.import_module("trl")
    dataset_cls: Any = importlib.import_module("datasets").Dataset
    model_dir = str(spec["model_dir"])
    model: Any = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32)
    processor: Any = AutoProcessor.from_pretrained(model_dir)  # pyright: ignore[reportUnknownVariableType]
    rows = cast(list[dict[str, Any]], spec["rows"])
    # Plain string contents: TRL puts the image part before the user text, as our prompt has it.
    dataset: Any = dataset_cls.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": r["system"]},
                    {"role": "user", "content": r["task"]},
                ],
                "image": Image.open(r["image"]).convert("RGB"),
                "first_move": r["first_move"],
            }
            for r in rows
        ]
    )

    tokens_per_call: list[int] = []

    def first_move_reward(
        completions: list[list[dict[str, str]]], first_move: list[str], **kwargs: Any
    ) -> list[float]:
        # TRL hands reward functions the sampled ids: count them here, once per generation batch.
        ids = cast(list[list[int]], kwargs["completion_ids"])
        tokens_per_call.append(sum(len(c) for c in ids))
        out: list[float] = []
        for c, want in zip(completions, first_move, strict=True):
            m = ACTION.search(c[0]["content"])
            out.append(1.0 if m is not None and m.group(1) == want else 0.0)
        return out

    step_ends: list[float] = []

    class StepClock(TrainerCallback):  # pyright: ignore[reportUntypedBaseClass]
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            step_ends.append(time.perf_counter())

        def on_step_end(self, *a: Any, **k: Any) -> None:
            step_ends.append(time.perf_counter())

    lora = cast(dict[str, Any], spec["lora"])
    n = int(spec["n_samples"])
    config: Any = trl.GRPOConfig(
        output_dir=str(args.out_dir),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=int(spec["seed"]),
        max_steps=args.steps,
        learning_rate=float(spec["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=float(spec["max_grad_norm"]),
        # One generation batch and one optimizer step per training step, as ours.
        per_device_train_batch_size=int(spec["prompts"]) * n,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=n,
        max_completion_length=int(spec["max_new_tokens"]),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",
        # Our Policy suppresses the same ids: vision placeholders a random model could sample.
        generation_kwargs={"suppress_tokens": list(spec["suppress_ids"])},
        gradient_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    peft_config = LoraConfig(
        r=int(lora["rank"]),
        lora_alpha=int(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=lora["target_modules"],
        exclude_modules=lora["exclude_modules"],
    )
    trainer: Any = trl.GRPOTrainer(
        model=model,
        reward_funcs=[first_move_reward],
        args=config,
        train_dataset=dataset,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=[StepClock()],
    )
    # Rollout share of each step: sampling, rewards and advantages (TRL's one rollout call).
    rollout_seconds: list[float] = []
    generate_and_score: Any = trainer._generate_and_score_completions

    def timed_generate_and_score(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out: Any = generate_and_score(*a, **k)
        rollout_seconds.append(time.perf_counter() - t0)
        return out

    trainer._generate_and_score_completions = timed_generate_and_score
    params = cast(list[torch.nn.Parameter], list(trainer.model.parameters()))
    trainable = sum(p.numel() for p in params if p.requires_grad)
    # The first prompt as TRL's generation sees it, for bench_trl.py to compare with ours.
    first = dataset[0]
    messages: Any = trl.data_utils.prepare_multimodal_messages(
        first["prompt"], images=[first["image"]]
    )
    tokenized: Any = processor.apply_chat_template(  # pyright: ignore[reportUnknownVariableType]
        conversation=[messages], add_generation_prompt=True, tokenize=True, return_dict=True
    )
    prompt_ids = cast(list[int], tokenized["input_ids"][0])
    trainer.train()
    steps = [b - a for a, b in itertools.pairwise(step_ends)]
    result = {
        "step_seconds": steps,
        "step_tokens": tokens_per_call,
        "rollout_seconds": rollout_seconds,
        "trainable_params": trainable,
        "prompt_ids": [int(i) for i in prompt_ids],
        "versions": {
            "trl": str(trl.__version__),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "peft": importlib.metadata.version("peft"),
        },
        "threads": torch.get_num_threads(),
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
