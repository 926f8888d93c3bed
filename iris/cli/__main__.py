"""`iris` / `python -m iris`: info, bench, run and trace, the commands a user reaches for first.

COMMANDS names each command's module; it is imported only when that command runs, so `iris run`
never loads bench's or info's dependencies.
"""
import importlib
import sys

COMMANDS = {
    "info": ("iris.cli.info", "what iris would run on here (platform, devices, links, VMM, versions); --json"),
    "bench": ("iris.cli.bench", "run the source tree's benchmarks/ and compare iris with its references"),
    "run": ("iris.cli.run", "launch a script as N ranks: iris run -n 2 script.py [args...]"),
    "trace": ("iris.cli.trace", "draw a trace from ctx.tracing.export() as a PNG timeline per rank and SM"),
}


def usage() -> str:
    lines = [f"  {name:<7} {about}" for name, (_, about) in COMMANDS.items()]
    return "usage: iris COMMAND [options]\n\ncommands:\n" + "\n".join(lines) + "\n\n`iris COMMAND --help` tells more."


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"iris: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[command][0]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
