import os
import random

# the tests run as the commands do (dmtp/cli/__init__.py): the hub's documented offline setting, read when
# huggingface_hub is imported, so before any import below
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from dmtp.engine.methods import Method  # noqa: E402
from dmtp.models import tiny  # noqa: E402

make_drafter = tiny.drafter  # a small random drafter of a variant (every test's)

# two intra-op threads, or OMP_NUM_THREADS (=1 runs every reduction in another order: tolerances must hold for both);
# one per process when pytest-xdist runs the tests in several (`make test`: two processes on CI's two cores)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")))


def pytest_runtest_logreport(report):
    """With DMTP_FAILURES set, each failure is appended to that file as it happens, its traceback included: a run
    whose time limit cuts pytest before its summary keeps what failed and why."""
    path = os.environ.get("DMTP_FAILURES")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture(scope="session", params=["qwen3_5", "qwen3"])
def arch(request):
    return request.param


@pytest.fixture(scope="session")
def models(arch):
    return tiny.build(arch, seed=0)


def token_seqs(n=12, seed=0):
    """n random training sequences of 14-39 tokens over ids 3..95 (the drafter-training tests' data)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 96) for _ in range(rng.randrange(14, 40))] for _ in range(n)]


def compiled_graphs(fn) -> int:
    """Graphs torch.compile holds for `fn` (one per set of guards: shapes, requires-grad flags, module types)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(fn.__code__))


def hf_greedy(tgt, prompt, max_new, eos=None):
    out = tgt.model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


class Oracle(Method):
    """Wraps a method: runs its real proposal (so every state update happens), records it, then substitutes the
    target's true continuation corrupted at random positions, so rounds accept 0..k candidates."""

    def __init__(self, inner, truth, p_keep=0.8, seed=0):
        self.inner, self.truth, self.p_keep = inner, truth, p_keep
        self.rng = random.Random(seed)
        self.k, self.taps, self.name = inner.k, inner.taps, inner.name
        self.log = []

    def prefill(self, st, ids, plen, out):
        self.plen = plen.tolist()
        self.inner.prefill(st, ids, plen, out)

    def propose(self, st):
        real = self.inner.propose(st)
        mtp = getattr(self.inner, "mtp", None)
        self.log.append((st.lens.clone(), st.done.clone(), real.clone(),
                         None if mtp is None else (mtp.t1.clone(), mtp.h.clone())))
        c = real.clone()
        for b, a in enumerate(st.lens.tolist()):
            start = a - self.plen[b] + 1  # output index of T1 (output 0 is the anchor of round one)
            for j in range(self.k):
                t = self.truth[b][start + j] if start + j < len(self.truth[b]) else 0
                c[b, j] = t if self.rng.random() < self.p_keep else (t + 1) % 96
        return c

    def commit(self, st, out, emitted, n_acc):
        self.inner.commit(st, out, emitted, n_acc)


def _gloo_rank(rank, fn, world, root, args):
    """One rank of `gloo_ranks`: its stderr (and a Python traceback on a fatal signal) into root/rank<r>.log, a gloo
    group over a file store, fn(rank, world, root, *args), a barrier (no rank closes its connections while another
    is still in a collective), the group ended."""
    import faulthandler

    import torch.distributed as dist

    log = open(root / f"rank{rank}.log", "w", buffering=1)  # noqa: SIM115 (open for the process's life)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(log, all_threads=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=rank, world_size=world)
    try:
        fn(rank, world, root, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def gloo_ranks(fn, world: int, root, *args) -> None:
    """fn(rank, world, root, *args) on `world` spawned CPU processes in one gloo group. A rank that raises or dies
    fails the test with every rank's log tail in the message (what a fatal signal printed included)."""
    import torch.multiprocessing as mp

    root.mkdir(parents=True, exist_ok=True)
    try:
        mp.spawn(_gloo_rank, args=(fn, world, root, args), nprocs=world, join=True)
    except mp.ProcessException as err:
        tails = []
        for r in range(world):
            log = root / f"rank{r}.log"
            text = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            tails.append(f"--- rank {r} (last 3,000 characters of its stderr) ---\n{text}")
        raise AssertionError(f"{err}\n" + "\n".join(tails)) from None
