#!/bin/bash
# HolisticCap under the merge's conflict rule before and after 738a377c (a visual position contradicting a human
# relation dropped), with one visual expert: the numbers docs/vcb-results.md quotes (its note above Table 2), kept in
# benchmarks/results/holistic_conflict_rule/. Run in a clone whose finecap home ($FINECAP_HOME) holds a finished
# `make demo` (its world, world encoder and retriever): trains the visual expert (about 7 min on 2 cores), boosts
# and scores the world's caption fields with the current rule, then with the old one (the two files of 738a377c^
# put in place and restored; nothing else changes), copying each run's vcb_captions.json and dataset.json to $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
RUN="${FINECAP_HOME:?set FINECAP_HOME to the demo's home}/runs/demo"
FINECAP=${FINECAP:-.venv/bin/finecap}
restore() { git checkout -q src/finecap/boost/world_facts.py src/finecap/boost/world_backend.py; }
trap restore EXIT
"$FINECAP" demo --stages visual_expert,boost_holistic,captions_holistic
mkdir -p "$OUT/new" "$OUT/old"
cp "$RUN/vcb_captions.json" "$RUN/world_holistic/dataset.json" "$OUT/new/"
git show 738a377c^:src/finecap/boost/world_facts.py > src/finecap/boost/world_facts.py
git show 738a377c^:src/finecap/boost/world_backend.py > src/finecap/boost/world_backend.py
"$FINECAP" demo --stages boost_holistic,captions_holistic --force
cp "$RUN/vcb_captions.json" "$RUN/world_holistic/dataset.json" "$OUT/old/"
echo "wrote $OUT/new and $OUT/old"
