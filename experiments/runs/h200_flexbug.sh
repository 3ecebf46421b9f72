# The compiled engine's cache write on the H200: the repro (every variant), then the GPU tests that failed with the
# indexed write, on the default engine and with the compiled drafter opted in, in parallel (<= 7 min).
export PYTHONUNBUFFERED=1
K1="keeps_drafters or graphed_rounds or fast_drafter or stop_strings"
(timeout 400 python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "$K1" > $OUT/t_default.txt 2>&1) &
(DMTP_FAST_DRAFTER=1 timeout 400 python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "graphed_rounds or fast_drafter or stop_strings or verify_modes_graphed" > $OUT/t_fd.txt 2>&1) &
timeout 300 python3 -m experiments.repro_fast_drafter 2>&1 | grep diff | tee $OUT/repro.txt
wait
for f in $OUT/t_*.txt; do echo "== $f"; grep -a "passed\|failed\|^FAILED\|Error" $f | tail -12; done
