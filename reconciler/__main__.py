"""``python -m durable.reconciler [--once] [--interval S]``: the same as ``durable reconciler``."""

import sys

from durable.cli import main

if __name__ == "__main__":
    sys.exit(main(["reconciler", *sys.argv[1:]]))
