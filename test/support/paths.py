"""Where the tests and the repository are, for tests that run a script, a program or a
subprocess: the same wherever a test file sits under test/."""

import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # test/: conftest.py and the support package
REPO = os.path.dirname(TESTS)  # the repository: bench/, examples/, the checkout's package
