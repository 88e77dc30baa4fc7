"""Requests/s and p50/p95 latency of maze-serve on the tiny model, concurrency 1 and 8.

Starts the real server (``python -m maze_server``, a separate process) on 127.0.0.1 and drives
``/v1/chat/completions`` with httpx; each request is the first turn of a maze episode (system
prompt + token-aligned maze image + task text) with a fixed number of generated tokens. The
baseline is the same generation called in-process through ``maze_policy.policy.Policy`` (no HTTP,
no queue), so the table shows what the server adds.

    uv run python packages/maze-serving/benchmarks/bench_serving.py [--requests 40] [--tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from maze_policy.model import build_tiny_vlm, load_vlm
from maze_policy.policy import Policy
from maze_policy.sampling import SamplingParams
from maze_serving.server import free_port


def maze_messages() -> list[dict[str, Any]]:
    """The first-turn messages of one easy maze episode, with a token-aligned image."""
    from maze_env.maze import generate
    from maze_env.prompts import initial_messages
    from maze_env.render import token_aligned_style

    return [
        dict(m) for m in initial_messages(generate("easy", seed=3), 12, style=token_aligned_style())
    ]


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def baseline(model_dir: Path, messages: list[dict[str, Any]], n: int, tokens: int) -> list[float]:
    """Latencies of ``n`` in-process generations of ``tokens`` tokens, after two warm-up calls."""
    torch.set_num_threads(1)
    model, processor = load_vlm(model_dir)
    policy = Policy(model, processor)
    params = SamplingParams(max_new_tokens=tokens, greedy=True)
    lat: list[float] = []
    for i in range(n + 2):
        t0 = time.perf_counter()
        traj = policy.encoder.start(messages)
        policy.generate([traj], params, seed=i)
        if i >= 2:  # warm-up
            lat.append(time.perf_counter() - t0)
    return lat


async def drive(
    url: str, body: dict[str, Any], n: int, concurrency: int
) -> tuple[float, list[float]]:
    """Send ``n`` requests, ``concurrency`` at a time, after two warm-up ones.

    Returns:
        The wall time of the ``n`` requests and each one's latency.
    """
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120) as client:

        async def one() -> None:
            """Send one request under the semaphore and record its latency."""
            async with sem:
                t0 = time.perf_counter()
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                r.raise_for_status()
                lat.append(time.perf_counter() - t0)

        for _ in range(2):  # warm-up
            await one()
        lat.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t0, lat


def main() -> None:
    """Build the tiny model, start the server, and print the baseline and server tables."""
    p = argparse.ArgumentParser(description="Benchmark maze-serve on the tiny model.")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--tokens", type=int, default=16)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_vlm(Path(tmp) / "tiny", seed=0)
        messages = maze_messages()
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "maze_server",
                "--model",
                str(model_dir),
                "--threads",
                "1",
                "--port",
                str(port),
                "--max-pending",
                "64",
                "--log-level",
                "warning",
            ],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("server did not start")
                time.sleep(0.2)
            body = {
                "model": "tiny",
                "messages": messages,
                "max_tokens": args.tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            rows: list[tuple[str, int, float, float, float]] = []
            base = baseline(model_dir, messages, args.requests, args.tokens)
            rows.append(
                (
                    "in-process Policy.generate (baseline)",
                    1,
                    len(base) / sum(base),
                    pct(base, 0.5),
                    pct(base, 0.95),
                )
            )
            for c in (1, 8):
                wall, lat = asyncio.run(drive(url, body, args.requests, c))
                rows.append(("maze-serve HTTP", c, len(lat) / wall, pct(lat, 0.5), pct(lat, 0.95)))
        finally:
            proc.terminate()
            proc.wait(30)
    print(
        f"tiny Qwen3-VL, maze first turn ({args.tokens} tokens out), {args.requests} requests, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'path':40} {'conc':>4} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8}")
    for name, c, rps, p50, p95 in rows:
        print(f"{name:40} {c:>4} {rps:>7.1f} {p50 * 1e3:>8.1f} {p95 * 1e3:>8.1f}")


if __name__ == "__main__":
    main()
