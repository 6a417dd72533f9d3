"""``odb`` (or ``python -m odb``): the package's commands; one today, ``odb plan`` (`odb.plan.cli`)."""

import sys

USAGE = """usage: odb COMMAND [ARGS]   (or: python -m odb COMMAND [ARGS])

commands:
  plan LENGTHS --world-size N [...]   predict steps, padding, balance and throughput of ODB configurations on
                                      your data's lengths, before training, and recommend one (odb plan --help)

options:
  -h, --help      this message
  --version       the installed version"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if argv and argv[0] == "--version":
        from . import __version__

        print(f"odb {__version__}")
        return 0
    if not argv or argv[0] != "plan":
        print(USAGE if not argv else f"odb: unknown command {argv[0]!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    from .plan.cli import main as plan_main

    return plan_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
