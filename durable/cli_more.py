"""More ``durable`` subcommands: recovery, audit and the example's tools.

Kept apart from ``cli.py`` so each module stays small; ``cli.build_parser`` calls
``extend`` with its ``add`` helper.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

Add = Callable[..., Any]


def extend(add: Add) -> None:
    pass
