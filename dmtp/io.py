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


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temp file path beside `path`; rename onto it only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temp directory beside `path`; it replaces `path` only if the block finishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
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
    """The commit of the code (`-dirty` with uncommitted changes to tracked files); where the tree is a copy without
    .git (a GPU machine's snapshot), the REVISION file at its root that the run scripts write (`make device-prep`)."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                   capture_output=True, text=True, timeout=5)
            return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except Exception:
        pass
    rev = root / "REVISION"
    return rev.read_text().strip() or "unknown" if rev.exists() else "unknown"


def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "platform": platform.platform(),
           "device": "cpu", "git_sha": git_sha(), "threads": torch.get_num_threads()}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception:
        pass
    if torch.cuda.is_available():
        env["device"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def write_meta(path, config: dict, wall_s: float | None = None, engine=None, **extra):
    """meta.json beside a result: its configuration, the environment (versions, device, commit) and, for decoded
    results, `engine`: the `EngineConfig` that decoded it, as it resolved on this machine."""
    meta = {"config": config, "env": environment(), "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if engine is not None:
        import torch

        meta["engine"] = engine.resolved("cuda" if torch.cuda.is_available() else "cpu")
    if wall_s is not None:
        meta["wall_s"] = round(wall_s, 3)
    meta.update(extra)
    write_json(path, meta)
