"""``python -m durable.workers [--burst] [--queue Q]``: the same as ``durable worker``."""

import sys

from durable.cli import main

if __name__ == "__main__":
    sys.exit(main(["worker", *sys.argv[1:]]))
