"""pytest setup for the flashc Python tests: imports flashc from this source tree (unless
FLASHC_TEST_INSTALLED=1 asks for the installed package) and prints, at the end of the run,
the largest relative errors that the accuracy tests measured."""

import os
import sys

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("FLASHC_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(_REPO_ROOT, "python"))

from attention_reference import MEASURED  # noqa: E402


def pytest_report_header(config):
    import flashc

    return "flashc %s from %s; backends %s" % (flashc.__version__, flashc.library_path,
                                               flashc.backends())


def pytest_terminal_summary(terminalreporter):
    if not MEASURED:
        return
    terminalreporter.section("flashc accuracy: largest relative error ||x - ref|| / ||ref||")
    rows = {}
    for (suite, dtype, tensor), (error, bound, _) in MEASURED.items():
        rows.setdefault((suite, dtype), (bound, {}))[1][tensor] = error
    for (suite, dtype), (bound, errors) in sorted(rows.items()):
        figures = "  ".join("%s %.1e" % (name, errors[name])
                            for name in ("out", "lse", "dq", "dk", "dv") if name in errors)
        terminalreporter.write_line("%-22s %-9s %s   (bound %.0e)" % (suite, dtype, figures, bound))
