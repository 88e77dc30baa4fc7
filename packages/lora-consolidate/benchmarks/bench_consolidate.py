"""Streaming consolidation vs the naive "load every rank file, then concatenate", in one run.

    uv run python packages/lora-consolidate/benchmarks/bench_consolidate.py [--ranks 4] [--layers 36]

Generates a per-rank FSDP2-style checkpoint with the LoRA shapes of Qwen3-VL-8B at rank 32
(36 layers, q/k/v/o/gate/up/down; 87.3M parameters, 175 MB in bf16), sharded on dim 0 over
``--ranks`` ranks. The files hold real DTensors, but they are written directly (through the same
code path as ``reshard``), not by running FSDP on an 8B model. Each mode then runs in a fresh
child process. After its imports the child resets its RSS high-water mark (Linux
``/proc/self/clear_refs``); "work peak" is VmHWM at the end minus VmRSS at the reset, i.e. the
memory the consolidation itself added. "peak RSS" is the child's ``ru_maxrss`` (os.wait4), which
includes importing torch. Time is measured inside the child after imports. ``copy`` is a plain shutil.copy of the shard files: the I/O ceiling.
All modes read the files from a warm page cache (just written).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch

# (name, out_features, in_features) of the LoRA-wrapped linears of one Qwen3-VL-8B text layer.
_HIDDEN, _KV, _FFN = 4096, 1024, 12288
_MODULES = [
    ("self_attn.q_proj", _HIDDEN, _HIDDEN),
    ("self_attn.k_proj", _KV, _HIDDEN),
    ("self_attn.v_proj", _KV, _HIDDEN),
    ("self_attn.o_proj", _HIDDEN, _HIDDEN),
    ("mlp.gate_proj", _FFN, _HIDDEN),
    ("mlp.up_proj", _FFN, _HIDDEN),
    ("mlp.down_proj", _HIDDEN, _FFN),
]


def _global_shapes(layers: int, rank: int) -> list[tuple[str, tuple[int, int]]]:
    shapes: list[tuple[str, tuple[int, int]]] = []
    for layer in range(layers):
        for module, out_f, in_f in _MODULES:
            prefix = f"base_model.model.model.language_model.layers.{layer}.{module}"
            shapes.append((f"{prefix}.lora_A.default.weight", (rank, in_f)))
            shapes.append((f"{prefix}.lora_B.default.weight", (out_f, rank)))
    return shapes


def generate(directory: Path, ranks: int, layers: int, lora_rank: int) -> int:
    """Write model_world_size_{ranks}_rank_R.pt files; return the total tensor bytes."""
    from torch.distributed.tensor import Shard

    from lora_consolidate.reshard import make_dtensor, make_mesh
    from lora_consolidate.sources import rank_file_name, shard_box

    directory.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    meshes = [make_mesh("cpu", ranks, r) for r in range(ranks)]
    states: list[dict[str, Any]] = [{} for _ in range(ranks)]
    total = 0
    for name, shape in _global_shapes(layers, lora_rank):
        full = torch.randn(shape, generator=gen).to(torch.bfloat16)
        total += full.numel() * full.element_size()
        for r in range(ranks):
            (offsets, sizes), _ = shard_box(
                shape, (ranks,), (r,), (Shard(0),), where=directory, key=name
            )
            local = full[offsets[0] : offsets[0] + sizes[0]].clone()
            states[r][name] = make_dtensor(local, meshes[r], Shard(0), shape)
    for r in range(ranks):
        torch.save(states[r], directory / rank_file_name(ranks, r))
    return total


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _child(modes: str, src: Path, dst_prefix: Path) -> None:
    # Import everything the modes use before the first measurement.
    for module in ("lora_consolidate", "safetensors.torch", "torch.distributed.tensor"):
        importlib.import_module(module)

    results: dict[str, dict[str, float]] = {}
    for mode in modes.split(","):
        dst = dst_prefix.parent / f"{dst_prefix.name}-{mode}"
        # Reset the RSS high-water mark to the current RSS (Linux clear_refs "5"), so the peak
        # reported is this mode's work, not the imports' transient or an earlier mode.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        baseline = _rss_kib("VmRSS")
        started = time.perf_counter()
        _work(mode, src, dst)
        results[mode] = {
            "seconds": time.perf_counter() - started,
            "baseline_kib": baseline,
            "hwm_kib": _rss_kib("VmHWM"),
        }
    print(json.dumps(results))


def _work(mode: str, src: Path, dst: Path) -> None:
    from safetensors.torch import save_file  # pyright: ignore[reportUnknownVariableType]
    from torch.distributed.tensor import DTensor, Shard

    from lora_consolidate import consolidate
    from lora_consolidate.keys import peft_key

    if mode == "stream":
        consolidate(src, dst, lora_alpha=64)
    elif mode == "naive":
        files = sorted(
            src.glob("model_world_size_*_rank_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1])
        )
        shards = [torch.load(f, map_location="cpu", weights_only=True) for f in files]
        out: dict[str, torch.Tensor] = {}
        for key, ref in shards[0].items():
            assert isinstance(ref, DTensor)
            placement = ref.placements[0]
            assert isinstance(placement, Shard)
            dim = cast(int, placement.dim)
            out[peft_key(key) or key] = torch.cat([sd[key].to_local() for sd in shards], dim=dim)
        dst.mkdir()
        save_file(out, dst / "adapter_model.safetensors", metadata={"format": "pt"})
    elif mode == "copy":
        dst.mkdir()
        for file in src.iterdir():
            shutil.copy(file, dst / file.name)
    elif mode != "import":
        raise SystemExit(f"unknown mode {mode}")


def _run_child(modes: str, src: Path, dst_prefix: Path) -> dict[str, dict[str, float]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "_child", modes, str(src), str(dst_prefix)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{modes} child failed with {proc.returncode}")
    results = json.loads(output.decode().strip().splitlines()[-1])
    # VmHWM was reset before each mode, so it is that mode's own peak; ru_maxrss (KiB on Linux)
    # is the whole child's, import transient included.
    return {
        mode: {
            "seconds": r["seconds"],
            "peak_rss_mb": usage.ru_maxrss / 1024,
            "over_baseline_mb": (r["hwm_kib"] - r["baseline_kib"]) / 1024,
        }
        for mode, r in results.items()
    }


def _same_output(a: Path, b: Path) -> bool:
    from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

    x = load_file(a / "adapter_model.safetensors")
    y = load_file(b / "adapter_model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Generate the checkpoint, time each mode in a child process, print and return the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--modes", default="import,copy,naive,stream")
    p.add_argument("--workdir", type=Path, help="default: a temporary directory")
    p.add_argument("--json", action="store_true", help="print results as JSON only")
    p.add_argument(
        "--one-process",
        action="store_true",
        help="run all modes in one child (list stream before naive: memory freed by an earlier "
        "mode can be reused without raising RSS)",
    )
    args = p.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="lora-bench-"))
    try:
        src = work / "policy"
        t0 = time.perf_counter()
        total = generate(src, args.ranks, args.layers, args.lora_rank)
        gen_s = time.perf_counter() - t0
        shard_bytes = sum(f.stat().st_size for f in src.iterdir())
        results: dict[str, dict[str, float]] = {}
        if args.one_process:  # cheaper (one torch import); stream runs first, see --help
            results = _run_child(args.modes, src, work / "out")
        else:
            for mode in args.modes.split(","):
                results.update(_run_child(mode, src, work / "out"))
        report: dict[str, Any] = {
            "ranks": args.ranks,
            "tensor_mb": total / 2**20,
            "shard_file_mb": shard_bytes / 2**20,
            "generate_seconds": gen_s,
            "results": results,
        }
        if "naive" in results and "stream" in results:
            report["outputs_identical"] = _same_output(work / "out-naive", work / "out-stream")
        if args.json:
            print(json.dumps(report))
            return report
        print(
            f"{args.ranks} rank files, {report['tensor_mb']:.1f} MiB of LoRA tensors "
            f"({report['shard_file_mb']:.1f} MiB on disk), torch {torch.__version__}"
        )
        print(f"{'mode':<8} {'time s':>8} {'MiB/s':>8} {'peak RSS MiB':>13} {'work peak MiB':>14}")
        for mode, r in results.items():
            rate = report["shard_file_mb"] / r["seconds"] if mode != "import" else float("nan")
            print(
                f"{mode:<8} {r['seconds']:>8.3f} {rate:>8.0f} {r['peak_rss_mb']:>13.0f} "
                f"{r['over_baseline_mb']:>14.1f}"
            )
        if "outputs_identical" in report:
            print(f"naive and stream outputs identical: {report['outputs_identical']}")
        return report
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
    else:
        main()
