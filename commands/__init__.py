"""The `overlapcheck` subcommands, one module each: `add_parser(subparsers)` and `main(args)`."""
