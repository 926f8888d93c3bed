"""`python -m iris.run -n N [--prefix] script.py [args...]`: run a script as N ranks of one job; their
output comes back by whole lines, stdout to stdout and stderr to stderr."""
import argparse
import sys

from ..distributed.launch import check_job_env, launch
from ..errors import IrisError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iris.run", description=__doc__)
    parser.add_argument("-n", "--nprocs", type=int, default=2, help="number of ranks (default 2)")
    parser.add_argument("--prefix", action="store_true", help="start each output line with [rankN]: as torchrun does")
    parser.add_argument("script", help="Python script to run on every rank")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.nprocs < 1:
        parser.error(f"-n must be at least 1, got {opts.nprocs}")
    try:
        check_job_env()
    except (ValueError, IrisError) as e:  # a setting no rank could start with: said once, here
        print(f"python -m iris.run: {e}", file=sys.stderr)
        return 2
    return launch([opts.script, *opts.args], opts.nprocs, prefix=opts.prefix)


if __name__ == "__main__":
    sys.exit(main())
