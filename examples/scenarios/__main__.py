"""``python -m examples.scenarios [NAME ...]``: run scenarios (all seven by default)."""

import sys

from examples.scenarios.runner import main

sys.exit(main())
