"""``python -m trainsim`` is the ``trainsim`` command."""

import sys

from trainsim.cli.main import main

sys.exit(main())
