#!/usr/bin/env bash
# The wheels `make gpu-check` needs on a GPU machine without internet access (docs/scaling.md, "The GPU check"),
# downloaded into WHEELS (default the repository's .whl/, ignored by git), which the device command carries and
# benchmarks/gpu_check.sh installs there:
#
#   bash benchmarks/gpu_wheels.sh [--dry-run]     # --dry-run: print the pip command, download nothing
#
# For python 3.12 on manylinux x86_64 (the lent machines' python3), binary wheels only, without their dependencies
# (the machine has torch, peft, accelerate, tokenizers, huggingface-hub...; docs/scaling.md lists what it lacks):
# transformers at the version PYTHON (default .venv/bin/python, else python3) has installed; bitsandbytes,
# platformdirs, snowballstemmer, isal, lemminflect and tenacity as finecap's pyproject.toml pins them; regex as that
# transformers requires it; num2words (SmolVLM's processor; its docopt is read only by its command-line script, and is
# no wheel). pip skips a file already in WHEELS and removes none. A PYTHON without transformers, or older than 3.11
# (no tomllib to read pyproject.toml), stops it with one line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=${WHEELS:-$root/.whl}
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    [ -x "$root/.venv/bin/python" ] && PYTHON=$root/.venv/bin/python
fi
dry=
case "${1:-}" in
    --dry-run) dry=1 ;;
    "") ;;
    *) echo "usage: bash benchmarks/gpu_wheels.sh [--dry-run]" >&2; exit 2 ;;
esac
specs=$("$PYTHON" - "$root/pyproject.toml" "$PYTHON" <<'EOF'
import importlib.metadata as md
import re
import sys

try:
    import tomllib
except ModuleNotFoundError:  # python < 3.11: one line, not a traceback; the script stops (set -e)
    sys.exit(f"benchmarks/gpu_wheels.sh: {sys.argv[2]} is python {sys.version.split()[0]}, without tomllib (python "
             ">= 3.11, as finecap requires), which reads pyproject.toml's pins: run it with finecap's .venv (make "
             "install) or PYTHON set to a python >= 3.11 that has transformers")

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
pins = {}
for spec in [*project["dependencies"], *project["optional-dependencies"]["quant"]]:
    name = re.match(r"[A-Za-z0-9_.-]+", spec).group()
    pins[name.lower()] = spec
try:
    version = md.version("transformers")
except md.PackageNotFoundError:  # one line, not a traceback; the script stops (set -e)
    sys.exit(f"benchmarks/gpu_wheels.sh: {sys.argv[2]} has no transformers, whose version the wheels are for: run it "
             "with finecap's .venv (make install) or PYTHON set to a python that has transformers")
regex = next(r.split(";")[0] for r in md.requires("transformers") or [] if re.match(r"regex\b", r))
names = ("bitsandbytes", "platformdirs", "snowballstemmer", "isal", "lemminflect", "tenacity")
print(" ".join([f"transformers=={version}", *(pins[n] for n in names), regex, "num2words"]))
EOF
)
read -r -a wanted <<< "$specs"
cmd=("$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64
     -d "$WHEELS" "${wanted[@]}")
if [ -n "$dry" ]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi
mkdir -p "$WHEELS"
"${cmd[@]}"
