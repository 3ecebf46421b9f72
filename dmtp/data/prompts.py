"""Code-completion prompts cut from the corpus, for the drafter's on-policy data (the target completes them).

    python -c "from dmtp.data import *; print(code_prompts('/tmp/c/train.jsonl', load_tokenizer('/tmp/tok'), 4))"

A prompt is shaped like a HumanEval one: the lines before a function (imports, decorators, earlier code) up to
the token budget, then its `def ...:` signature and its docstring if it has one, ending in a newline.
"""
from __future__ import annotations

import ast
import random
import warnings

from dmtp.data.corpus import _banned, iter_documents
from dmtp.data.tokenizer import SPECIAL, encode_text


def _is_stub(stmts) -> bool:
    # nothing to complete: `pass` / `...` / empty after the docstring
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                            and s.value.value is Ellipsis) for s in stmts)


def _functions(text: str):
    """(def line, end line) per non-stub function, 0-based, end exclusive: the header plus docstring."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning: invalid escape sequence, in old files
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0]
        doc = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
               and isinstance(first.value.value, str))
        if first.lineno == node.lineno or _is_stub(node.body[1:] if doc else node.body):
            continue  # one-liners (`def f(): return 1`) and stubs
        out.append((node.lineno - 1, first.end_lineno if doc else first.lineno - 1))
    return sorted(out)


def code_prompts(corpus_jsonl, tok, n, max_prompt_tokens=128, seed=0, per_doc: int = 2) -> list[dict]:
    """Up to `n` prompts {"id": "<sha256[:12]>:L<def line>", "prompt": text} of at most `max_prompt_tokens`.

    Deterministic for a given corpus, tokenizer and `seed`: documents are visited in a seeded shuffle, and at most
    `per_doc` functions are taken from each. Skips documents mentioning HumanEval, prompts holding special tokens.
    """
    rng = random.Random(seed)
    n_tok = lambda s: len(encode_text(tok, [s])[0])  # noqa: E731
    docs = [d for d in iter_documents(corpus_jsonl) if not _banned(d["path"]) and not _banned(d["text"])]
    rng.shuffle(docs)
    out, seen = [], set()
    for d in docs:
        lines = [ln + "\n" for ln in d["text"].split("\n")]  # ast counts lines by "\n" too
        fns = _functions(d["text"])
        rng.shuffle(fns)
        taken = 0
        for def_line, end in fns:
            if taken == per_doc or len(out) == n:
                break
            start = def_line
            if n_tok("".join(lines[start:end])) > max_prompt_tokens:
                continue  # signature + docstring alone is over budget
            while start > 0 and n_tok("".join(lines[start - 1:end])) <= max_prompt_tokens:
                start -= 1  # grow the context upwards, one line at a time
            prompt = "".join(lines[start:end])
            if prompt in seen or _banned(prompt) or any(t in prompt for t in SPECIAL):
                continue
            seen.add(prompt)
            out.append({"id": f"{d['sha256'][:12]}:L{def_line + 1}", "prompt": prompt})
            taken += 1
        if len(out) == n:
            break
    if len(out) < n:
        warnings.warn(f"code_prompts: only {len(out)} of {n} prompts in {corpus_jsonl} (raise per_doc?)")
    return out
