"""Artifacts: atomic writes (temp file/dir + rename) and the meta.json that travels with every result."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temp file path beside `path`; rename onto it only if the block finishes (readable: `_readable`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _readable(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside `path`; it replaces `path` only if the block finishes (readable, with all it
    holds: `_readable`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
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


def write_jsonl(path, rows):
    write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def iter_jsonl(path):
    """(line number, object) for every non-blank line of a JSONL file; a line that is not a JSON object is an error
    naming the file and the line (1-based, counting blank lines)."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
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
    """Append rows and flush them to disk (a resumable run's progress: lines already written survive a kill)."""
    with open(path, "a") as f:
        f.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def git_sha() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if sha.returncode == 0 else "unknown"
    except Exception:
        return "unknown"


def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
           "device": "cpu", "git_sha": os.environ.get("DMTP_GIT_SHA") or git_sha()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception:
        pass
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    # the decode and training switches set for this process (engine, compiled drafter, cache write, attention kernel,
    # CUDA graphs, ...): which path made a result is part of its provenance
    switches = {k: v for k, v in sorted(os.environ.items()) if k.startswith("DMTP_") and k != "DMTP_GIT_SHA"}
    if switches:
        env["switches"] = switches
    return env


def write_meta(path, config: dict, wall_s: float | None = None, **extra):
    meta = {"config": config, "env": environment(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if wall_s is not None:
        meta["wall_s"] = round(wall_s, 3)
    meta.update(extra)
    write_json(path, meta)
