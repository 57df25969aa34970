"""``python -m durable.mcp_server`` is ``durable mcp``."""

import sys

from durable.cli import main

sys.exit(main(["mcp", *sys.argv[1:]]))
