"""Consolidation and resharding, every input format side by side with a plain copy, in one run.

    uv run python packages/lora-consolidate/benchmarks/bench_consolidate.py [--ranks 4] [--layers 36]

Generates the LoRA tensors of Qwen3-VL-8B at rank 32 (36 layers, q/k/v/o/gate/up/down; 87.3M
parameters, 166.5 MiB in bf16), sharded on dim 0 over ``--ranks`` ranks, twice from the same
DTensors: as SkyRL's ``torch.save`` rank files (``model_world_size_W_rank_R.pt``) and in the
project's shard format (``lora_consolidate.shards.write_rank_shards``), the latter with AdamW
state too (exp_avg, exp_avg_sq in bf16 like the weights, step). The files hold real DTensors but
are written directly, not by running FSDP on an 8B model.

Modes (each reads files from a warm page cache, writes a fresh output, durable as in use):

    copy-pt             shutil.copy of the .pt rank files (the I/O ceiling for the .pt modes)
    naive               load every .pt file, torch.cat each key, safetensors save_file
    stream-pt-torch     consolidate the .pt files, metadata read by torch.load
    stream-pt           consolidate the .pt files, metadata read by the C unpickler
    copy-shards         shutil.copy of the shard-format model files
    copy-shards-fsync   the same, then fsync each copy (consolidation's output is durable)
    sha256-shards       read and sha256 the shard-format model files (consolidation hashes its
                        output in the same pass: this is the floor for any hashed output)
    shards              consolidate the shard-format checkpoint
    copy-shards-optim   shutil.copy of the shard-format model and optimizer files
    reshard-shards      reshard the shard format 4 -> 3 ranks, model and optimizer state
    reshard-pt          reshard the .pt files 4 -> 3 ranks (model only, .pt output)

Time: one child process runs ``--repeat`` rounds of all modes interleaved (so load from other
jobs hits every mode alike); best and median are reported. "vs copy" divides a mode's throughput
(its input bytes over its best time) by that of the copy of the same input files. Memory: each
mode then runs once more in a fresh child that resets its RSS high-water mark after its imports
(Linux ``/proc/self/clear_refs``, after ``malloc_trim`` so that heap the imports freed cannot hide
new allocations); "work peak" is VmHWM at the end minus VmRSS at the reset, the memory the work
itself added; "base RSS" is the RSS at the reset (interpreter and imports). Outputs are checked
byte for byte.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib
import json
import shutil
import statistics
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
MODES = (
    "copy-pt",
    "naive",
    "stream-pt-torch",
    "stream-pt",
    "copy-shards",
    "copy-shards-fsync",
    "sha256-shards",
    "shards",
    "copy-shards-optim",
    "reshard-shards",
    "reshard-pt",
)
# The copy of the same input files that each mode is compared with.
_PEER = {
    "naive": "copy-pt",
    "stream-pt-torch": "copy-pt",
    "stream-pt": "copy-pt",
    "reshard-pt": "copy-pt",
    "copy-shards-fsync": "copy-shards",
    "sha256-shards": "copy-shards",
    "shards": "copy-shards",
    "reshard-shards": "copy-shards-optim",
}


def _global_shapes(layers: int, rank: int) -> list[tuple[str, tuple[int, int]]]:
    shapes: list[tuple[str, tuple[int, int]]] = []
    for layer in range(layers):
        for module, out_f, in_f in _MODULES:
            prefix = f"base_model.model.model.language_model.layers.{layer}.{module}"
            shapes.append((f"{prefix}.lora_A.default.weight", (rank, in_f)))
            shapes.append((f"{prefix}.lora_B.default.weight", (out_f, rank)))
    return shapes


def generate(work: Path, ranks: int, layers: int, lora_rank: int) -> dict[str, Any]:
    """Write ``work/pt`` (.pt rank files) and ``work/shards`` (shard format with AdamW state)."""
    from torch.distributed.tensor import Shard

    from lora_consolidate.reshard import make_dtensor, make_mesh
    from lora_consolidate.shards import finalize_rank_shards, write_rank_shards
    from lora_consolidate.sources import rank_file_name, shard_box

    pt, shards = work / "pt", work / "shards"
    pt.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    meshes = [make_mesh("cpu", ranks, r) for r in range(ranks)]
    states: list[dict[str, Any]] = [{} for _ in range(ranks)]
    optims: list[dict[str, Any]] = [{} for _ in range(ranks)]
    total = largest = 0
    for name, shape in _global_shapes(layers, lora_rank):
        full = torch.randn(shape, generator=gen).to(torch.bfloat16)
        moments = [torch.randn(shape, generator=gen).to(torch.bfloat16) for _ in range(2)]
        nbytes = full.numel() * full.element_size()
        total += nbytes
        largest = max(largest, nbytes)
        for r in range(ranks):
            (offsets, sizes), _ = shard_box(shape, (ranks,), (r,), (Shard(0),), where=pt, key=name)
            rows = slice(offsets[0], offsets[0] + sizes[0])
            states[r][name] = make_dtensor(full[rows].clone(), meshes[r], Shard(0), shape)
            optims[r][name] = {
                "step": torch.tensor(100.0),
                "exp_avg": make_dtensor(moments[0][rows].clone(), meshes[r], Shard(0), shape),
                "exp_avg_sq": make_dtensor(moments[1][rows].clone(), meshes[r], Shard(0), shape),
            }
    group = dict(torch.optim.AdamW([torch.zeros(1)], lr=1e-4).param_groups[0])
    group["params"] = [name for name, _ in _global_shapes(layers, lora_rank)]
    for r in range(ranks):
        torch.save(states[r], pt / rank_file_name(ranks, r))
        optimizer = {"state": optims[r], "param_groups": [group]}
        write_rank_shards(states[r], shards, r, ranks, optimizer=optimizer, tag="bench")
    finalize_rank_shards(shards, ranks)
    return {"tensor_bytes": total, "largest_tensor_bytes": largest}


def _inputs(mode: str, work: Path) -> list[Path]:
    if mode in ("copy-pt", "naive", "stream-pt-torch", "stream-pt", "reshard-pt"):
        return sorted((work / "pt").iterdir())
    files = sorted((work / "shards").iterdir())
    if mode in ("copy-shards", "copy-shards-fsync", "sha256-shards", "shards"):
        return [f for f in files if f.name.startswith("model_")]
    return files


def _work(mode: str, work: Path, dst: Path, ranks: int) -> None:
    from safetensors.torch import save_file  # pyright: ignore[reportUnknownVariableType]
    from torch.distributed.tensor import DTensor, Shard

    from lora_consolidate import consolidate, reshard
    from lora_consolidate.keys import peft_key
    from weight_sync import fs

    if mode.startswith("copy-"):
        dst.mkdir()
        for file in _inputs(mode, work):
            shutil.copy(file, dst / file.name)
            if mode.endswith("-fsync"):
                fs.fsync_file(dst / file.name)
    elif mode == "sha256-shards":
        dst.mkdir()
        for file in _inputs(mode, work):
            fs.hash_file(file)
    elif mode == "naive":
        files = _inputs(mode, work)
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
    elif mode == "stream-pt-torch":
        consolidate(work / "pt", dst, lora_alpha=64, loader="torch")
    elif mode == "stream-pt":
        consolidate(work / "pt", dst, lora_alpha=64)
    elif mode == "shards":
        consolidate(work / "shards", dst, lora_alpha=64)
    elif mode == "reshard-shards":
        reshard(work / "shards", dst, ranks - 1)
    elif mode == "reshard-pt":
        reshard(work / "pt", dst, ranks - 1)
    else:
        raise SystemExit(f"unknown mode {mode}")


def _reset_peak() -> int:
    """Return freed heap to the OS, reset the RSS high-water mark; the RSS (KiB) after that."""
    # Without the trim, work would reuse pages the imports freed and its peak would not show.
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:  # Linux: "5" resets VmHWM to VmRSS
        f.write("5")
    return _rss_kib("VmRSS")


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _child(kind: str, modes: str, work: Path, ranks: int, repeat: int) -> None:
    # Import everything the modes use before the first measurement.
    for module in ("lora_consolidate", "lora_consolidate.shards", "safetensors.torch"):
        importlib.import_module(module)
    out = work / "out"
    out.mkdir(exist_ok=True)
    if kind == "memory":
        (mode,) = modes.split(",")
        dst = out / f"memory-{mode}"
        baseline = _reset_peak()
        started = time.perf_counter()
        _work(mode, work, dst, ranks)
        seconds = time.perf_counter() - started
        print(
            json.dumps({"seconds": seconds, "baseline_kib": baseline, "hwm_kib": _rss_kib("VmHWM")})
        )
        return
    times: dict[str, list[float]] = {m: [] for m in modes.split(",")}
    memory: dict[str, float] = {}
    baseline = 0
    for round_ in range(repeat):
        for mode, seconds in times.items():
            dst = out / f"{mode}-{round_}"
            if round_ == 0 and kind == "timing+memory":
                baseline = _reset_peak()
            started = time.perf_counter()
            _work(mode, work, dst, ranks)
            seconds.append(time.perf_counter() - started)
            if round_ == 0 and kind == "timing+memory":
                memory[mode] = (_rss_kib("VmHWM") - baseline) / 1024
            if round_ < repeat - 1:  # keep the last round's outputs for the checks
                shutil.rmtree(dst)
    print(json.dumps({"times": times, "memory": memory}))


def _run_child(kind: str, modes: str, work: Path, ranks: int, repeat: int) -> Any:
    proc = subprocess.run(
        [sys.executable, __file__, "_child", kind, modes, str(work), str(ranks), str(repeat)],
        stdout=subprocess.PIPE,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{kind} child for {modes} failed")
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checks(work: Path, modes: list[str], repeat: int, ranks: int) -> dict[str, bool]:
    """Every consolidated adapter is the same bytes; resharded checkpoints hold the same data."""
    from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

    from lora_consolidate import consolidate
    from lora_consolidate.shards import ShardsCheckpoint

    last = repeat - 1
    out = work / "out"
    adapters: dict[str, Path] = {}
    for mode in ("stream-pt-torch", "stream-pt", "shards"):
        if mode in modes:
            adapters[mode] = out / f"{mode}-{last}" / "adapter_model.safetensors"
    for mode in ("reshard-shards", "reshard-pt"):
        if mode in modes:
            consolidate(out / f"{mode}-{last}", out / f"{mode}-adapter", lora_alpha=64)
            adapters[mode] = out / f"{mode}-adapter" / "adapter_model.safetensors"
    checks: dict[str, bool] = {}
    if adapters:
        checks["adapters_byte_identical"] = len({_sha(p) for p in adapters.values()}) == 1
    if "naive" in modes and adapters:
        x = load_file(out / f"naive-{last}" / "adapter_model.safetensors")
        y = load_file(next(iter(adapters.values())))
        checks["naive_tensors_equal"] = x.keys() == y.keys() and all(
            torch.equal(x[k], y[k]) for k in x
        )
    if "reshard-shards" in modes:
        with (
            ShardsCheckpoint(work / "shards", ranks, kind="optim") as a,
            ShardsCheckpoint(out / f"reshard-shards-{last}", ranks - 1, kind="optim") as b,
        ):
            checks["resharded_optimizer_equal"] = a.specs() == b.specs() and all(
                torch.equal(a.read(s.name), b.read(s.name)) for s in a.specs()
            )
    return checks


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Generate the checkpoint, time and measure every mode, print and return the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--repeat", type=int, default=3, help="timed rounds of all modes")
    p.add_argument("--no-memory", action="store_true", help="skip the per-mode memory children")
    p.add_argument(
        "--one-process",
        action="store_true",
        help="measure memory in the timing child, first round (cheaper; list small-memory modes "
        "first: memory an earlier mode freed can be reused without raising RSS)",
    )
    p.add_argument("--workdir", type=Path, help="default: a temporary directory")
    p.add_argument("--json", action="store_true", help="print results as JSON only")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="lora-bench-"))
    try:
        t0 = time.perf_counter()
        info = generate(work, args.ranks, args.layers, args.lora_rank)
        gen_s = time.perf_counter() - t0
        kind = "timing+memory" if args.one_process else "timing"
        timed = _run_child(kind, ",".join(modes), work, args.ranks, args.repeat)
        times: dict[str, list[float]] = timed["times"]
        results: dict[str, dict[str, float]] = {}
        for mode in modes:
            size = sum(f.stat().st_size for f in _inputs(mode, work)) / 2**20
            best = min(times[mode])
            results[mode] = {
                "input_mb": size,
                "best_s": best,
                "median_s": statistics.median(times[mode]),
                "mb_per_s": size / best,
            }
            if args.one_process:
                results[mode]["over_baseline_mb"] = timed["memory"][mode]
            elif not args.no_memory:
                mem = _run_child("memory", mode, work, args.ranks, 1)
                results[mode]["over_baseline_mb"] = (mem["hwm_kib"] - mem["baseline_kib"]) / 1024
                results[mode]["base_rss_mb"] = mem["baseline_kib"] / 1024
        for mode, peer in _PEER.items():
            if mode in results and peer in results:
                results[mode]["vs_copy"] = results[mode]["mb_per_s"] / results[peer]["mb_per_s"]
        report: dict[str, Any] = {
            "ranks": args.ranks,
            "tensor_mb": info["tensor_bytes"] / 2**20,
            "largest_tensor_mb": info["largest_tensor_bytes"] / 2**20,
            "generate_seconds": gen_s,
            "repeat": args.repeat,
            "results": results,
            "checks": _checks(work, modes, args.repeat, args.ranks),
        }
        if args.json:
            print(json.dumps(report))
            return report
        _print(report, args)
        return report
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def _print(report: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"{args.ranks} ranks, {args.layers} layers, LoRA rank {args.lora_rank}: "
        f"{report['tensor_mb']:.1f} MiB of LoRA tensors (largest {report['largest_tensor_mb']:.2f} "
        f"MiB), torch {torch.__version__}, best of {args.repeat}"
    )
    head = (
        f"{'mode':<18} {'input MiB':>9} {'best s':>7} {'median s':>8} {'MiB/s':>6} {'vs copy':>7}"
    )
    print(head + f" {'work peak MiB':>13} {'base RSS MiB':>12}")
    for mode, r in report["results"].items():
        ratio = f"{r['vs_copy']:.2f}" if "vs_copy" in r else "-"
        peak = f"{r['over_baseline_mb']:.1f}" if "over_baseline_mb" in r else "-"
        rss = f"{r['base_rss_mb']:.0f}" if "base_rss_mb" in r else "-"
        print(
            f"{mode:<18} {r['input_mb']:>9.1f} {r['best_s']:>7.3f} {r['median_s']:>8.3f} "
            f"{r['mb_per_s']:>6.0f} {ratio:>7} {peak:>13} {rss:>12}"
        )
    for name, ok in report["checks"].items():
        print(f"{name}: {ok}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        _child(sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    else:
        main()
