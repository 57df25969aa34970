"""``python -m durable.scenarios [NAME ...]``: run scenarios (all six by default)."""

import sys

from durable.scenarios.runner import main

sys.exit(main())
