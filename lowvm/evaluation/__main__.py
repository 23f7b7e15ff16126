"""``python -m lowvm.evaluation``: the quality benchmark (see :mod:`lowvm.evaluation.cli`)."""

import sys

from lowvm.evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
