"""Pretraining corpus: Python source files (`*.py`) from named sources, deterministic and resumable.

    python -c "from dmtp.data import build_corpus; print(build_corpus('/tmp/c', 8_000_000, sources=['stdlib']))"
    python -c "from dmtp.data import build_corpus; build_corpus('/tmp/c', 200_000, roots=['dmtp'])"   # a folder

A source is `stdlib` (the running interpreter's standard library, without its site-packages) or the name of a
distribution (`sympy`: the `*.py` files its RECORD lists), optionally pinned to a version (`stdlib==3.11.7`,
`sympy==1.14.0`; the version compared is the one results record, `torch.__version__` with its local tag). A pinned
distribution is read where it is installed at that version, else from its pure-Python wheel in `wheels_dir()`
(`make wheels`): a wheel's files are the same bytes on every machine, which a Python's standard library is not (a
distribution's build may leave out CPython's test suite). Another version, and no wheel, is refused.
A document's path is `<source>/<path inside it>`, so nothing recorded depends on where Python or the checkout lives.
Output dir: `train.jsonl` / `heldout.jsonl` (one {"path", "sha256", "text"} per line, so document boundaries
survive), `manifest.csv` (path, sha256, bytes, split) and `DONE` (JSON stats with the sources' versions and the
digests of the document lists, written last). Nothing whose path or text mentions HumanEval goes in: that benchmark
is our evaluation set.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import os
import platform
import re
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from dmtp.io import atomic_path, read_json

FILES = ("train.jsonl", "heldout.jsonl", "manifest.csv")
_BANNED = ("human_eval", "humaneval")  # lowercase; matched against paths and document text


@dataclass(frozen=True)
class Source:
    """Where documents come from: `name` labels their paths, `version` is recorded, `files` are (path inside the
    source, key) pairs in sorted order, read through `read` / `size` (a key is an absolute path on disk, or a member of
    a wheel); `origin` says which ("installed", "wheel <file> sha256 <16 hex>", "folder")."""
    name: str
    version: str
    files: tuple[tuple[str, str], ...]
    origin: str = "installed"
    wheel: str = ""  # the wheel file the members are read from ("" : files on disk)

    def read(self, key: str) -> bytes:
        if self.wheel:
            return _zip(self.wheel).read(key)
        return Path(key).read_bytes()

    def size(self, key: str) -> int:
        return _zip(self.wheel).getinfo(key).file_size if self.wheel else os.path.getsize(key)


@functools.lru_cache(maxsize=16)
def _zip(path: str) -> zipfile.ZipFile:
    return zipfile.ZipFile(path)


def _walk(root: str, skip=("site-packages", "dist-packages")) -> tuple[tuple[str, str], ...]:
    """Every `*.py` under `root` (sorted; `__pycache__` and the `skip` folders left out) as (relative, absolute)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__" and x not in skip)
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, root).replace(os.sep, "/"), p))
    return tuple(out)


def wheels_dir() -> Path:
    """Where pinned sources are looked up as wheels when the installed version is another: `$DMTP_WHEELS`, else
    `~/.cache/dmtp/wheels` (`make wheels` downloads the pinned profiles' pure-Python wheels there)."""
    return Path(os.environ.get("DMTP_WHEELS") or Path.home() / ".cache" / "dmtp" / "wheels").expanduser()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_version(name: str, dist=None) -> str:
    """The version results record for an installed distribution: its import package's `__version__` where it has
    one (torch's `2.11.0+cu130`, local tag included, where the distribution's metadata may say `2.11.0`), else the
    distribution's metadata version."""
    import importlib
    import importlib.metadata as md

    dist = dist or md.distribution(name)
    tops = [t.strip() for t in (dist.read_text("top_level.txt") or "").split() if t.strip()] or [_norm(name)]
    for top in tops[:1]:
        try:
            v = getattr(importlib.import_module(top), "__version__", None)
        except Exception:  # noqa: BLE001 - a package that cannot be imported here: its metadata says
            v = None
        if isinstance(v, str) and v:
            return v
    return dist.version


def _wheel_files(path: Path) -> tuple[tuple[str, str], ...]:
    """The `*.py` members of a wheel as (path once installed, member), sorted: `<dist>.data/purelib|platlib/` mapped
    to the installed root, the metadata folders and other `.data` parts (scripts, headers) left out."""
    out = []
    for m in _zip(str(path)).namelist():
        rel = m
        head = m.split("/", 1)[0]
        if head.endswith(".data"):
            parts = m.split("/", 2)
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            rel = parts[2]
        elif head.endswith(".dist-info"):
            continue
        if rel.endswith(".py") and "__pycache__" not in rel and ".." not in rel.split("/"):
            out.append((rel, m))
    return tuple(sorted(out))


def _wheel_source(name: str, pin: str, folder: Path) -> Source | None:
    """The pure-Python wheel of `name==pin` in `folder`, or None; a wheel of that name and version that is not pure
    Python (another platform's files) is refused."""
    if not folder.is_dir():
        return None
    found = sorted(p for p in folder.glob("*.whl")
                   if len(parts := p.name[:-4].split("-")) >= 5 and _norm(parts[0]) == _norm(name) and parts[1] == pin)
    if not found:
        return None
    pure = [p for p in found if p.name.endswith("-none-any.whl")]
    if not pure:
        raise ValueError(f"corpus source {name}=={pin}: {found[0]} is built for one platform; the corpus reads pure-"
                         "Python wheels (py3-none-any) only, whose files are the same on every machine")
    path = pure[0]
    h = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return Source(name, pin, _wheel_files(path), origin=f"wheel {path.name} sha256 {h}", wheel=str(path))


def resolve_source(spec: str, wheels: Path | None = None) -> Source:
    """`stdlib` or a distribution's name, optionally `==version`. Unpinned: what is installed. Pinned: the installed
    distribution if its recorded version (`installed_version`) is the pin, else the pure-Python wheel of that version
    in `wheels` (default `wheels_dir()`: the same files on every machine), else refused."""
    import importlib.metadata as md

    name, _, pin = spec.partition("==")
    name, pin = name.strip(), pin.strip()
    if name == "stdlib":
        version = platform.python_version()
        src = Source(name, version, _walk(os.path.realpath(sysconfig.get_paths()["stdlib"])))
    else:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            dist = None
        version = installed_version(name, dist) if dist is not None else None
        if dist is None or (pin and version != pin):
            folder = wheels if wheels is not None else wheels_dir()
            if pin and (src := _wheel_source(name, pin, folder)) is not None:
                return src
            have = f"{version} is installed" if dist is not None else f"no distribution {name!r} is installed"
            raise ValueError(f"corpus source {spec!r}: {have}" + (f", and {folder} holds no pure-Python wheel of it"
                             if pin else "") + ": " + (f"python -m pip download --no-deps --only-binary=:all: "
                             f"{name}=={pin} -d {folder} (or `make wheels`) gives the pinned files, the same on every "
                             "machine; or build another corpus: data.corpus_sources with it unpinned and no pinned "
                             "digest (--set data.corpus_digest=)" if pin else f"install {name}"))
        listed = sorted(str(f) for f in (dist.files or ()) if str(f).endswith(".py") and ".." not in Path(f).parts)
        src = Source(name, version, tuple((f, str(dist.locate_file(f))) for f in listed if "__pycache__" not in f))
    if pin and pin != src.version:
        raise ValueError(f"corpus source {spec!r}: {src.version} is installed (Python's version for stdlib); the pinned "
                         f"corpus needs {pin} (another version gives another corpus, so other results): "
                         f"install the pinned one, or build another corpus: data.corpus_sources with {name!r} "
                         "unpinned, and no pinned digest (--set data.corpus_digest=)")
    return src


def _folder_source(root: str) -> Source:
    """A folder as a source: its `*.py` files, labelled by the folder's name."""
    root = os.path.realpath(root)
    return Source(os.path.basename(root.rstrip(os.sep)) or "root", "", _walk(root, skip=()), origin="folder")


def banned(s: str) -> bool:
    s = s.lower()
    return any(b in s for b in _BANNED)


def repeated_fraction(text: str, min_chars: int = 8) -> float:
    r"""The share of a file's characters in lines that repeat an earlier line: its lines of at least `min_chars`
    characters once stripped (short lines such as `return`, `else:` or `)` repeat in any code), counting each
    repeat after the first. Generated tables, vendored data and templated tests score high (pip's chardet language
    models: 0.85); hand-written modules low. The document-level repetition filter of Gopher (Rae et al. 2021,
    "duplicate line character fraction") applied to code.
    >>> repeated_fraction("x = compute(1)\nx = compute(1)\ny = compute(2)\n")
    0.3333333333333333
    """
    seen, total, repeated = set(), 0, 0
    for line in text.splitlines():
        line = line.strip()
        if len(line) < min_chars:
            continue
        total += len(line)
        if line in seen:
            repeated += len(line)
        seen.add(line)
    return repeated / total if total else 0.0


def _split(sha: str, heldout_frac: float) -> str:
    # the split is a pure function of the content hash: stable across machines, roots and max_bytes
    return "heldout" if int(sha[:8], 16) % 10000 < heldout_frac * 10000 else "train"


def _scan(sources: list[Source], max_file_bytes: int, progress: bool, max_repeat: float = 1.0):
    """Hash every eligible file of `sources` -> ({sha256: (source index, path, key, bytes)}, skip counts);
    of identical files the first (in source order, then path order) is kept."""
    by_hash, skipped = {}, {"too_big": 0, "not_utf8": 0, "humaneval": 0, "duplicate": 0, "empty": 0, "repetitive": 0}
    bar = tqdm(desc="scan *.py", unit=" files", disable=not progress)
    for k, src in enumerate(sources):
        for rel, p in src.files:
            bar.update()
            path = f"{src.name}/{rel}"
            if banned(path):
                skipped["humaneval"] += 1
                continue
            try:
                size = src.size(p)
                if size > max_file_bytes:
                    skipped["too_big"] += 1  # generated tables, vendored test data
                    continue
                raw = src.read(p)
            except (OSError, KeyError):
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not_utf8"] += 1
                continue
            if not text.strip():
                skipped["empty"] += 1
                continue
            if banned(text):
                skipped["humaneval"] += 1
                continue
            if max_repeat < 1 and repeated_fraction(text) > max_repeat:
                skipped["repetitive"] += 1  # a model trained on tables learns to repeat lines
                continue
            sha = hashlib.sha256(raw).hexdigest()
            if sha in by_hash:
                skipped["duplicate"] += 1
            else:
                by_hash[sha] = (k, path, p, len(raw))
    bar.close()
    return by_hash, skipped


def digest(shas) -> str:
    """The digest of a document list: sha256 over the documents' hashes in file (hash) order, 16 hex digits. Two
    corpora with the same digest hold the same text."""
    h = hashlib.sha256()
    for sha in shas:
        h.update(sha.encode())
    return h.hexdigest()[:16]


def _write(out_dir: Path, docs, heldout_frac: float, config: dict, extra: dict, progress: bool) -> dict:
    """Write (path, sha256, text) docs into the two JSONL splits + manifest, atomically, then the DONE marker."""
    stats = {"n_train": 0, "n_heldout": 0, "train_bytes": 0, "heldout_bytes": 0}
    shas = {"train": [], "heldout": []}  # the documents' hashes, in file order: the digests
    with contextlib.ExitStack() as stack:
        tmp = {name: stack.enter_context(atomic_path(out_dir / name)) for name in FILES}
        # the handles close (LIFO) before any temp file is renamed into place
        fh = {name: stack.enter_context(open(tmp[name], "w", encoding="utf-8", newline="")) for name in FILES}
        manifest = csv.writer(fh["manifest.csv"])
        manifest.writerow(["path", "sha256", "bytes", "split"])
        for path, sha, text in tqdm(docs, desc="write corpus", unit=" docs", disable=not progress):
            split, nbytes = _split(sha, heldout_frac), len(text.encode("utf-8"))
            row = {"path": path, "sha256": sha, "text": text}
            fh[f"{split}.jsonl"].write(json.dumps(row, ensure_ascii=False) + "\n")
            manifest.writerow([path, sha, nbytes, split])
            stats[f"n_{split}"] += 1
            stats[f"{split}_bytes"] += nbytes
            shas[split].append(sha)
    # which documents, in which order: two corpora with the same digest hold the same text (another version of a
    # source gives another corpus, and with it another target)
    stats.update({f"{k}_digest": digest(v) for k, v in shas.items()})
    done = {"config": config, **stats, **extra}
    with atomic_path(out_dir / "DONE") as t:
        t.write_text(json.dumps(done, indent=2) + "\n")
    return done


def _resume(out_dir: Path, config: dict) -> dict | None:
    if not (out_dir / "DONE").exists() or not all((out_dir / f).exists() for f in FILES):
        return None
    done = read_json(out_dir / "DONE")
    if done.get("config") != config:
        raise ValueError(f"{out_dir} holds a corpus built with {done.get('config')}, not {config}; "
                         f"delete it or choose another out_dir")
    return done


def _result(out_dir: Path, done: dict, resumed: bool) -> dict:
    return {**done, "out_dir": str(out_dir), "train": str(out_dir / "train.jsonl"),
            "heldout": str(out_dir / "heldout.jsonl"), "manifest": str(out_dir / "manifest.csv"), "resumed": resumed}


def build_corpus(out_dir, max_bytes: int, max_file_bytes: int = 200_000, heldout_frac: float = 0.02,
                 roots=None, progress=True, max_repeat: float = 1.0, sources=None, expect_digest: str = "") -> dict:
    """Collect the `*.py` files of `sources` (default `["stdlib"]`; see the module docstring), or of the folders
    `roots`, into `out_dir`; returns stats and paths.

    Files are de-duplicated by sha256 of content and visited source by source, each in sorted hash order, so which
    files fill the `max_bytes` budget (UTF-8 bytes of text) is deterministic and depends only on the sources' files.
    Skips non-UTF-8 files, files over `max_file_bytes`, files whose `repeated_fraction` exceeds `max_repeat` (1:
    none), and anything mentioning HumanEval. `expect_digest` (16 hex digits): the train digest the sources must give,
    checked before anything is written (and on resume). If `out_dir` already holds a finished corpus (a `DONE`
    marker) built with the same settings it is returned untouched (`"resumed": True`); different settings raise.
    """
    out_dir = Path(out_dir)
    if roots is not None and sources is not None:
        raise ValueError("build_corpus: give sources or roots, not both")
    specs = list(sources) if sources is not None else (None if roots is not None else ["stdlib"])
    config = {"source": "python-files", "max_bytes": max_bytes, "max_file_bytes": max_file_bytes,
              "heldout_frac": heldout_frac, **({"max_repeat": max_repeat} if max_repeat < 1 else {}),
              **({"sources": specs} if specs is not None else {})}
    if (done := _resume(out_dir, config)) is not None:
        _check_digest(done.get("train_digest"), expect_digest, done.get("sources"), out_dir)
        return _result(out_dir, done, resumed=True)
    srcs = [resolve_source(s) for s in specs] if specs is not None else [_folder_source(r) for r in roots]
    by_hash, skipped = _scan(srcs, max_file_bytes, progress, max_repeat)
    chosen, total = [], 0
    for sha in sorted(by_hash, key=lambda s: (by_hash[s][0], s)):  # source by source, each in hash order
        nbytes = by_hash[sha][3]
        if total + nbytes > max_bytes:
            continue  # a smaller file further on may still fit
        chosen.append(sha)
        total += nbytes
    chosen.sort()  # written in hash order
    recorded = [{"name": s.name, "version": s.version} for s in srcs]
    _check_digest(digest(s for s in chosen if _split(s, heldout_frac) == "train"), expect_digest, recorded, out_dir)
    docs = ((by_hash[s][1], s, srcs[by_hash[s][0]].read(by_hash[s][2]).decode("utf-8")) for s in chosen)
    extra = {"sources": recorded, "origins": {s.name: s.origin for s in srcs}, "roots": [s.name for s in srcs], "n_candidates": len(by_hash), "skipped": skipped,
             "stdlib_only": all(srcs[by_hash[s][0]].name == "stdlib" for s in chosen)}
    return _result(out_dir, _write(out_dir, docs, heldout_frac, config, extra, progress), resumed=False)


def _check_digest(got: str | None, want: str, sources, out_dir) -> None:
    if want and got != want:
        names = ", ".join(f"{s['name']} {s['version']}".strip() for s in sources or [])
        raise ValueError(f"{out_dir}: the corpus from {names or 'its sources'} has train digest {got}, not the pinned "
                         f"data.corpus_digest {want}: these source files differ from the ones the profile pins (its "
                         "results were made from that corpus); use the pinned sources, or --set data.corpus_digest= "
                         "to build this other corpus")


def iter_documents(path):
    """Yield the {"path", "sha256", "text"} dicts of a corpus JSONL file, one document at a time."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def from_hf_dataset(name: str, split: str, text_field: str, out_dir, max_bytes: int | None = None,
                    heldout_frac: float = 0.02, data_files=None, progress=True) -> dict:
    """Same output as `build_corpus`, from `datasets.load_dataset(name, split=split)[text_field]`.

    Documents are taken in dataset order (streamed), de-duplicated by sha256, HumanEval mentions dropped, until
    `max_bytes`. Offline, use a local copy: `from_hf_dataset('json', 'train', 'content', out, data_files='x.jsonl')`.
    """
    out_dir = Path(out_dir)
    config = {"source": f"hf:{name}:{split}:{text_field}:{data_files}", "max_bytes": max_bytes,
              "heldout_frac": heldout_frac}
    if (done := _resume(out_dir, config)) is not None:
        return _result(out_dir, done, resumed=True)
    import datasets

    try:
        ds = datasets.load_dataset(name, split=split, data_files=data_files, streaming=True)
    except Exception as e:
        raise RuntimeError(
            f"could not load dataset {name!r} (split {split!r}): {type(e).__name__}: {e}\n"
            f"No hub access? Copy the data here and load it locally: from_hf_dataset('json', {split!r}, "
            f"{text_field!r}, out_dir, data_files='path/to/{name.split('/')[-1]}.jsonl') (that is "
            f"datasets.load_dataset('json', data_files=...)), or use build_corpus(out_dir, max_bytes).") from e

    def docs():
        seen, total = set(), 0
        for i, row in enumerate(ds):
            text = row[text_field]
            if not text or not text.strip() or banned(text):
                continue
            raw = text.encode("utf-8")
            sha = hashlib.sha256(raw).hexdigest()
            if sha in seen:
                continue
            if max_bytes is not None and total + len(raw) > max_bytes:
                break
            seen.add(sha)
            total += len(raw)
            yield f"{name}/{split}/{i}", sha, text

    return _result(out_dir, _write(out_dir, docs(), heldout_frac, config, {}, progress), resumed=False)


def corpus_summary(out_dir: Path) -> dict:
    """What a target was trained on, for its meta file: documents and bytes per split, the sources they came from
    (name and version) and the digests of their document lists (corpora built before the digests: none)."""
    done_path = Path(out_dir) / "DONE"
    if not done_path.exists():
        return {}
    done = read_json(done_path)
    keys = ("n_train", "n_heldout", "train_bytes", "heldout_bytes", "train_digest", "heldout_digest", "sources",
            "origins", "roots", "stdlib_only")
    return {k: done[k] for k in keys if k in done}

