#!/bin/bash
# Interleaved bench btree + bench-fs: baseline 0c23032 vs candidate (issue 20's final check)
set -u
B=/work/base-0c23032/build
C=/work/cand-ea19c70
OUT=/work/main/results/benchmarks/s15-2026-12-05
mkdir -p $OUT
cd /work/main
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="base cand"; else order="cand base"; fi
  for arm in $order; do
    d=$B; [ $arm = cand ] && d=$C
    echo "$(date +%T) btree $arm r$r"
    $d/bin/tierfs bench btree --n 1000000 --threads 1 --dir /var/tmp --json $OUT/btree-$arm-r$r.json > $OUT/btree-$arm-r$r.log 2>&1 || echo "btree $arm r$r failed"
  done
done
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="base cand"; else order="cand base"; fi
  for arm in $order; do
    d=$B; [ $arm = cand ] && d=$C
    echo "$(date +%T) fs $arm r$r"
    scripts/bench-fs --build $d --targets tierfs --steps create,stat,ls_lR,du_s,unlink --files 15000 --rounds 1 --json $OUT/fs-$arm-r$r.json > $OUT/fs-$arm-r$r.log 2>&1 || echo "fs $arm r$r failed"
  done
done
echo "$(date +%T) done"
