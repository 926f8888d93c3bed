"""iris's command-line tools: one module per command, each with `main(argv) -> int` (see __main__.COMMANDS)."""
