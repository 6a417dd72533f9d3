"""``python -m proofs.conformance TRACE_DIR``: check every run's traces; exit 1 on a violation."""

import sys

from .check import check_dir

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m proofs.conformance TRACE_DIR")
    reports = check_dir(sys.argv[1])
    for r in reports:
        status = "OK" if r.ok else "VIOLATION"
        print(f"{r.name}: {status} ranks={r.world_size} events={r.events} rounds={r.rounds} "
              f"aborted={r.aborted} rows={dict(r.rows)}")
        if r.critical_path:
            cp = r.critical_path
            print(f"    critical path: {cp['collectives']} collectives, {cp['events']} events "
                  f"(segments by rank {cp['segments_by_rank']}; happens-before graph {cp['hb_events']} events, "
                  f"{cp['hb_edges']} edges)")
        for e in r.local_errors + r.failures:
            print("    error:", e.splitlines()[0])
        for p in r.problems[:20]:
            print("   ", p)
    sys.exit(0 if reports and all(r.ok for r in reports) else 1)
