"""``python -m durable.a2a`` is ``durable a2a``."""

import sys

from durable.cli import main

sys.exit(main(["a2a", *sys.argv[1:]]))
