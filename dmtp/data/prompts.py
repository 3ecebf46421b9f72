"""Code-completion prompts cut from the corpus: the drafters' on-policy data (the target completes them) and the
out-of-distribution evaluation set `pytests`.

    python -c "from dmtp.data import *; print(code_prompts('/tmp/c/train.jsonl', load_tokenizer('/tmp/tok'), 4))"
    code_prompts('/tmp/c/train.jsonl', load_tokenizer('/tmp/tok'), 4, tests=True)   # the pytests set's cut

A prompt is shaped like a HumanEval one: the lines before a function (imports, decorators, earlier code) up to
the token budget, then its `def ...:` signature and its docstring if it has one, ending in a newline.

Test files (`is_test_file`: a `test` / `tests` directory below the corpus root, or a `test_*.py` / `*_test.py` name)
never give drafter prompts (`tests=False`); `tests=True` cuts prompts from them alone, at module-level `test*`
functions only, so HumanEval's stop strings (a new top-level `def`, `class`, `if`, `print`, `#`) end a completion
at the function's end as they do for HumanEval (docs/DESIGN.md, "Out-of-distribution set").
"""
from __future__ import annotations

import ast
import contextlib
import multiprocessing
import os
import random
import signal
import warnings
from pathlib import Path

from tokenizers import Tokenizer
from tqdm.auto import tqdm

from dmtp.data.corpus import banned, corpus_summary, iter_documents
from dmtp.data.tokenizer import SPECIAL, backend, encode_text

PROMPT_CUT = 2  # version of the cut (the data and eval stages' fingerprints hold it); 2: test files kept apart


def is_test_file(path: str, roots=()) -> bool:
    """A test module: a `test` or `tests` directory on its path below the corpus root it came from (the first of
    `roots` that holds it: a checkout under /home/tests/ is not all tests), or a `test_*.py` / `*_test.py` name."""
    for r in roots:
        r = r.rstrip("/") + "/"
        if path.startswith(r):
            path = path[len(r):]
            break
    *dirs, name = path.strip("/").split("/")
    return any(d in ("test", "tests") for d in dirs) or name.startswith("test_") or name.endswith("_test.py")


def _is_stub(stmts) -> bool:
    # nothing to complete: `pass` / `...` / empty after the docstring
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and s.value.value is Ellipsis) for s in stmts)


def _functions(text: str, tests: bool = False):
    """(def line, end line) per non-stub function, 0-based, end exclusive: the header plus docstring; `tests`: only
    the module-level functions named test*."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning: invalid escape sequence, in old files
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in (tree.body if tests else ast.walk(tree)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if tests and not node.name.startswith("test"):
            continue
        first = node.body[0]
        doc = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
               and isinstance(first.value.value, str))
        if first.lineno == node.lineno or _is_stub(node.body[1:] if doc else node.body):
            continue  # one-liners (`def f(): return 1`) and stubs
        out.append((node.lineno - 1, first.end_lineno if doc else first.lineno - 1))
    return sorted(out)


def _doc_candidates(d: dict, tok, max_prompt_tokens: int, per_doc: int, seed: int, tests: bool) -> list[dict]:
    """Up to `per_doc` + 2 prompts of one document (its functions in a seeded shuffle; spares for duplicates).

    Token counts come from one batched encode of the document's lines: the tokenizer splits at every newline before
    its BPE (pre-tokenizer v2), so a run of lines has the sum of its lines' counts; the chosen prompt is encoded
    whole once more and shrunk while over the budget (a tokenizer without that split is still exact, only slower)."""
    lines = [ln + "\n" for ln in d["text"].split("\n")]  # ast counts lines by "\n" too
    fns = _functions(d["text"], tests)
    if not fns:
        return []
    random.Random(f"{seed}:{d['sha256']}").shuffle(fns)
    counts = [len(x) for x in encode_text(tok, lines)]
    pre = [0]
    for c in counts:
        pre.append(pre[-1] + c)
    out = []
    for def_line, end in fns:
        if len(out) == per_doc + 2:
            break
        if pre[end] - pre[def_line] > max_prompt_tokens:
            continue  # signature + docstring alone is over budget
        start = def_line
        while start > 0 and pre[end] - pre[start - 1] <= max_prompt_tokens:
            start -= 1  # grow the context upwards, one line at a time
        while start < def_line and len(encode_text(tok, ["".join(lines[start:end])])[0]) > max_prompt_tokens:
            start += 1  # not additive (another tokenizer): shrink until it fits
        prompt = "".join(lines[start:end])
        if banned(prompt) or any(t in prompt for t in SPECIAL):
            continue
        out.append({"id": f"{d['sha256'][:12]}:L{def_line + 1}", "prompt": prompt})
    return out


_WORKER: dict = {}


def _init_worker(tok_json: str, args: tuple):
    _WORKER["tok"], _WORKER["args"] = Tokenizer.from_str(tok_json), args


@contextlib.contextmanager
def _sigterm_default():
    """SIGTERM's default action while worker processes start: a parent that ignores it (a job wrapper, a test runner
    after an in-process Ctrl-C) would pass that on to them, and `Pool.terminate` could then never stop them."""
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    if before == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        if before == signal.SIG_IGN:
            signal.signal(signal.SIGTERM, before)


def _work(d: dict) -> list[dict]:
    return _doc_candidates(d, _WORKER["tok"], *_WORKER["args"])


def code_prompts(corpus_jsonl, tok, n, max_prompt_tokens=128, seed=0, per_doc: int = 2,
                 workers: int | None = None, tests: bool = False) -> list[dict]:
    """Up to `n` prompts {"id": "<sha256[:12]>:L<def line>", "prompt": text} of at most `max_prompt_tokens`.

    Deterministic for a given corpus, tokenizer and `seed`: documents are visited in a seeded shuffle, and at most
    `per_doc` functions are taken from each (in a shuffle seeded by the document). Skips documents mentioning
    HumanEval, prompts holding special tokens, repeated prompts. `tests=False`: documents that are not test files
    (`is_test_file`, below the roots recorded in the corpus's DONE), any function; `tests=True`: test files only,
    their module-level test* functions. The documents are parsed in `workers` processes (default: the CPU count; the
    order of the result does not depend on it).
    """
    rng = random.Random(seed)
    roots = corpus_summary(Path(corpus_jsonl).parent).get("roots", [])
    docs = [d for d in iter_documents(corpus_jsonl) if not banned(d["path"]) and not banned(d["text"])
            and is_test_file(d["path"], roots) == tests]
    rng.shuffle(docs)
    workers = min(workers or os.cpu_count() or 1, 32)
    args = (max_prompt_tokens, per_doc, seed, tests)
    out, seen = [], set()
    bar = tqdm(total=n, desc="prompts", dynamic_ncols=True, leave=False)
    pool = None
    if workers > 1:
        ctx = multiprocessing.get_context("spawn")  # no fork: the caller may hold CUDA or NCCL state
        with _sigterm_default():  # the workers start stoppable: `pool.terminate` below sends SIGTERM
            pool = ctx.Pool(workers, initializer=_init_worker, initargs=(backend(tok).to_str(), args))
        found = pool.imap(_work, docs, chunksize=16)
    else:
        found = (_doc_candidates(d, tok, *args) for d in docs)
    try:
        for cands in found:
            taken = 0
            for c in cands:
                if taken == per_doc or len(out) == n:
                    break
                if c["prompt"] in seen:
                    continue
                seen.add(c["prompt"])
                out.append(c)
                taken += 1
            bar.update(taken)
            if len(out) == n:
                break
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
    if len(out) < n:
        warnings.warn(f"code_prompts: only {len(out)} of {n} prompts in {corpus_jsonl} (raise per_doc?)")
    return out
