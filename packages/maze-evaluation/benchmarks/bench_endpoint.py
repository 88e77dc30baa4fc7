"""Endpoint client throughput against the scripted loopback server.

Concurrency 1 (baseline, one request at a time) side by side with higher concurrency, on the
same episodes.

    uv run python packages/maze-evaluation/benchmarks/bench_endpoint.py [--limit 16] [--delay-ms 20]

``--delay-ms`` makes the server wait per request, standing in for model latency: with a real
model the client overlaps that wait across episodes, which is what the semaphore is for.
"""

from __future__ import annotations

import argparse
import time

from maze_evaluation import EndpointBackend, evaluate
from maze_evaluation.testing import ScriptedServer


def main() -> None:
    """Play the same episodes at each ``--concurrency`` and print episodes/s and speedup."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--eval-set", default="easy-64")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = ap.parse_args()
    with ScriptedServer(delay_s=args.delay_ms / 1000) as srv:
        # Warm-up: pays the one-off skyrl-gym and torch imports so they are not billed to the baseline.
        evaluate(
            EndpointBackend(srv.url, "stopper"), eval_set=args.eval_set, limit=1, progress=False
        )
        print(
            f"{args.eval_set}, first {args.limit} mazes, oracle policy, server delay {args.delay_ms:g} ms/request"
        )
        print(f"{'concurrency':>11} {'episodes/s':>11} {'requests/s':>11} {'speedup':>8}")
        base = None
        for c in args.concurrency:
            backend = EndpointBackend(srv.url, "oracle", concurrency=c)
            t0 = time.perf_counter()
            recs = evaluate(backend, eval_set=args.eval_set, limit=args.limit, progress=False)
            dt = time.perf_counter() - t0
            assert all(r.solved for r in recs)
            base = base or dt
            print(
                f"{c:>11} {len(recs) / dt:>11.2f} {backend.requests / dt:>11.1f} {base / dt:>7.2f}x"
            )


if __name__ == "__main__":
    main()
