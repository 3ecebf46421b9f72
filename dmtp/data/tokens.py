"""On-policy training tokens as a memory-mapped store: what `dmtp train` reads, each rank only its rows.

A store is a folder:

    tokens.bin     every sequence's token ids back to back, little-endian uint16 (vocabulary <= 65,536) or uint32
    offsets.npy    int64 [n + 1]: sequence i is tokens[offsets[i]:offsets[i + 1]]
    store.json     {"format": 1, "dtype", "sequences", "tokens", "max_id", "vocab_size", "source": {name, sha256},
                    "tokens_sha256", "offsets_sha256", "env": {path, git_sha}}: the source JSONL's digest names the
                    data, tokens.bin's and offsets.npy's the store as converted (one changed since is refused, or
                    converted again where it is `store_of`'s), `env` where and by what code

`convert` writes it from the `dmtp generate` JSONL (`prompt_ids` + `output_ids`, or `ids`) in one streaming pass
(never the whole file in memory), atomically; a generate output whose meta says it did not finish is refused.
`open_store` maps it: the per-sequence lengths come from the offsets (8 bytes per sequence), a sequence's ids are
read from the map only when a batch asks for them. `TokenSequences` (a store) and `ListSequences` (token lists
in memory, as `load_sequences` reads a JSONL) give `batches` the same two things, so both yield the same batches for
the same seed.

    python -m dmtp.data.tokens runs/tiny/data/train.jsonl runs/tiny/data/train.tokens   # convert (tiny: seconds)
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dmtp.io import atomic_dir, check_decoded, file_sha256, git_sha, iter_jsonl, read_json, write_json

FORMAT = 1
STORE_FILE = "store.json"


def sequence_ids(path, i: int, r: dict, vocab_size: int | None) -> list:
    """The token ids of one JSONL line (`ids`, or `prompt_ids` + `output_ids`), checked: a line without them, with
    non-integers or with ids outside [0, vocab_size) is an error naming the file and line."""
    if "ids" in r:
        ids = r["ids"]
    elif "prompt_ids" in r and "output_ids" in r:
        ids = list(r["prompt_ids"]) + list(r["output_ids"])
    else:
        raise ValueError(f"{path}:{i}: expected `ids`, or `prompt_ids` and `output_ids` (token id lists)")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{path}:{i}: token ids must be a list of integers")
    bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
    if bad:
        raise ValueError(f"{path}:{i}: token id {bad[0]} outside the target's vocabulary [0, {vocab_size})")
    return ids


def is_store(path) -> bool:
    return (Path(path) / STORE_FILE).is_file()


def convert(src, dst, vocab_size: int | None = None, sha256: str | None = None) -> Path:
    """The JSONL `src` as a store at `dst` (written atomically; ids checked against vocab_size). sha256: the
    source's digest when the caller has it (else computed). Returns dst."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"training token file {src} does not exist")
    check_decoded(src)
    dtype = np.dtype("<u2") if vocab_size is not None and vocab_size <= 2 ** 16 else np.dtype("<u4")
    offsets, n_tok, max_id, digest = [0], 0, -1, hashlib.sha256()
    with atomic_dir(dst) as tmp:
        with open(tmp / "tokens.bin", "wb") as f:
            for i, r in iter_jsonl(src):
                ids = sequence_ids(src, i, r, vocab_size)
                if ids:
                    a = np.asarray(ids, dtype=np.int64)
                    if a.max() >= 2 ** (8 * dtype.itemsize):
                        raise ValueError(f"{src}:{i}: token id {int(a.max())} does not fit {dtype.name} (give "
                                         "the target's vocab_size)")
                    max_id = max(max_id, int(a.max()))
                    raw = a.astype(dtype).tobytes()
                    f.write(raw)
                    digest.update(raw)
                n_tok += len(ids)
                offsets.append(n_tok)
        if len(offsets) == 1:
            raise ValueError(f"{src} holds no sequence")
        np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
        write_json(tmp / STORE_FILE, {"format": FORMAT, "dtype": dtype.str, "sequences": len(offsets) - 1,
                                      "tokens": n_tok, "max_id": max_id, "vocab_size": vocab_size,
                                      "source": {"name": src.name, "sha256": sha256 or file_sha256(src)},
                                      "tokens_sha256": digest.hexdigest(),
                                      "offsets_sha256": file_sha256(tmp / "offsets.npy"),
                                      "env": {"path": str(src.resolve()), "git_sha": git_sha()}})
    return dst


@dataclass
class Store:
    """An open store: the token map and the offsets (both memory-mapped: nothing is read until asked)."""
    path: Path
    tokens: np.ndarray  # memmap [tokens] of the store's dtype
    offsets: np.ndarray  # memmap [sequences + 1] int64
    meta: dict
    vocab_size: int | None = None  # the target's vocabulary the ids were checked against (None: unchecked)


def open_store(path, vocab_size: int | None = None) -> Store:
    """Map the store at `path`; a missing or damaged store, or ids beyond vocab_size, is a one-line error."""
    path = Path(path)
    if not is_store(path):
        raise FileNotFoundError(f"{path}: not a token store ({STORE_FILE} missing)")
    meta = read_json(path / STORE_FILE)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path}/{STORE_FILE}: format {meta.get('format') if isinstance(meta, dict) else None!r}, "
                         f"expected {FORMAT}")
    fields = {"sequences": int, "tokens": int, "max_id": int, "dtype": str, "source": dict}
    bad = [k for k, t in fields.items() if not isinstance(meta.get(k), t) or isinstance(meta.get(k), bool)]
    if bad or not isinstance(meta["source"].get("sha256"), str) or meta["dtype"] not in ("<u2", "<u4"):
        raise ValueError(f"{path}/{STORE_FILE}: damaged token store (fields {bad or ['source.sha256', 'dtype']} "
                         "missing or of another type; expected integers sequences, tokens, max_id, dtype '<u2' or "
                         "'<u4', source {name, sha256}): convert it again with `python -m dmtp.data.tokens`")
    try:
        offsets = np.load(path / "offsets.npy", mmap_mode="r", allow_pickle=False)
        dtype = np.dtype(meta["dtype"])
        size = (path / "tokens.bin").stat().st_size
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: damaged token store ({type(e).__name__}: {e})") from None
    if offsets.ndim != 1 or len(offsets) != meta["sequences"] + 1 or int(offsets[-1]) != meta["tokens"] or \
            size != meta["tokens"] * dtype.itemsize or int(offsets[0]) != 0 or bool((np.diff(offsets) < 0).any()):
        raise ValueError(f"{path}: damaged token store (offsets.npy, tokens.bin and {STORE_FILE} disagree: "
                         f"{len(offsets) - 1} sequences, {size} bytes, {STORE_FILE} says {meta['sequences']} "
                         f"sequences, {meta['tokens']} tokens; the offsets must rise from 0)")
    made_for = meta.get("vocab_size")
    if vocab_size is not None and made_for is not None and made_for != vocab_size:
        raise ValueError(f"{path}: a token store converted for a vocabulary of {made_for} ({STORE_FILE} vocab_size), "
                         f"the target's is {vocab_size}: its ids are another tokenizer's (on-policy data comes from "
                         "the target it trains for)")
    if vocab_size is not None and meta["max_id"] >= vocab_size:
        raise ValueError(f"{path}: token id {meta['max_id']} outside the target's vocabulary [0, {vocab_size})")
    why = changed(path, meta)
    if why:
        raise ValueError(f"{why}: convert it again with `python -m dmtp.data.tokens`")
    tokens = np.memmap(path / "tokens.bin", dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    return Store(path, tokens, offsets, meta, vocab_size)


_VERIFIED: set = set()  # tokens.bin files (path, size, mtime) found as converted, in this process: hashed once


def changed(path: Path, meta: dict) -> str | None:
    """Why the store's tokens.bin or offsets.npy is not what `convert` wrote (its sha256 against store.json's
    `tokens_sha256`, `offsets_sha256`), None when both are (or the store predates the record)."""
    for name, key in (("tokens.bin", "tokens_sha256"), ("offsets.npy", "offsets_sha256")):
        want = meta.get(key)
        if want is None:
            continue
        f = Path(path) / name
        st = f.stat()
        seen = (str(f.resolve()), st.st_size, st.st_mtime_ns)
        if seen not in _VERIFIED:
            if file_sha256(f) != want:
                return f"{f}: changed after conversion (its sha256 is not {STORE_FILE}'s {key})"
            _VERIFIED.add(seen)
    return None


class ListSequences:
    """Token lists held in memory (a JSONL read whole): `lengths` and the `rows` of a batch."""

    def __init__(self, seqs: list[list[int]]):
        self.seqs = seqs
        self._lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))

    def __len__(self):
        return len(self.seqs)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def rows(self, idx) -> list:
        return [self.seqs[j] for j in idx]


class TokenSequences:
    """A store's sequences of at least `min_len` tokens, each cut to `max_len` (as `load_sequences` cuts a JSONL's):
    the lengths in memory (8 bytes a sequence, plus the kept sequences' index), the ids read from the map by `rows`."""

    def __init__(self, store: Store, max_len: int, min_len: int = 4):
        full = np.diff(np.asarray(store.offsets))
        self.store = store
        self.keep = np.flatnonzero(full >= min_len)
        self._lengths = np.minimum(full[self.keep], max_len)

    def __len__(self):
        return len(self.keep)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def rows(self, idx) -> list:
        out, st = [], self.store
        for j in idx:
            start = int(st.offsets[self.keep[j]])
            row = st.tokens[start: start + int(self._lengths[j])]
            # the ids as read, against the vocabulary (store.json's max_id says what convert saw, not what is there
            # now): an id the embedding cannot hold is named here, not a device-side assert inside the forward
            if st.vocab_size is not None and len(row) and int(row.max()) >= st.vocab_size:
                raise ValueError(f"{st.path}: sequence {int(self.keep[j])} holds token id {int(row.max())} outside "
                                 f"the target's vocabulary [0, {st.vocab_size}), while {STORE_FILE} says max_id "
                                 f"{st.meta['max_id']}: tokens.bin was changed after conversion; convert it again")
            out.append(row)
        return out


def store_of(src, dst, vocab_size: int | None = None, sha256: str | None = None) -> Path:
    """The token JSONL `src` as the store `dst`, converted once (`convert`) and reused while it was made from the same
    file (its source sha256, `sha256` when the caller has it); under torchrun rank 0 converts and the others wait at
    a barrier, then map the same files."""
    from dmtp.dist import barrier, is_main

    dst = Path(dst)
    if is_main():
        sha = sha256 or file_sha256(src)
        if not _reusable(dst, sha):
            convert(src, dst, vocab_size, sha256=sha)
    barrier()
    return dst


def _reusable(dst: Path, sha: str) -> bool:
    """Whether the store `dst` (`store_of`'s own) holds the conversion of the JSONL of digest `sha`, its tokens.bin
    as written; a store.json that is unreadable, lacks a field or names another source: converted again."""
    try:
        meta = read_json(dst / STORE_FILE) if is_store(dst) else None
    except ValueError:
        return False
    return isinstance(meta, dict) and isinstance(meta.get("source"), dict) and meta["source"].get("sha256") == sha \
        and isinstance(meta.get("tokens_sha256"), str) and changed(dst, meta) is None


def as_sequences(seqs):
    """`batches`' view of its input: a store's or a list's sequences as they are, token lists wrapped."""
    return seqs if isinstance(seqs, (ListSequences, TokenSequences)) else ListSequences(list(seqs))


def main(argv=None) -> int:
    """python -m dmtp.data.tokens SRC.jsonl DST [VOCAB_SIZE]"""
    a = sys.argv[1:] if argv is None else argv
    if len(a) not in (2, 3):
        print(main.__doc__, file=sys.stderr)
        return 2
    try:
        dst = convert(a[0], a[1], int(a[2]) if len(a) == 3 else None)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    m = read_json(Path(dst) / STORE_FILE)
    print(f"{dst}: {m['sequences']} sequences, {m['tokens']} tokens ({m['dtype']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
