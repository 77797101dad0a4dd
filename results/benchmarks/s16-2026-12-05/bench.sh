#!/bin/bash
# More interleaved bench btree rounds (1..12): baseline 0c23032 vs candidate (allocation scopes compiled out).
set -u
B=/work/base-0c23032/build
C=/work/cand-nofs
OUT=/work/main/results/benchmarks/s16-2026-12-05
cd /work/main
for r in 1 2 3 4 5 6 7 8 9 10 11 12; do
  if [ $((r % 2)) = 1 ]; then order="base cand"; else order="cand base"; fi
  for arm in $order; do
    d=$B; [ $arm = cand ] && d=$C
    echo "$(date +%T) btree $arm r$r"
    $d/bin/tierfs bench btree --n 1000000 --threads 1 --dir /var/tmp --json $OUT/btree-$arm-r$r.json > $OUT/btree-$arm-r$r.log 2>&1 || echo "btree $arm r$r failed"
  done
done
echo "$(date +%T) done"
