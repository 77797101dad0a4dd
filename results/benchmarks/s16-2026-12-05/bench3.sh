#!/bin/bash
# Three arms interleaved, 12 rounds: 0c23032 (before issue 20), 976f27c (issue 20
# with the allocation scopes compiled in), the candidate (scopes compiled out).
# Arm order rotates each round. Files: btree3-{base,prev,cand}-rN.json.
set -u
B=/work/base-0c23032/build
P=/work/base-976f27c
C=/work/cand-nofs
OUT=/work/main/results/benchmarks/s16-2026-12-05
for r in $(seq 1 12); do
  case $((r % 3)) in 0) order="base prev cand";; 1) order="prev cand base";; 2) order="cand base prev";; esac
  for arm in $order; do
    case $arm in base) d=$B;; prev) d=$P;; cand) d=$C;; esac
    echo "$(date +%T) btree $arm r$r"
    $d/bin/tierfs bench btree --n 1000000 --threads 1 --dir /var/tmp --json $OUT/btree3-$arm-r$r.json > $OUT/btree3-$arm-r$r.log 2>&1 || echo "btree $arm r$r failed"
  done
done
echo "$(date +%T) done"
