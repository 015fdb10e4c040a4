"""The claims ledger's command line: ``python -m kvlab claims [--counts] [--update] [--check] [--table PAPER]
[--write-readme] [--rerun ROW [--out DIR] [--device D] [--smoke]] [--list-experiments]``.

The ledger's rules live in :mod:`kvlab.experiments.claims`; a rerun of one row in :mod:`kvlab.experiments.rerun`.
"""
from __future__ import annotations

import sys

from kvlab.experiments import claims

__all__ = ["main"]


def _parser():
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvlab claims", description=claims.__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--counts", action="store_true",
                   help="per paper: items covered, claims tested and decided, checks, proxies, superseded rows")
    p.add_argument("--update", action="store_true",
                   help="recompute the statistical rows, run the exact rows' tests, and write the results back")
    p.add_argument("--write-readme", action="store_true",
                   help="regenerate README.md's counts block and docs/results.md (every row)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a computed column, README.md or docs/results.md is stale")
    p.add_argument("--skip-exact", action="store_true",
                   help="with --update or --check: do not run the exact rows' tests (keep what is recorded)")
    p.add_argument("--table", metavar="PAPER", help="print one paper's rows (as a notebook would)")
    p.add_argument("--rerun", metavar="ROW", help="rerun one row's experiment from its ledger configuration and "
                   "print the committed and rerun n, estimate, interval and verdict (kvlab.experiments.rerun)")
    p.add_argument("--out", help="with --rerun: the output folder (default build/reruns/ROW)")
    p.add_argument("--device", help="with --rerun: cpu, cuda, cuda:N (default: the experiment's auto)")
    p.add_argument("--smoke", action="store_true", help="with --rerun: the same code at tiny size on the CPU")
    p.add_argument("--list-experiments", action="store_true",
                   help="every experiment: CPU/GPU, model, minutes, and the ledger rows it reruns")
    return p


def _unknown_paper(table_arg: str) -> bool:
    """``--table PAPER`` names no paper of the ledger: say so (with a did-you-mean) on stderr."""
    if table_arg.lower() in {x.lower() for x in claims.PAPERS}:
        return False
    import difflib

    near = difflib.get_close_matches(table_arg, claims.PAPERS, n=1, cutoff=0.5)
    print(f"kvlab claims: --table {table_arg!r} is not a paper of the ledger; the papers are {list(claims.PAPERS)}"
          + (f" (did you mean {near[0]!r}?)" if near else ""), file=sys.stderr)
    return True


def _check_stale(rows: list[dict], skip_exact: bool) -> int:
    """``--check``: print every stale row and page; 1 if there is one, else 0."""
    status = 0
    for r in rows:
        if r["kind"] == "statistical":
            new = claims.recompute(r)
            stale = [k for k in claims.COMPUTED if new[k] != r[k]]
            if stale:
                print(f"{r['id']}: stale {stale} (run python -m kvlab claims --update)")
                status = 1
        elif r["kind"] == "exact" and not skip_exact:
            new = claims.exact_columns(r)
            stale = [k for k in new if new[k] != r[k]]
            if stale:
                print(f"{r['id']}: stale {stale}: its tests now give {new} (run python -m kvlab claims --update)")
                status = 1
    status |= _check_plans(rows)
    for stale in claims.stale_pages(rows):
        print(f"{stale} is stale (run {claims.WRITE_COMMAND})")
        status = 1
    return status


def _check_plans(rows: list[dict]) -> int:
    """``--check``: every statistical row's ``plan`` is what git history gives (1 if one is not); where the history
    cannot tell (a shallow clone, no git), say so and pass."""
    orders = claims.plan_orders(rows)
    if not orders:
        print("plan column not verified: no usable git history here (a shallow clone or no git)")
        return 0
    status = 0
    for r in rows:
        want = orders.get(r["id"])
        if want is not None and want != "unknown" and r.get("plan", "") != want:
            print(f"{r['id']}: stale ['plan']: git history gives {want!r} for its plan against its data, the row "
                  f"says {r.get('plan', '')!r} (run python -m kvlab claims --update)")
            status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.rerun is None and (args.out or args.device or args.smoke):
        p.error("--out, --device and --smoke go with --rerun ROW")
    if args.list_experiments or args.rerun:
        return _rerun_main(args)
    if args.table is not None and _unknown_paper(args.table):
        return 2
    if args.update:
        claims.update(run_exact=not args.skip_exact)
    if args.write_readme:
        print("README.md claims block and docs/results.md",
              "rewritten" if claims.write_readme() else "already up to date")
    rows = claims.load()
    claims.validate(rows)
    status = _check_stale(rows, args.skip_exact) if args.check else 0
    if args.table:
        print(claims.table(args.table, fmt="text"))
    if args.counts:
        print(claims.counts_text(rows))
    return status


def _rerun_main(args) -> int:
    from kvlab.experiments import rerun

    if args.list_experiments:
        print(rerun.list_experiments_text())
        return 0
    try:
        report = rerun.rerun(args.rerun, out=args.out, device=args.device, smoke=args.smoke)
    except (rerun.RerunError, ValueError) as e:
        print(f"kvlab claims --rerun: {e}", file=sys.stderr)
        return 2
    print(rerun.rerun_text(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
