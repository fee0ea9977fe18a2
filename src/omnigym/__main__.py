"""``python -m omnigym`` (and ``torchrun -m omnigym``) is the ``omnigym`` command."""

import sys

from omnigym.cli import main

sys.exit(main())
