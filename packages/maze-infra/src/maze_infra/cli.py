"""maze-infra: create HyperPod clusters, deploy SageMaker endpoints, build and push dashboards.

Exit codes: 0 done; 1 the service refused or failed the operation (anything half-created is
rolled back); 2 a malformed spec or usage error; 3 an optional extra is missing; 4 the service
cannot be reached; 5 missing or refused credentials.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from maze_infra.errors import InfraError

PROG = "maze-infra"
Command = Callable[[argparse.Namespace], int]


def _parser() -> argparse.ArgumentParser:
    from maze_infra import dashboards, endpoint, hyperpod

    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    groups = p.add_subparsers(dest="group", required=True, metavar="{cluster,endpoint,dashboards}")
    hyperpod.register(groups)
    endpoint.register(groups)
    dashboards.register(groups)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``maze-infra`` command; returns its exit code."""
    args = _parser().parse_args(argv)
    command: Command = args.command
    try:
        return command(args)
    except InfraError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
