"""``python -m flowrt``: the ``flowrt`` command."""

import sys

from flowrt.cli import main

sys.exit(main())
