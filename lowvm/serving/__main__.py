"""``python -m lowvm.serving``: the serving comparison (see :mod:`lowvm.serving.cli`)."""

from lowvm.serving.cli import main

if __name__ == "__main__":
    main()
