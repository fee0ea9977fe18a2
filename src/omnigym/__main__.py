"""``python -m omnigym`` (and ``torchrun -m omnigym``) is the ``omnigym`` command."""

import sys

try:
    from omnigym.cli import main
except KeyboardInterrupt:  # Ctrl-C in the first milliseconds, before main() handles it: one line too
    print("omnigym: interrupted; the run had not started; nothing was written", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
