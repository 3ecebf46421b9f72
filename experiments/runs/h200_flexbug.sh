#!/usr/bin/env bash
# The compiled engine's cache write on the H200 (<= 5 min): the repro (every variant; DMTP_CACHE_WRITE=graph rows show
# the fault, write-eager the fix) beside the GPU tests of the default engine (the write outside the compiled graph).
export PYTHONUNBUFFERED=1
K=${K:-"keeps_drafters or fast_drafter or (graphed_rounds and (ar or mtp or zero_init_residual) and not mtp_context and not dmtp_d2)"}
(timeout ${TEST_S:-400} python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "$K" > $OUT/t_default.txt 2>&1) &
(DMTP_FAST_DRAFTER=1 timeout ${TEST_S:-400} python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "fast_drafter" > $OUT/t_fd.txt 2>&1) &
timeout 200 python3 -m experiments.repro_fast_drafter 2>&1 | grep diff | tee $OUT/repro.txt
wait
for f in $OUT/t_*.txt; do echo "== $f"; grep -a "passed\|failed\|^FAILED\|Error" $f | tail -12; done
