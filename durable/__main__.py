import sys

from durable.cli import main

sys.exit(main())
