"""``python -m odb plan ...``: the package's commands (one today: `odb.plan.cli`)."""

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("plan",):
        print("usage: odb plan LENGTHS --world-size N [...]   (odb plan --help)", file=sys.stderr)
        return 2
    from .plan.cli import main as plan_main

    return plan_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
