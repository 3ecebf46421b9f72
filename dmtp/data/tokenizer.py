"""Byte-level BPE tokenizer for the code model, and the flat token stream it pretrains on.

    python -c "from dmtp.data import train_tokenizer as t; t('runs/data/corpus/train.jsonl', 'runs/data/tok')"
    python -c "from dmtp.data import train_tokenizer as t; t('/tmp/c/train.jsonl', '/tmp/tok', 512)"   # tiny, CPU

Byte-level pre-tokenizer + decoder and no normalizer, so decode(encode(x)) == x for any text. Special tokens:
`<|endoftext|>` = id 0 (eos, pad, document separator) and `<|mask|>` = id 1 (the drafter's block mask token).
`AutoTokenizer.from_pretrained(out_dir)` loads the result.

Pre-tokenizer v2 (docs/DESIGN.md, "Prompt boundary"): every "\n" is its own pre-token, then the GPT-2 byte-level
split runs on the pieces between newlines. No token spans a newline, so for any text P that ends in "\n",
tokens(P + S) = tokens(P) + tokens(S): a prompt cut at a line end is tokenized exactly as in the training stream.
(v1, the plain GPT-2 split, merged a newline with the indentation after it — "\n    " was one token — so a prompt
ending in a lone "\n" token meant "the next line starts at column 0".) The version is saved in
`tokenizer_config.json` (`dmtp_pretokenizer`); `load_tokenizer` refuses a suite tokenizer of another version.
"""
from __future__ import annotations

import json
import multiprocessing
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm

from dmtp.checks import gist
from dmtp.data.corpus import iter_documents
from dmtp.io import atomic_path, read_json

_WORKER_TOK = None  # a worker's tokenizer (`encode_corpus`)

EOT, MASK = "<|endoftext|>", "<|mask|>"
SPECIAL = [EOT, MASK]  # ids 0, 1 (BpeTrainer assigns special tokens first, in this order)
PRETOKENIZER_VERSION = 2  # saved as `dmtp_pretokenizer` in tokenizer_config.json


def pre_tokenizer(version: int = PRETOKENIZER_VERSION):
    """v2: each "\n" isolated, then the GPT-2 byte-level split; v1 (old, kept to measure the change): GPT-2 only."""
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 regex split, bytes -> chars
    if version == 1:
        return gpt2
    if version == 2:
        return pre_tokenizers.Sequence([pre_tokenizers.Split("\n", behavior="isolated"), gpt2])
    raise ValueError(f"unknown pre-tokenizer version {version} (1, 2)")


class StaleTokenizer(ValueError):
    """A suite tokenizer saved with another pre-tokenizer version than this code's."""


def _texts(corpus_jsonl, max_docs=None, max_bytes=None):
    total = 0
    for i, doc in enumerate(iter_documents(corpus_jsonl)):
        if (max_docs is not None and i >= max_docs) or (max_bytes is not None and total >= max_bytes):
            return
        total += len(doc["text"])
        yield doc["text"]


def train_tokenizer(corpus_jsonl, out_dir, vocab_size=8192, max_docs=None, max_bytes: int | None = 24_000_000,
                    progress=True, version: int = PRETOKENIZER_VERSION) -> Path:
    """Train the byte-level BPE on the first `max_docs` documents / `max_bytes` characters of a corpus JSONL.

    Writes `tokenizer.json` + `tokenizer_config.json` into `out_dir` and returns `out_dir`; a directory that
    already holds a tokenizer of this `vocab_size` and pre-tokenizer `version` is reused as is (the stage is
    resumable); one of another size or version is replaced.
    """
    out_dir = Path(out_dir)
    if (out_dir / "tokenizer_config.json").exists() and (out_dir / "tokenizer.json").exists():
        if (Tokenizer.from_file(str(out_dir / "tokenizer.json")).get_vocab_size() == vocab_size
                and tokenizer_version(out_dir) == version):
            return out_dir
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer(version)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=progress)
    tok.train_from_iterator(_texts(corpus_jsonl, max_docs, max_bytes), trainer=trainer)
    assert [tok.token_to_id(t) for t in SPECIAL] == [0, 1]
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT, "pad_token": EOT,
              "unk_token": None, "mask_token": MASK, "model_max_length": 1 << 20,
              "clean_up_tokenization_spaces": False,  # else decode() rewrites " ." etc. and breaks the round trip
              "add_prefix_space": False, "dmtp_pretokenizer": version}
    with atomic_path(out_dir / "tokenizer.json") as t:
        tok.save(str(t))
    with atomic_path(out_dir / "tokenizer_config.json") as t:  # written last: its presence means "done"
        t.write_text(json.dumps(config, indent=2) + "\n")
    return out_dir


def tokenizer_version(path) -> int | None:
    """Pre-tokenizer version of the tokenizer saved in folder `path`: `dmtp_pretokenizer` from its config; 1 for a
    suite tokenizer saved before versions were recorded (`<|endoftext|>`, `<|mask|>` at ids 0, 1); None for any
    other tokenizer (an HF checkpoint's own, e.g. Qwen's)."""
    path = Path(path)
    cfg = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
    if cfg.get("dmtp_pretokenizer") is not None:
        return int(cfg["dmtp_pretokenizer"])
    mask = cfg.get("mask_token")
    if (mask.get("content") if isinstance(mask, dict) else mask) != MASK or not (path / "tokenizer.json").exists():
        return None  # not a suite tokenizer (no <|mask|>): nothing more to read
    bk = Tokenizer.from_file(str(path / "tokenizer.json"))
    return 1 if [bk.id_to_token(i) for i in (0, 1)] == SPECIAL else None


def load_tokenizer(path):
    """The HF fast tokenizer (`PreTrainedTokenizerFast`) saved by `train_tokenizer` (or beside a checkpoint) in
    directory `path`. A suite tokenizer of another pre-tokenizer version is an error (`StaleTokenizer`): text
    would be split differently from the stream the target was trained on."""
    from transformers import AutoTokenizer

    for f in ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json"):  # a bad one: file and line
        if (Path(path) / f).exists():
            read_json(Path(path) / f)
    v = tokenizer_version(path)
    if v is not None and v != PRETOKENIZER_VERSION:
        raise StaleTokenizer(f"{path}: tokenizer built with pre-tokenizer v{v}, this code uses "
                             f"v{PRETOKENIZER_VERSION} (newlines kept apart from indentation); rebuild it and "
                             "everything trained on it (`dmtp pipeline --stage tokenizer` rebuilds the tokenizer; "
                             "delete the profile's target, data and drafters under work/)")
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # files that parse but do not make a tokenizer (a vocabulary missing, ...)
        raise ValueError(f"tokenizer in {path} cannot be loaded: {gist(e)}") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def find_tokenizer(path):
    """The tokenizer saved beside a checkpoint in `path`, or None when the folder holds no tokenizer files (a
    tokenizer that is present but cannot be read is an error, never silently replaced)."""
    path = Path(path)
    if not any((path / f).exists() for f in TOKENIZER_FILES):
        return None
    tok = load_tokenizer(path)
    vocab = _model_vocab(path)
    if vocab is not None and len(tok) > vocab:  # its ids beyond the embedding would fail mid-decode, far from here
        raise ValueError(f"{path}: the tokenizer has {len(tok)} tokens, more than the model's vocabulary of {vocab} "
                         "(config.json vocab_size): a tokenizer of another model?")
    return tok


def _model_vocab(path: Path) -> int | None:
    """vocab_size of the checkpoint's config.json in `path` (its text config), or None without one."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):  # no config (a tokenizer alone), or one that its own reader reports
        return None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    v = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def backend(tok) -> Tokenizer:
    """The Rust `tokenizers.Tokenizer` behind an HF fast tokenizer (or `tok` itself)."""
    return tok if isinstance(tok, Tokenizer) else tok.backend_tokenizer


def encode_text(tok, texts: list[str]) -> list[list[int]]:
    """Token ids of plain text: no added specials, and a literal "<|endoftext|>" in the text stays plain text."""
    bk = backend(tok)
    old, bk.encode_special_tokens = bk.encode_special_tokens, True  # HF leaves this flag set by its last call
    try:
        return [e.ids for e in bk.encode_batch(texts, add_special_tokens=False)]  # parallel in Rust
    finally:
        bk.encode_special_tokens = old


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte <-> printable-char table (what a ByteLevel pre-tokenizer writes in the vocabulary), inverted."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def token_bytes(tok) -> list[bytes]:
    """Each token id's bytes, for stop-string matching on the host (`dmtp.engine.stops`): byte-level BPE
    vocabularies (this suite's, Qwen's) map their chars back through the GPT-2 byte table; special tokens are b""
    (they are not text), other added tokens their UTF-8 content."""
    bk = backend(tok)
    if type(bk.decoder).__name__ != "ByteLevel":
        raise ValueError(f"stop strings need a byte-level BPE tokenizer (ByteLevel decoder), not "
                         f"{type(bk.decoder).__name__}")
    byte = _byte_of_char()
    added = bk.get_added_tokens_decoder()
    vocab = bk.get_vocab(with_added_tokens=False)
    table = [b""] * (max([*vocab.values(), *added.keys()]) + 1)
    for t, i in vocab.items():
        table[i] = bytes(byte[c] for c in t)
    for i, a in added.items():
        table[i] = b"" if a.special else a.content.encode()
    return table


def prefix_stable(tok, pairs) -> list[bool]:
    """For (prefix P, suffix S) pairs: is tokens(P) a prefix of tokens(P + S)? (True at every line end with v2.)"""
    flat = [t for p, s in pairs for t in (p, p + s)]
    ids = encode_text(tok, flat)
    return [whole[: len(head)] == head for head, whole in zip(ids[0::2], ids[1::2])]


def _encode_init(spec: str) -> None:
    """A worker of `encode_corpus`: its own copy of the tokenizer, single-threaded (the workers are the parallelism)."""
    global _WORKER_TOK
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOK = Tokenizer.from_str(spec)


def _encode_chunk(texts: list[str], eot: int, dtype, tok=None) -> np.ndarray:
    """doc0 eot doc1 eot ... of one chunk of documents (`encode_text`), by `tok` (default: a worker's own)."""
    ids = encode_text(_WORKER_TOK if tok is None else tok, texts)
    return np.concatenate([np.asarray(x + [eot], dtype=dtype) for x in ids]) if ids else np.zeros(0, dtype)


def encode_corpus(corpus_jsonl, tok, out_path, batch_docs: int = 256, progress=True, workers: int = 1) -> Path:
    """Encode a corpus JSONL into one flat `.npy` token stream: doc0 <|endoftext|> doc1 <|endoftext|> ...

    Only the separators are id 0 (a "<|endoftext|>" written inside a source file is encoded as plain text).
    uint16 when the vocabulary fits, else int32. Written atomically; an existing `out_path` is kept as is.
    `workers` > 1: that many spawned processes encode chunks of `batch_docs` documents each, collected in order, so
    the stream is the same for any count (the pipeline's tokenizer stage: `pipeline.encode_workers`; one process's
    batch encoding ran at ~600 documents/s on `mini`'s corpus on a 16-core GPU host, 35 s for the whole corpus). A
    script that calls it with workers > 1 needs the `if __name__ == "__main__":` guard that spawned processes need.
    """
    out_path, bk = Path(out_path), backend(tok)
    if out_path.exists():
        return out_path
    eot = bk.token_to_id(EOT)
    dtype = np.uint16 if bk.get_vocab_size() <= np.iinfo(np.uint16).max + 1 else np.int32
    if workers < 1:
        raise ValueError(f"encode_corpus: workers={workers}, expected at least 1")
    chunks = []
    docs = tqdm(iter_documents(corpus_jsonl), desc=f"encode {Path(corpus_jsonl).name}", unit=" docs",
                disable=not progress)

    def batches():
        batch = []
        for doc in docs:
            batch.append(doc["text"])
            if len(batch) == batch_docs:
                yield batch
                batch = []
        if batch:
            yield batch

    if workers == 1:
        chunks.extend(_encode_chunk(batch, eot, dtype, bk) for batch in batches())
    else:  # spawned workers (no fork of a process whose tokenizer threads may be running), at most 4 chunks each
        # in flight, collected in submission order
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_encode_init, initargs=(bk.to_str(),)) as ex:
            pending = deque()
            for batch in batches():
                pending.append(ex.submit(_encode_chunk, batch, eot, dtype))
                if len(pending) >= 4 * workers:
                    chunks.append(pending.popleft().result())
            chunks.extend(f.result() for f in pending)
    with atomic_path(out_path) as t, open(t, "wb") as f:
        np.save(f, np.concatenate(chunks) if chunks else np.zeros(0, dtype))
    return out_path
