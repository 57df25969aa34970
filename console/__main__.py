"""``python -m durable.console`` is ``durable console``."""

import sys

from durable.cli import main

sys.exit(main(["console", *sys.argv[1:]]))
