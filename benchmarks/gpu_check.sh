#!/usr/bin/env bash
# `make gpu-check`: benchmarks/gpu_check.py as a lent GPU machine runs it (docs/scaling.md, "The GPU check").
#
#   OUT=/tmp/gpu bash benchmarks/gpu_check.sh [gpu_check.py options, e.g. --budget 480 --only family]
#
# - The wheels in WHEELS (default the repository's .whl/, ignored by git; what that machine lacks, e.g. platformdirs,
#   snowballstemmer, bitsandbytes) are installed into a folder of their own in /tmp first (exit 3 when they cannot
#   be; removed at the end), then found through PYTHONPATH beside src/; no .venv is needed: PYTHON (default python3)
#   brings torch and transformers. OUT and WHEELS are read from the caller's folder.
# - With OUT (a device machine sets it; it brings back 8 files at most), OUT receives four files: gpu_check.json,
#   gpu_check.log (what was printed), nvidia-smi.txt and gpu_check_logs.tgz (one log per check), replacing files of
#   those names; the checks' own folders stay in a new temporary folder. OUT, the log and nvidia-smi.txt are made
#   first, before the wheels are installed (what pip says goes to the log: a failed install, exit 3, comes back
#   with its reason). The JSON is written straight into OUT before any check (status "started", the machine's facts
#   that need no CUDA work) and rewritten there after every check (gpu_check.py --out), so a command cut off by the
#   device's time limit (it may run under less than its timeout_s when less device time is left) still brings back
#   what was measured, beside the log; only the tarball needs the end. Without OUT, gpu_check.py's defaults.
# Exit status: gpu_check.py's (1 when a check failed), 3 when the wheels could not be installed.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }  # as the caller named it, before the cd
[ -n "${OUT:-}" ] && OUT=$(absolute "$OUT")
WHEELS=$(absolute "${WHEELS:-$root/.whl}")
cd "$root"
PYTHON=${PYTHON:-python3}
log=/dev/null
if [ -n "${OUT:-}" ]; then  # first: whatever fails next comes back with its reason
    mkdir -p "$OUT" || exit 3
    rm -f "$OUT/gpu_check.json" "$OUT/gpu_check_logs.tgz"  # an earlier run's: never left beside this run's log
    log="$OUT/gpu_check.log"
    echo "gpu_check.sh: $(date '+%F %T %z') on $(hostname), OUT $OUT" > "$log"
    { nvidia-smi || echo "nvidia-smi: not available here"; } > "$OUT/nvidia-smi.txt" 2>&1
fi
path=src
site=
trap '[ -n "$site" ] && rm -rf "$site"' EXIT  # the unpacked wheels: this run's alone
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/finecap-gpu-site.XXXXXX")
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
            "$WHEELS"/*.whl 2>&1 | tee -a "$log"; then
        echo "gpu_check.sh: the wheels in $WHEELS could not be installed into $site (exit 3)" | tee -a "$log" >&2
        exit 3
    fi
    path="$path:$site"
fi
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${OUT:-}" ]; then
    "$PYTHON" benchmarks/gpu_check.py "$@"
    exit $?
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/finecap-gpu-out.XXXXXX")
"$PYTHON" benchmarks/gpu_check.py --out-dir "$work" --out "$OUT/gpu_check.json" "$@" 2>&1 | tee -a "$log"
rc=$?
[ -d "$work/gpu_check_logs" ] && tar czf "$OUT/gpu_check_logs.tgz" -C "$work" gpu_check_logs
exit $rc
