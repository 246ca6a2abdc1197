"""python -m ortlab COMMAND: the lab's command line. Commands: compare (see ortlab.compare)."""
import sys

COMMANDS = {"compare": "compare a model through ortlab and ORT 1.19.2, one row per check"}


def main(argv=None):
    """Dispatch to the command named first; returns the exit code (2 for an unknown command)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        listing = "; ".join(f"{name}: {what}" for name, what in COMMANDS.items())
        print(f"usage: python -m ortlab COMMAND ...; commands: {listing}", file=sys.stderr)
        return 2
    from ortlab.compare import main as compare_main  # lazy: compare loads torch and onnx; a usage error needs neither
    return compare_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
