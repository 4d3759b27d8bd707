#!/bin/sh
# bench.scaling.cores on a machine with no network: the wheels it needs, built here, installed there.
#
#   bench/scaling/wheels.sh build DIR            where there is network: download into DIR the
#                                                wheels of bench/scaling/requirements.txt for
#                                                CPython 3.12 on x86_64 Linux (about 50 MB,
#                                                Envoy's binary included)
#   bench/scaling/wheels.sh install DIR VENV     there: a virtualenv VENV on python3.12 that
#                                                sees the machine's own packages, plus whatever
#                                                they lack, from DIR only (no index)
#
# Then, from the checkout: VENV/bin/python -m bench.scaling.cores --many-core --out REPORT_DIR
set -eu
here=$(cd "$(dirname "$0")" && pwd)
requirements="$here/requirements.txt"
case "${1:-}" in
build)
    dir=${2:?build DIR}
    python=${PYTHON:-python3}
    "$python" -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
        --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_31_x86_64 --platform any -r "$requirements" -d "$dir"
    ;;
install)
    dir=${2:?install DIR VENV}
    venv=${3:?install DIR VENV}
    ${PYTHON:-python3.12} -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install --no-index --find-links "$dir" -r "$requirements"
    ;;
*)
    echo "usage: $0 build DIR | install DIR VENV" >&2
    exit 2
    ;;
esac
