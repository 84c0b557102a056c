"""``python -m flowrt.cli``: the ``flowrt`` command line."""

import sys

from flowrt.cli import main

sys.exit(main())
