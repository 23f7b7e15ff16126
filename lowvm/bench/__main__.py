"""``python -m lowvm.bench``: run the benchmark (see :mod:`lowvm.bench.cli`)."""

import sys

from lowvm.bench.cli import main

sys.exit(main())
