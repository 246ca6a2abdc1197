"""Where things are, for a test in any folder under tests/: the repository's root, tests/ and its fixtures.

pytest puts tests/ on sys.path when it loads tests/conftest.py (tests/ has no __init__.py), so a test in any
folder imports this and the other helpers beside it by their bare names: `from repo_paths import ROOT`.
"""
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"
