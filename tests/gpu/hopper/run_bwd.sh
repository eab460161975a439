#!/bin/sh
# One device call for the Hopper backward's check: run.sh --backward, under the name the
# documents give. Run from the repository root:
# sh tests/gpu/hopper/run_bwd.sh [--check-only | --bench-only | --small]
# With OUT set, the build log, the SASS and the output are also left under $OUT.
exec sh "$(dirname "$0")/run.sh" --backward "$@"
