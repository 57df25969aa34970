"""``python -m examples.world``: the world in the foreground (``python -m examples world``
is the same, with the defaults of the settings)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from examples.world.server import serve


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.world", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    p.add_argument("--data-dir", type=Path, default=Path(".durable/world"))
    p.add_argument("--no-dedupe", action="store_true",
                   help="never deduplicate by key (API) and no unique key column (database)")
    p.add_argument("--reset", action="store_true", help="delete the world's data first")
    p.add_argument("--ready-file", type=Path, default=None,
                   help="write the world's info (JSON) here once it listens")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.add_argument("--quiet", action="store_true", help="print nothing on start")
    args = p.parse_args(argv)
    return serve(args.host, args.port, args.data_dir, dedupe=not args.no_dedupe,
                 ready_file=args.ready_file, reset=args.reset, verbose=args.verbose,
                 announce=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
