#!/bin/sh
# Builds the standalone check of the Hopper backward (check_bwd_sm90.cu): build.sh --backward,
# under the name the scripts and documents that build it call.
# Usage: tests/gpu/hopper/build_bwd.sh [output-dir]   (default: tests/gpu/hopper/build)
exec sh "$(dirname "$0")/build.sh" --backward "$@"
