"""`python -m iris`: the `iris` command (iris/cli)."""
import sys

from .cli.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
