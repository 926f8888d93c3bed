"""`python -m iris.run -n N script.py [args...]`: iris's launcher under its documented name (iris/cli/run.py)."""
import sys

from .cli.run import main

if __name__ == "__main__":
    sys.exit(main())
