#!/bin/sh
# Runs the Python suite with the given interpreter; exits 77 (skipped) when numpy or pytest is
# not installed, so that a C-only machine still runs the rest of the tests.
python="$1"
tests="$2"
if ! "$python" -c "import numpy, pytest" 2>/dev/null; then
    echo "numpy or pytest not installed: Python tests skipped"
    exit 77
fi
exec "$python" -m pytest -q "$tests"
