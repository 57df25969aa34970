"""``python -m examples world|demo|chaos``, from a checkout: the example's world, the demo
and the chaos suite, beside every ``durable`` command. The examples are not installed with
the library; ``python -m`` finds them in the current directory (the repository's root)."""

import sys

from durable.cli.main import main
from examples.cli import register

sys.exit(main(extra=[register], prog="python -m examples"))
