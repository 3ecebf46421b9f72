"""torch.compile's work persists across processes in the directory of `--compile-cache` (dmtp/cli/args.py), set by
the entry point, and its first run in a process is said and timed (dmtp/compiling.py): a tiny compiled function in
two processes, the second reading the first's compiled graph from the cache (torch's own counters)."""
import os
import subprocess
import sys

SCRIPT = """
import sys, torch
from dmtp.cli.args import use_compile_cache
use_compile_cache(sys.argv[1])  # as every command does before anything compiles
from dmtp.compiling import announce, counts
from dmtp.io import environment
f = torch.compile(lambda x: (x.sin() * 2 + 1).relu().sum(-1))
with announce("a tiny function"):
    f(torch.randn(4, 8))
with announce("a tiny function"):  # said once per process
    f(torch.randn(4, 8))
print(counts()["hits"], counts()["misses"], environment()["compile_cache"])
"""


def test_the_second_process_reads_the_compile_cache(tmp_path):
    cache = tmp_path / "cache"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TRITON_CACHE_DIR", None)
    runs = [subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], env=env, capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    (first, second) = (r.stdout.split() for r in runs)
    assert first == ["0", "1", str(cache)] and second == ["1", "0", str(cache)]
    said = [[line for line in r.stderr.splitlines() if "a tiny function" in line] for r in runs]
    assert [len(s) for s in said] == [2, 2]  # one line before, one after; nothing the second time in a process
    assert said[0][0].startswith("compiling a tiny function") and str(cache) in said[0][0]
    assert said[0][1].endswith("1 graphs, compile cache 0 hits / 1 misses")
    assert said[1][1].endswith("1 graphs, compile cache 1 hits / 0 misses")
