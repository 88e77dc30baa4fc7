"""``weight-sync`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from weight_sync.errors import WeightSyncError
from weight_sync.notify import notify_vllm
from weight_sync.s3 import S3Mirror
from weight_sync.store import AdapterStore, PublishedVersion
from weight_sync.subscriber import Subscriber


def _describe(pv: PublishedVersion) -> dict[str, Any]:
    return {
        "version": pv.version,
        "step": pv.step,
        "path": str(pv.path),
        "created_at": pv.manifest.created_at,
        "producer": pv.manifest.producer,
        "total_size": pv.manifest.total_size,
        "hash_algorithm": pv.manifest.hash_algorithm,
        "files": {
            n: {"size": e.size, pv.manifest.hash_algorithm: e.digest}
            for n, e in pv.manifest.files.items()
        },
    }


def _emit(pv: PublishedVersion, as_json: bool, verb: str) -> None:
    if as_json:
        print(json.dumps(_describe(pv)), flush=True)
    else:
        print(
            f"{verb} version {pv.version} (step {pv.step}, {pv.manifest.total_size} bytes) "
            f"at {pv.path}",
            flush=True,
        )


def _s3_mirror(args: argparse.Namespace) -> S3Mirror:
    client: Any = None
    if args.endpoint_url:
        import boto3  # optional extra: only needed for S3

        client = cast(Any, boto3.client("s3", endpoint_url=args.endpoint_url))
    return S3Mirror(args.bucket, args.prefix, client)


def _cmd_publish(args: argparse.Namespace) -> int:
    store = AdapterStore(args.root, durable=not args.no_fsync, hash_algorithm=args.hash)
    pv = store.publish(
        args.src,
        version=args.version,
        step=args.step,
        producer=args.producer,
        keep=args.keep,
        lock_timeout=args.lock_timeout,
    )
    _emit(pv, args.json, "published")
    return 0


def _cmd_latest(args: argparse.Namespace) -> int:
    pv = AdapterStore(args.root).latest(verify=not args.no_verify)
    if pv is None:
        raise WeightSyncError(f"{args.root}: nothing published yet")
    _emit(pv, args.json, "latest")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    store = AdapterStore(args.root)
    targets = store.versions() if args.all else [args.version]
    if args.all and not targets:
        raise WeightSyncError(f"{args.root}: nothing published yet")
    for v in targets:
        pv = store.verify(v, use_cache=False)
        print(f"ok version {pv.version}: {len(pv.manifest.files)} files verified", flush=True)
    return 0


def _cmd_watch(args: argparse.Namespace) -> int:
    if (args.vllm_url is None) != (args.lora_name is None):
        raise WeightSyncError("--vllm-url and --lora-name go together")
    store = AdapterStore(args.root)
    sub = Subscriber(
        store,
        poll_interval=args.poll_interval,
        use_inotify=not args.no_inotify,
        reader=args.reader,
    )
    with sub:
        for pv in sub.iter_versions(args.after, idle_timeout=args.idle_timeout):
            _emit(pv, args.json, "new")
            if args.vllm_url is not None:
                name = str(args.lora_name).format(version=pv.version, step=pv.step)
                notify_vllm(
                    args.vllm_url,
                    name,
                    pv.path,
                    timeout=args.http_timeout,
                    load_inplace=args.load_inplace,
                )
                print(f"loaded {name!r} into {args.vllm_url}", flush=True)
            args.count -= 1
            if args.count == 0:
                break
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    report = AdapterStore(args.root).gc(args.keep, lock_timeout=args.lock_timeout)
    print(
        f"kept {report.kept}, removed {report.removed}, pinned {report.pinned}, "
        f"leftovers {len(report.leftovers_removed)}, "
        f"expired leases {report.expired_leases_removed}",
        flush=True,
    )
    return 0


def _cmd_s3_push(args: argparse.Namespace) -> int:
    store = AdapterStore(args.root)
    pv = store.verify(args.version, use_cache=False)
    keys = _s3_mirror(args).upload(pv)
    print(f"uploaded version {pv.version} ({len(keys)} objects)", flush=True)
    return 0


def _cmd_s3_pull(args: argparse.Namespace) -> int:
    pv = _s3_mirror(args).download(args.cache, args.version)
    _emit(pv, args.json, "downloaded")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``weight-sync`` parser; each subcommand sets ``func``, the handler :func:`main` calls."""
    p = argparse.ArgumentParser(
        prog="weight-sync", description="Atomic, verified LoRA adapter publish/subscribe."
    )
    sub = p.add_subparsers(dest="command", required=True)

    def with_root(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--root", required=True, type=Path, help="store root (shared FS)")

    sp = sub.add_parser("publish", help="publish an adapter directory as a new version")
    sp.add_argument("src", type=Path, help="adapter directory to publish")
    with_root(sp)
    sp.add_argument("--version", type=int, help="default: latest + 1")
    sp.add_argument("--step", type=int, help="training step (default: the version)")
    sp.add_argument("--producer", help="default: host:pid")
    sp.add_argument("--keep", type=int, help="then keep only the newest K versions")
    sp.add_argument(
        "--lock-timeout",
        type=float,
        default=0.0,
        help="seconds to wait for another publisher's lock (default 0: fail at once)",
    )
    sp.add_argument("--no-fsync", action="store_true", help="skip fsync (not power-safe)")
    sp.add_argument(
        "--hash",
        choices=["auto", "xxh3-128", "sha256"],
        default="auto",
        help="checksum the manifest records (auto: xxh3-128 where xxhash is installed; "
        "sha256 for readers older than hash_algorithm manifests)",
    )
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(func=_cmd_publish)

    sp = sub.add_parser("latest", help="show the newest published version")
    with_root(sp)
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.add_argument(
        "--no-verify", action="store_true", help="trust the manifest; do not re-hash the files"
    )
    sp.set_defaults(func=_cmd_latest)

    sp = sub.add_parser("verify", help="re-hash a version (default latest) or --all")
    with_root(sp)
    sp.add_argument("version", type=int, nargs="?", help="version to verify (default latest)")
    sp.add_argument("--all", action="store_true", help="verify every published version")
    sp.set_defaults(func=_cmd_verify)

    sp = sub.add_parser("watch", help="print (and optionally load into vLLM) new versions")
    with_root(sp)
    sp.add_argument("--after", type=int, help="only versions newer than this")
    sp.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        help="seconds between looks when polling (default 0.5)",
    )
    sp.add_argument(
        "--no-inotify", action="store_true", help="poll even where inotify is available"
    )
    sp.add_argument("--reader", help="pin the current version under this reader id")
    sp.add_argument("--vllm-url", help="e.g. http://127.0.0.1:8000")
    sp.add_argument("--lora-name", help="adapter name; may contain {version} and {step}")
    sp.add_argument(
        "--load-inplace",
        action="store_true",
        help="ask vLLM to replace an adapter of the same name in place",
    )
    sp.add_argument(
        "--http-timeout",
        type=float,
        default=30.0,
        help="seconds per vLLM request (default 30)",
    )
    sp.add_argument("--count", type=int, default=-1, help="stop after N versions")
    sp.add_argument("--idle-timeout", type=float, help="stop after T seconds without news")
    sp.add_argument("--json", action="store_true", help="print JSON instead of text")
    sp.set_defaults(func=_cmd_watch)

    sp = sub.add_parser("gc", help="keep the newest K versions (and pinned ones)")
    with_root(sp)
    sp.add_argument("--keep", type=int, required=True, help="how many newest versions to keep")
    sp.add_argument(
        "--lock-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for a publisher's lock (default 30)",
    )
    sp.set_defaults(func=_cmd_gc)

    for name, helptext in (
        ("s3-push", "upload a version to S3"),
        ("s3-pull", "download a version from S3 into a verified local cache"),
    ):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--bucket", required=True, help="S3 bucket")
        sp.add_argument("--prefix", default="", help="key prefix inside the bucket")
        sp.add_argument("--endpoint-url", help="S3 endpoint (default: AWS's)")
        sp.add_argument("version", type=int, nargs="?", help="version (default latest)")
        if name == "s3-push":
            with_root(sp)
            sp.set_defaults(func=_cmd_s3_push)
        else:
            sp.add_argument(
                "--cache", required=True, type=Path, help="local directory for verified copies"
            )
            sp.add_argument("--json", action="store_true", help="print JSON instead of text")
            sp.set_defaults(func=_cmd_s3_pull)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``weight-sync``.

    Returns:
        The subcommand's exit code; 1 after a :class:`WeightSyncError`, 2 after a ``ValueError``,
        130 when interrupted.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except WeightSyncError as exc:
        print(f"weight-sync: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"weight-sync: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
