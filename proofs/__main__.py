"""``python -m proofs verify [--deep] [--jobs J]``: run every proof, print the table, write the report.

Exit status: 0 when every verdict passes, every mutant is killed by its expected
killer and the z3 engine ran; 1 otherwise (a missing or ``unknown`` result is a
failure); 2 on a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

from .report import REPORT_JSON, REPORT_MD, run_all, verdict_table, write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="z3 all-N proofs + exhaustive explicit scopes + mutants; writes proofs/REPORT.md")
    v.add_argument("--deep", action="store_true", help="also explore models.scopes.DEEP_SCOPES (minutes)")
    v.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes (default: min(2, CPUs)); the verdicts do not depend on it")
    v.add_argument("--no-write", action="store_true", help="print only; leave proofs/REPORT.md unchanged")
    args = ap.parse_args(argv)
    rep = run_all(deep=args.deep, jobs=args.jobs, log=lambda s: print(s, flush=True))
    print()
    print(f"z3 {rep.z3_version} | table hash {rep.table_hash} | bound: {rep.bound_formula}")
    print("\n".join(verdict_table(rep.verdicts)))
    print()
    for m in rep.mutants + rep.dealt_mutants:
        print(f"mutant {m['name']:32} expected {m['expected']:28} "
              f"{'KILLED' if m['killed_as_expected'] else ('killed (other)' if m['killed'] else 'SURVIVED')}")
    if not args.no_write:
        write(rep)
        print(f"\nwrote {REPORT_MD} and {REPORT_JSON}")
    print(f"\n{'PASS' if rep.ok else 'FAIL'}: {len(rep.verdicts)} verdicts, "
          f"{len(rep.mutants) + len(rep.dealt_mutants)} mutants, "
          f"{rep.seconds:.1f} s")
    for f in rep.failures:
        print(f"  FAILED {f}")
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
