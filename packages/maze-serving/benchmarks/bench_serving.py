"""maze-serve with dynamic batching off and on, side by side: req/s and p50/p95 latency.

Starts the same server twice (``python -m maze_server``, separate processes, one torch thread
each) on 127.0.0.1, once with ``--no-batching`` and once with its default batching, and drives
``/v1/chat/completions`` with httpx at concurrency 1 and 8. The two servers are measured side by
side, so drift on a shared machine hits both alike: at concurrency 1 the requests alternate
between them; at 8 whole runs alternate, in the other order every round. Each request is the first
turn of a maze episode (system prompt + token-aligned maze image + task text) with a fixed
number of generated tokens. The baseline row is the same generation called in-process through
``maze_policy.policy.Policy`` (no HTTP, no queue), so the table also shows what the server adds.

    uv run python packages/maze-serving/benchmarks/bench_serving.py [--requests 40] [--tokens 16]
        [--rounds 3] [--temperature 0]

``--temperature`` above 0 samples, with a different seed per request.
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
    """Send ``n`` requests, ``concurrency`` at a time, after ``concurrency`` warm-up ones.

    Returns:
        The wall time of the ``n`` requests and each one's latency.
    """
    lat: list[float] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=300) as client:

        async def one(i: int) -> None:
            """Send request ``i`` under the semaphore and record its latency."""
            async with sem:
                t0 = time.perf_counter()
                r = await client.post(f"{url}/v1/chat/completions", json={**body, "seed": i})
                r.raise_for_status()
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(i) for i in range(concurrency)))  # warm-up
        lat.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, lat


async def drive_alternating(urls: list[str], body: dict[str, Any], n: int) -> list[list[float]]:
    """Concurrency 1 on every server at once: request ``i`` goes to each in turn.

    Returns:
        Each server's latencies (one request at a time, so req/s is ``n / sum``).
    """
    lats: list[list[float]] = [[] for _ in urls]
    async with httpx.AsyncClient(timeout=300) as client:
        for i in range(-1, n):  # request -1 warms each connection up
            order = list(enumerate(urls)) if i % 2 == 0 else list(enumerate(urls))[::-1]
            for k, url in order:
                t0 = time.perf_counter()
                r = await client.post(f"{url}/v1/chat/completions", json={**body, "seed": i + 1})
                r.raise_for_status()
                if i >= 0:
                    lats[k].append(time.perf_counter() - t0)
    return lats


def start_server(model_dir: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``maze-serve`` on a free port with one torch thread; returns it and its URL."""
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
            *flags,
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    """Poll ``/ping`` until it answers 200 (model loaded)."""
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/ping", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("server did not start")
        time.sleep(0.2)


def batch_totals(url: str) -> tuple[float, float]:
    """Requests and generate calls so far, from the server's ``maze_serving_batch_size``."""
    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        for key in ("maze_serving_batch_size_sum", "maze_serving_batch_size_count"):
            if line.startswith(key + " "):
                values[key] = float(line.split()[1])
    return values["maze_serving_batch_size_sum"], values["maze_serving_batch_size_count"]


Row = tuple[str, int, float, float, float]


def main() -> None:
    """Build the tiny model, start both servers, and print the side-by-side table."""
    p = argparse.ArgumentParser(description="Benchmark maze-serve batching off vs on.")
    p.add_argument("--requests", type=int, default=40, help="requests per measurement")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3, help="alternating off/on rounds")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    args = p.parse_args()
    modes = {"batching off": ("--no-batching",), "batching on": ()}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_vlm(Path(tmp) / "tiny", seed=0)
        messages = maze_messages()
        servers = {name: start_server(model_dir, *flags) for name, flags in modes.items()}
        try:
            for proc, url in servers.values():
                wait_ready(proc, url)
            body = {
                "model": "tiny",
                "messages": messages,
                "max_tokens": args.tokens,
                "temperature": args.temperature,
                "ignore_eos": True,
            }
            walls: dict[tuple[str, int], float] = {}
            lats: dict[tuple[str, int], list[float]] = {}
            batched: dict[str, float] = {}  # requests and generate calls at c=8
            calls: dict[str, float] = {}
            names = list(servers)
            for r in range(args.rounds):
                # c=1: requests alternate between the servers, so drift hits both alike.
                ones = asyncio.run(
                    drive_alternating([servers[k][1] for k in names], body, args.requests)
                )
                for name, lat in zip(names, ones, strict=True):
                    walls[name, 1] = walls.get((name, 1), 0.0) + sum(lat)
                    lats.setdefault((name, 1), []).extend(lat)
                # c=8: whole runs alternate, in the other order every round.
                for name in names if r % 2 == 0 else names[::-1]:
                    before = batch_totals(servers[name][1])
                    wall, lat = asyncio.run(drive(servers[name][1], body, args.requests, 8))
                    after = batch_totals(servers[name][1])
                    walls[name, 8] = walls.get((name, 8), 0.0) + wall
                    lats.setdefault((name, 8), []).extend(lat)
                    batched[name] = batched.get(name, 0.0) + after[0] - before[0]
                    calls[name] = calls.get(name, 0.0) + after[1] - before[1]
            base = baseline(model_dir, messages, args.requests, args.tokens)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
            for proc, _ in servers.values():
                proc.wait(30)
    rows: list[Row] = [
        (
            "in-process Policy.generate (no HTTP)",
            1,
            len(base) / sum(base),
            pct(base, 0.5),
            pct(base, 0.95),
        )
    ]
    for (name, c), lat in sorted(lats.items()):
        rows.append(
            (f"maze-serve, {name}", c, len(lat) / walls[name, c], pct(lat, 0.5), pct(lat, 0.95))
        )
    mode = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, seeded"
    print(
        f"tiny Qwen3-VL, maze first turn, {args.tokens} tokens out ({mode}), "
        f"{args.rounds} x {args.requests} requests per row, {os.cpu_count()} CPUs"
    )
    print(f"{'path':40} {'conc':>4} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8}")
    for name, c, rps, p50, p95 in rows:
        print(f"{name:40} {c:>4} {rps:>7.1f} {p50 * 1e3:>8.1f} {p95 * 1e3:>8.1f}")
    by = {(name, c): (rps, p50) for name, c, rps, p50, _ in rows}
    on8, off8 = by["maze-serve, batching on", 8], by["maze-serve, batching off", 8]
    on1, off1 = by["maze-serve, batching on", 1], by["maze-serve, batching off", 1]
    print(
        f"batching on/off: throughput at c=8 x{on8[0] / off8[0]:.2f}; p50 at c=1 x{on1[1] / off1[1]:.2f}; "
        f"requests per generate call at c=8: on {batched['batching on'] / calls['batching on']:.2f}, "
        f"off {batched['batching off'] / calls['batching off']:.2f}"
    )


if __name__ == "__main__":
    main()
