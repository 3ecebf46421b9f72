export PYTHONUNBUFFERED=1
K1="keeps_drafters or (graphed_rounds and (ar or dflash or zero_init_residual))"
(timeout 420 python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "$K1" > $OUT/t_default.txt 2>&1) &
(DMTP_WRITE_EAGER=1 timeout 420 python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "$K1" > $OUT/t_weager.txt 2>&1) &
(DMTP_WRITE_EAGER=1 DMTP_FAST_DRAFTER=1 timeout 420 python3 -m pytest -q -p no:warnings -p no:cacheprovider tests/test_cuda.py -k "fast_drafter" > $OUT/t_weager_fd.txt 2>&1) &
timeout 300 python3 -m experiments.repro_fast_drafter 2>&1 | grep diff | tee $OUT/repro.txt
wait
for f in $OUT/t_*.txt; do echo "== $f"; grep -a "passed\|failed\|^FAILED\|Error" $f | tail -12; done
