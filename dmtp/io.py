"""Artifacts: atomic writes (temp file/dir + rename), one writer per output (`one_writer`), readers that name the file
and line of a bad input, and the meta.json that travels with every result."""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dmtp import RECORDS_REVISION


def _readable(root: Path) -> None:
    """Give `root` and everything under it the modes a plain open / mkdir gives (0644 files, 0755 folders under the
    usual umask 022; executables keep their x bits), whatever wrote them: mkstemp / mkdtemp and safetensors'
    `save_file` create private 0600 / 0700 entries, and artifacts are read by others (a serving process, a
    colleague)."""
    mask = os.umask(0)
    os.umask(mask)
    for p in [root, *root.rglob("*")] if root.is_dir() else [root]:
        if p.is_symlink():
            continue
        full = 0o777 if p.is_dir() or p.stat().st_mode & 0o111 else 0o666
        os.chmod(p, full & ~mask)


class WriteError(OSError):
    """A failed write, named: `<path>: cannot be written (<cause>)`; `errno` kept from the cause."""


def write_error(path, e: OSError) -> WriteError:
    """The error of a failed write that names the file and the cause ("No space left on device"), whatever the
    writer reported (Python's write names no file; torch's zip writer says only "unexpected pos ...")."""
    if isinstance(e, WriteError):
        return e
    cause = e.strerror or (str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
    err = WriteError(f"{path}: cannot be written ({cause})")
    err.errno = e.errno
    return err


def _as_final(e: Exception, tmp, path) -> Exception:
    """A named write failure of temp file / folder `tmp` told as one of `path` (what the user asked to write)."""
    if isinstance(e, WriteError) and str(tmp) in str(e):
        err = WriteError(str(e).replace(str(tmp), str(path)))
        err.errno = e.errno
        return err
    return e


def write_failure(path, e: Exception) -> Exception | None:
    """The error to raise for a failure inside a write of `path`: an OSError that names no file, or a Rust writer's
    I/O error (safetensors: `IoError(Os { ..., message: "No space left on device" })`), as `write_error`; None: `e`
    is no write failure, or names its file already."""
    if isinstance(e, OSError):
        return None if isinstance(e, WriteError) or e.filename is not None or str(path) in str(e) else \
            write_error(path, e)
    text = str(e)
    if "IoError" in text or "No space left" in text:
        return write_error(path, OSError(None, _io_message(text)))
    return None


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temp file path beside `path`; rename onto it only if the block finishes (readable: `_readable`). An
    OSError in the block that names no file (a write's "No space left on device") is raised naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _readable(Path(tmp))
        os.replace(tmp, path)
    except Exception as e:
        named = _as_final(write_failure(path, e) or e, tmp, path)
        if named is e:
            raise
        raise named from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside `path`; it replaces `path` only if the block finishes (readable, with all it
    holds: `_readable`). A write that fails inside it without naming its file is raised naming `path`
    (`write_failure`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        try:
            yield tmp
        except Exception as e:  # a writer's failure inside the folder, named (`write_failure`)
            named = _as_final(write_failure(path, e) or e, tmp, path)
            if named is e:
                raise
            raise named from None
        _readable(tmp)
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path, text: str):
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def write_csv(path, df):
    """A pandas DataFrame as CSV without its index."""
    write_text(path, df.to_csv(index=False))


def write_figure(path, fig, **kw):
    """A matplotlib figure, in the format its suffix names (`savefig`'s keywords in kw)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=Path(path).suffix.lstrip("."), **kw)


def write_jsonl(path, rows):
    """One JSON object a line; a path ending in .gz is written gzip-compressed (reproducibly: no name, no time)."""
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    if str(path).endswith(".gz"):
        with atomic_path(path) as tmp:
            tmp.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    else:
        write_text(path, text)


RECORDS = (".jsonl.gz", ".jsonl")  # a record file, compressed (`compact`) or plain: the longer suffix first


def record_stem(path) -> str | None:
    """A record file's name without .jsonl.gz / .jsonl (None: not a record file)."""
    name = Path(path).name
    return next((name[: -len(x)] for x in RECORDS if name.endswith(x)), None)


def record_meta(path) -> Path:
    """The meta file beside a record file: <stem>.meta.json."""
    return Path(path).with_name(f"{record_stem(path)}.meta.json")


def metas_of(path) -> list[Path]:
    """The meta files a record file may have beside it: <stem>.meta.json (the pipeline's runs, `record_meta`) and
    <file>.meta.json (`dmtp generate --out FILE`), those that exist."""
    return [m for m in dict.fromkeys([record_meta(path), Path(str(path) + ".meta.json")]) if m.exists()]


def check_finished(path) -> dict | None:
    """A stage's record file read as an input: refused (an error naming it) when a meta beside it says
    `finished: false` (the stage was stopped half-way: its records are a prefix of the output). Returns that meta
    (None without one)."""
    meta = None
    for m in metas_of(path):
        meta = read_json(m)
        if isinstance(meta, dict) and meta.get("finished") is False:
            raise ValueError(f"{path}: half-written ({m.name} says finished: false): finish it with the command that "
                             "made it (it resumes), or remove it")
    return meta


def check_decoded(path) -> dict | None:
    """A token JSONL read as training data: `check_finished`, and records of a decode (they hold `accepted`) without
    a meta beside them are refused too (whether that decode finished is unknown). Returns the meta (None without)."""
    meta = check_finished(path)
    first = next(iter_jsonl(path), (0, {}))[1]
    if meta is None and "accepted" in first:
        raise ValueError(f"{path}: decoded records without their meta ({Path(path).name}.meta.json): whether the "
                         "decode finished is unknown; rerun the `dmtp generate` that writes it (it resumes, then marks "
                         "it finished)")
    return meta


def compact(path) -> Path:
    """x.jsonl -> x.jsonl.gz, the same records (read back to check), the plain file removed last."""
    path = Path(path)
    out = path.with_name(path.name + ".gz")
    rows = [r for _, r in iter_jsonl(path)]
    write_jsonl(out, rows)
    if [r for _, r in iter_jsonl(out)] != rows:
        raise OSError(f"{out}: does not read back as {path}")
    path.unlink()
    return out


class Busy(ValueError):
    """Another live process is writing the same output."""


@contextlib.contextmanager
def one_writer(path: str | Path):
    """Hold the lock file `.<name>.lock` beside `path` while the block runs: a second writer of `path` is refused
    (Busy) naming the holder's pid and host. The lock is an flock, which the kernel drops with its holder, so a lock
    file left by a killed process is free again; a released lock file is removed. It is keyed on the file itself,
    `path` resolved (symlinks, `..`, a relative path): two writers reaching one file by different paths are refused
    too; a file with other names (hard links), which no path resolves to, is refused as an output."""
    path = Path(path).resolve()
    if path.is_file() and path.stat().st_nlink > 1:  # another name of this file would take another lock
        raise Busy(f"{path}: a file with {path.stat().st_nlink} names (hard links): a writer through another of them "
                   "would not be refused; give an output of its own (copy the file, or choose another output)")
    lock = path.with_name(f".{path.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "a process that has not named itself yet"
            os.close(fd)
            raise Busy(f"{path}: being written by {holder} (lock {lock}); wait for it to finish or stop it, or choose "
                       "another output") from None
        try:  # the file at the path may have been removed by the holder we waited on: lock the new one
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}".encode())
    try:
        yield
    finally:
        os.unlink(lock)
        os.close(fd)


@contextlib.contextmanager
def merging(path: str | Path):
    """Wait for, then hold, an flock on `.<name>.merge.lock` beside `path`: a short read-modify-write of one output by
    processes that share it (the drafter parts of a GPU: each adds its runs to drafters/meta.json);
    keyed, like `one_writer`, on the resolved path."""
    path = Path(path).resolve()
    lock = path.with_name(f".{path.name}.merge.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock (the file stays: removing it would race a waiting process)


def _lines(f, path):
    """The raw lines of an open record file; a compressed one cut short or not gzip at all is an error naming it."""
    try:
        yield from f
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: not a readable gzip file ({e}): write it again") from None


def _text(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the "
                         "line)") from None


def read_json(path, kind: type | None = dict, where: str | None = None):
    """A JSON file's content, of type `kind` (an object unless told: every file the suite writes is one but a training
    history, a list; None: any); a file that is not UTF-8, not JSON or of another type is an error naming the file
    (`where`: the name to give it, e.g. its place in an archive) and the line."""
    raw, where = Path(path).read_bytes(), where or str(path)
    try:
        out = json.loads(_text(raw, where))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
    if kind is not None and not isinstance(out, kind):
        what = {dict: "a JSON object", list: "a JSON list"}.get(kind, kind.__name__)
        raise ValueError(f"{where}: expected {what}, got {type(out).__name__}")
    return out


def iter_jsonl(path):
    """(line number, object) for every non-blank line of a JSONL file; a line that is not UTF-8 or not a JSON object
    is an error naming the file and the line (1-based, counting blank lines)."""
    with (gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")) as f:
        for i, raw in enumerate(_lines(f, path), 1):
            line = _text(raw, f"{path}:{i}")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not valid JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
            yield i, row


def read_jsonl(path) -> list[dict]:
    return [row for _, row in iter_jsonl(path)]


def append_jsonl(path, rows):
    """Append rows and flush them to disk (a resumable run's progress: lines already written survive a kill); a failed
    write names the file and its cause."""
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    try:
        with open(path, "a") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(path, e) from None


def drop_cut_line(path) -> int:
    """Truncate a record file that a kill left mid-line back to its last newline (its whole lines are the progress a
    resumed run keeps; the cut one is decoded again). Read backwards in 64 KiB blocks: a shard may be large. Returns
    the bytes dropped."""
    block = 1 << 16
    with open(path, "rb+") as f:
        size = pos = f.seek(0, os.SEEK_END)
        while pos > 0:  # back to the last newline
            start = max(0, pos - block)
            f.seek(start)
            k = f.read(pos - start).rfind(b"\n")
            if k >= 0:
                pos = start + k + 1
                break
            pos = start
        if pos < size:
            f.truncate(pos)
    return size - pos


def file_sha256(path) -> str:
    """The sha256 of a file's bytes (a fingerprint records what an input holds, not where it lies)."""
    h, buf = hashlib.sha256(), bytearray(1 << 16)  # read into one buffer: no new bytes object per block
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def save_state(obj, path):
    """torch.save of resumable state, readable by others (`_readable`); a failed write (disk full, ...) is an
    OSError naming the file and its cause. torch writes through a Python file object here: its own file writer
    reports a full disk only as "unexpected pos N vs M", a Python write as "No space left on device". Ctrl-C inside
    the write stays a KeyboardInterrupt (torch reports it as the writer's failure): the file is half-written, and
    callers write to a temp file (`atomic_path`), so the previous state stays in place."""
    import torch

    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
    except OSError as e:
        raise write_error(path, e) from None
    except RuntimeError as e:  # the writer's own report; the OSError beneath it, when there is one, names the cause
        if isinstance(e.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        inner = e.__context__ if isinstance(e.__context__, OSError) else OSError(None, str(e).splitlines()[0][:200])
        raise write_error(path, inner) from None
    _readable(Path(path))


def load_state(path, device, required=()):
    """torch.load of resumable state (pretraining, drafter training) as plain data only (`weights_only=True`:
    tensors, numbers, strings, lists and dicts; nothing a file can hold runs code on loading). A truncated or foreign
    file, a pickled object of any other type, or a state without one of the `required` keys is an error naming the
    file (and the key)."""
    import torch

    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # truncated zip (PytorchStreamReader ...), not a torch file, a forbidden global, ...
        first = str(e).strip().splitlines()
        why = next((x.strip() for x in first if "Unsupported global" in x or "GLOBAL" in x), first[0] if first else "")
        raise ValueError(f"{path}: cannot be read as saved training state ({why[:200]}); only tensors, numbers, "
                         "strings, lists and dicts are loaded from a state file: remove it to restart that training "
                         "from step 0") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: saved training state is a dict, this file holds a {type(state).__name__}; remove it "
                         "to restart that training from step 0")
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"{path}: saved training state without the key(s) {', '.join(map(repr, missing))} (it holds "
                         f"{', '.join(map(repr, sorted(map(str, state))))[:200] or 'nothing'}); remove it to restart "
                         "that training from step 0")
    return state


def save_safetensors(tensors: dict, path):
    """safetensors' save_file, the file readable by others (`_readable`: save_file creates it 0600); a failed write
    (disk full, ...) is an OSError naming the file and its cause."""
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except OSError as e:
        raise write_error(path, e) from None
    except Exception as e:  # SafetensorError: IoError(Os { code: 28, kind: StorageFull, message: "No space ..." })
        raise write_error(path, OSError(None, _io_message(str(e)))) from None
    _readable(Path(path))


def _io_message(text: str) -> str:
    """The cause inside a Rust I/O error's text (`message: "No space left on device"`), else its first line."""
    m = re.search(r'message: "([^"]+)"', text)
    return m.group(1) if m else text.splitlines()[0][:200]


def make_readable(root: str | Path) -> None:
    """Give a written artifact (a file, or a folder and all it holds) the modes a plain open / mkdir gives, whatever
    wrote it (`_readable`): for writers outside this module (`save_pretrained`)."""
    _readable(Path(root))


SOURCE_DIRS = ("dmtp", "experiments")  # the code a result depends on


def source_digest(root: Path | None = None) -> str:
    """sha256 (first 12 hex digits) over the relative paths and bytes of every .py file under `SOURCE_DIRS` and
    pyproject.toml: the same on a git checkout and on a copy of it, so a copy's REVISION can be checked against the
    code that actually ran."""
    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    files = sorted(f for d in SOURCE_DIRS for f in (root / d).rglob("*.py") if "__pycache__" not in f.parts)
    for f in files + [root / "pyproject.toml"]:
        if f.exists():
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def revision_line(root: Path | None = None) -> str:
    """What `make revision` writes to REVISION: the commit (`git_sha`) and the tree's `source_digest`."""
    return f"{git_sha(root)} {source_digest(root)}"


SOURCE_FILES = ("pyproject.toml", "constraints.txt")  # with SOURCE_DIRS: the code and packages a result ran with


def git_sha(root: Path | None = None) -> str:
    """The commit of the code (`-dirty` with uncommitted changes to tracked source files: `SOURCE_DIRS` and
    `SOURCE_FILES`; a run that rewrites tracked results, notes or docs leaves the code it ran as committed). Where
    the tree is a copy without .git (copied to a cluster node, unpacked from an archive): the commit in the REVISION
    file at its root (`make revision` before copying) when the copy's `source_digest` equals the one recorded beside
    it; otherwise the commit with "+changed-<digest>" (the REVISION is older than the code: `make revision` was not
    re-run after a commit), or "unknown" without a REVISION.
    A copy can also carry a .git of another commit than its code (a tree copied over an older checkout): where git
    calls the sources changed and a REVISION's digest equals the tree's, the REVISION's commit is the code's."""
    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    rev = root / "REVISION"
    fields = rev.read_text().split() if rev.exists() else []
    try:
        if (root / ".git").exists():
            sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
            if sha.returncode == 0:
                dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                        *SOURCE_DIRS, *SOURCE_FILES], cwd=root, capture_output=True, text=True,
                                       timeout=5)
                if not dirty.stdout.strip():
                    return sha.stdout.strip()
                if not (len(fields) > 1 and fields[1] == source_digest(root)):
                    return sha.stdout.strip() + "-dirty"
    except Exception:
        pass
    if not fields:
        return "unknown"
    here = source_digest(root)
    if len(fields) > 1 and fields[1] == here:
        return fields[0]
    return f"{fields[0]}+changed-{here}"  # (a one-field REVISION, written before digests: unverifiable)


def environment() -> dict:
    import torch

    # threads and the CPU's vector instruction set: the kernels a CPU result was computed with
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
           "device": "cpu", "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "threads": torch.get_num_threads(), "git_sha": git_sha(), "source_digest": source_digest(),
           "records_revision": RECORDS_REVISION}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception:
        pass
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    from dmtp.compiling import cache_dir

    env["compile_cache"] = cache_dir()  # where torch.compile's caches are, as torch resolves it (`--compile-cache`)
    return env


def write_meta(path, config: dict, wall_s: float | None = None, engine=None, **extra):
    """meta.json beside a result: its configuration, the environment (versions, device, commit and the digest of the
    code that ran (`source_digest`: exact also where a copy's commit is not), the records revision) and, for decoded results, `engine`: the `EngineConfig` that decoded it, as it resolved on this
    machine."""
    meta = {"config": config, "env": environment(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if engine is not None:
        import torch

        meta["engine"] = engine.resolved("cuda" if torch.cuda.is_available() else "cpu")
    if wall_s is not None:
        meta["wall_s"] = round(wall_s, 3)
    meta.update(extra)
    write_json(path, meta)
