"""`iris` / `python -m iris`: info, bench and run, the commands a user reaches for first."""
import sys

USAGE = """usage: iris COMMAND [options]

commands:
  info    what iris would run on here (platform, devices, links, VMM, versions); --json
  bench   run the benchmarks in the source tree's benchmarks/ and compare iris with its references
  run     launch a script as N ranks: iris run -n 2 script.py [args...]

`iris COMMAND --help` tells more."""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "info":
        from .info import main as run
    elif command == "bench":
        from .bench import main as run
    elif command == "run":
        from .run import main as run
    else:
        print(f"iris: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
