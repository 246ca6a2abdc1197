"""Command line for the labs: build, check, grade (see ortlab.labs)."""
import argparse
import sys
import time
from pathlib import Path

from ortlab.errors import OrtlabError
from ortlab.labs import answers as walkthrough_answers
from ortlab.labs import build as lab_build
from ortlab.labs import grade as lab_grade
from ortlab.labs import workspace


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m ortlab.labs", description=__doc__)
    parser.add_argument("--solutions", default=None,
                        help="solution notebooks folder (default: solutions; for grade, this checkout's solutions/)")
    parser.add_argument("--labs", default="labs", help="generated labs folder")
    # the same options after the command too (`grade LAB --solutions DIR`); SUPPRESS keeps the above
    folders = argparse.ArgumentParser(add_help=False)
    folders.add_argument("--solutions", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    folders.add_argument("--labs", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write labs/ from solutions/", parents=[folders])
    b.add_argument("--force", action="store_true",
                   help="overwrite labs with edits, after backing each up as <name>.bakN")
    sub.add_parser("check", help="exit 1 when labs/ is not what build would write", parents=[folders])
    g = sub.add_parser("grade", help="run a lab in a fresh kernel and grade its exercises", parents=[folders])
    g.add_argument("notebook")
    g.add_argument("--timeout", type=float, default=lab_grade.DEFAULT_TIMEOUT,
                   help="seconds for the whole notebook, more than 0 (default %(default)g)")
    sub.add_parser("workspace", help="copy notebooks/ and labs/ into work/ (never overwriting a copy)")
    sub.add_parser("progress", help="every notebook's exercises, done and not done, in work/")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            written = lab_build.build(args.solutions or "solutions", args.labs, force=args.force)
            print(f"{len(written)} lab(s) written" if written else f"{args.labs}/ is up to date")
            return 0
        if args.command == "check":
            stale = lab_build.check(args.solutions or "solutions", args.labs)
            for path in stale:
                print(f"out of date: {path}")
            if stale:
                print("run `python -m ortlab.labs build` to regenerate labs/ from solutions/")
            unmatched = walkthrough_answers.check_all(Path(args.solutions or "solutions") / "walkthroughs")
            for problem in unmatched:
                print(f"walkthrough: {problem}")
            if stale or unmatched:
                return 1
            print(f"{args.labs}/ is up to date; every walkthrough's exercises have answers")
            return 0
        if args.command == "workspace":
            return _workspace()
        if args.command == "progress":
            print(workspace.progress_table(*workspace.progress()))
            return 0
        path = lab_grade.lab_path(args.notebook)
        results, problem = lab_grade.grade(path, timeout=args.timeout, solutions_dir=args.solutions)
        saved = time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))
        print(f"graded {path} as saved at {saved}; edits made since then and not saved (Ctrl+S) are not graded")
        print(lab_grade.table(results))
        if problem:
            print(f"note: {problem}")
        return 0 if all(r.status == "pass" for r in results) else 1
    except OrtlabError as exc:
        print(f"{args.command}: {exc}", file=sys.stderr)
        return 2


def _workspace():
    copied, kept = workspace.fill()
    print(f"{workspace.root()}: {len(copied)} notebook(s) copied, {len(kept)} of yours kept as they are")
    for path in workspace.newer_upstream():
        print(f"  note: the repository's {path.parent.name}/{path.name} changed since your copy was made; "
              f"yours is kept (rename it and run this again for a fresh copy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
