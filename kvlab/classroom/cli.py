"""``python -m kvlab lessons ...``: the command line of :mod:`kvlab.classroom.lessons` (make, grade, class,
attacks, time). Kept apart from the lessons module so that the tools it dispatches to (submissions, attacks,
timing), which build on the lessons module, are not imported by it."""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from kvlab.classroom import lessons as lessons_module

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlab lessons", description=lessons_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="student versions and autograders of the lessons (otter assign)")
    p.add_argument("lessons", nargs="*", help="lesson numbers or names (default: all)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("build/lessons"))
    p.add_argument("--run-tests", action="store_true", help="let otter run each master against its tests")
    p.add_argument("--seed", type=int, default=None,
                   help="the instructor's secret for the hidden tests' inputs (kept in the private autograder folder)")
    p = sub.add_parser("grade", help="grade a folder of submissions: CSV, per-student feedback (each question in its own process)")
    p.add_argument("lesson", help="lesson number or name, e.g. 01")
    p.add_argument("submissions", type=pathlib.Path, help="folder of the students' .ipynb files or export zips")
    p.add_argument("--built", type=pathlib.Path, default=pathlib.Path("build/lessons"),
                   help="where `make` wrote the assignments")
    p.add_argument("--out", type=pathlib.Path, default=None, help="default: build/grades/<lesson>")
    p.add_argument("--jobs", type=int, default=1, help="questions graded at once (one process each)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one question of one submission may run (default: 10x the reference answer's "
                        "measured time, at least 5 s)")
    p.add_argument("--seed-file", type=pathlib.Path, default=None,
                   help="a file (mode 600) holding the secret of the hidden tests' inputs (default: the one `make "
                        "--seed` kept in the private autograder folder, else 0)")
    p.add_argument("--trust-submissions", action="store_true",
                   help="grade even where no bubblewrap sandbox can be made (only for submissions you trust)")
    p.add_argument("--no-cgroups", action="store_true",
                   help="grade without a control group per child (the weaker per-process limits: see the guide)")
    p = sub.add_parser("class", help="N honest submissions of a built lesson (to time grading)")
    p.add_argument("assignment", type=pathlib.Path, help="the folder `make` wrote, e.g. build/lessons/01_streaming_llm")
    p.add_argument("n", type=int, help="students")
    p.add_argument("out", type=pathlib.Path, help="a new folder (or one this command wrote)")
    p = sub.add_parser("attacks", help="the attack submissions of the grading tests, their assignment and build")
    p.add_argument("out", type=pathlib.Path, help="a new folder (or one this command wrote)")
    sub.add_parser("time", help="class wall time in the sandbox (see `lessons time -h`)", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["time"]:
        from kvlab.classroom.timing import main as time_main

        try:
            return time_main(argv[1:])
        except (ValueError, FileNotFoundError) as exc:
            print(f"kvlab lessons time: {exc}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as exc:  # a bad lesson, folder or output (OutputRefused): one sentence
        said = str(exc)
        print(said if said.startswith("kvlab ") else f"kvlab lessons {args.command}: {said}", file=sys.stderr)
        return 2


def _run(args) -> int:
    if args.command == "class":
        from kvlab.classroom.submissions import write_class

        for path in write_class(args.assignment, args.n, args.out):
            print(path)
        return 0
    if args.command == "attacks":
        from kvlab.classroom.attacks import write_all

        print(json.dumps(write_all(args.out)))
        return 0
    if args.command == "make":
        for a in lessons_module.make(args.lessons, args.out, args.run_tests, seed=args.seed):
            print(f"{a.name}: student version {a.student}; grade with {a.autograder} (keep it private)")
        print(f"hand out {args.out / lessons_module.BUNDLE}/ or {args.out / lessons_module.BUNDLE}.zip: the student versions only")
        return 0
    name = lessons_module.lessons([args.lesson])[0].stem
    if args.jobs < 1:
        raise ValueError(f"--jobs must be an int >= 1 (questions graded at once), got {args.jobs}")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout must be a finite number of seconds > 0, got {args.timeout}")
    out = args.out or pathlib.Path("build/grades") / name
    from kvlab.threads import share_threads

    share_threads(max(1, args.jobs))  # each grading process computes with cores // jobs threads (KVLAB_THREADS wins)
    from kvlab.classroom.grading import SandboxUnavailable

    try:
        table = lessons_module.grade(args.built / name, args.submissions, out, jobs=args.jobs, timeout=args.timeout,
                      seed_file=args.seed_file, trust_submissions=args.trust_submissions,
                      cgroups=False if args.no_cgroups else None)
    except SandboxUnavailable as exc:
        print(f"kvlab lessons grade: {exc}", file=sys.stderr)
        return 2
    print(table.drop(columns=["review"]).to_string(index=False))
    flagged = table[(table["review"] != "") & (table["file"] != "points-per-question")]
    for _, row in flagged.iterrows():
        print(f"REVIEW {row['file']}: {row['review']}")
    print(f"wrote {out / 'final_grades.csv'}, {out / 'feedback.csv'}, {out / 'feedback'}/ and "
          f"{out / 'written_answers.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
