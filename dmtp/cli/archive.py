"""A run's results as one archive, and landing it on another machine.

    dmtp pipeline --profile mini --deadline 3300 --archive /shared/mini.tgz   # packs results/<folder> after each stage
    dmtp land /shared/mini.tgz [--results results] [--partial]               # here: the archive into results/

The archive is a gzipped tar of `results/<folder>` (`<profile>` or `<profile>/r<k>`) holding `pipeline.json`, the
state of the run that packed it. It is rewritten whole after every stage, so a job killed at its time limit leaves
the archive of its last finished stage. `land` copies the folder into `results/` where no folder of that name exists
(a landed run is never overwritten), gzips its records and renders its REPORT.md. An unfinished run is refused
unless `--partial`, which lands it as `<profile>/partial/...`, where the pooled report never reads it.
"""
from __future__ import annotations

import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from dmtp.checks import require
from dmtp.cli.args import out_dir
from dmtp.io import atomic_dir, atomic_path, compact, read_json

STATUS = "pipeline.json"  # the run's state, inside the packed folder


def pack(results: Path, folder: str, archive: Path) -> Path:
    """`results/<folder>` -> `archive` (tar.gz, members under `<folder>`), replaced whole or not at all."""
    src = Path(results) / folder
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: nothing to pack (no results folder)")
    with atomic_path(archive) as tmp:
        with tarfile.open(tmp, "w:gz") as t:
            t.add(src, arcname=folder, filter=lambda m: None if Path(m.name).name.startswith(".") else m)
    return Path(archive)


def _safe_members(t: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """Every member of a results archive: plain files and folders under one relative top folder."""
    out = []
    for m in t.getmembers():
        p = Path(m.name)
        if p.is_absolute() or ".." in p.parts or not (m.isfile() or m.isdir()):
            raise ValueError(f"{archive}: member {m.name!r} is not a plain file or folder under a relative path; "
                             "expected an archive written by `dmtp pipeline --archive`")
        out.append(m)
    return out


def _status_folder(root: Path, archive: Path) -> tuple[str, dict]:
    """(folder, state) of the one packed run under `root` (its `pipeline.json`)."""
    found = sorted(root.rglob(STATUS))
    require(len(found) == 1, f"{archive}: holds {len(found)} {STATUS} files; expected one (an archive written by "
                             "`dmtp pipeline --archive`)")
    inside = found[0].relative_to(root).as_posix()
    folder = found[0].parent.relative_to(root).as_posix()
    if not re.fullmatch(r"[^/]+(/r\d+)?", folder) or folder.split("/")[0] in (".", "partial"):
        raise ValueError(f"{archive}: {inside}: expected {STATUS} inside the run's folder, <profile>/{STATUS} or "
                         f"<profile>/r<k>/{STATUS} (as `dmtp pipeline --archive` packs it)")
    state = read_json(found[0], where=f"{archive}: {inside}")
    if state.get("folder") != folder:
        raise ValueError(f"{archive}: {STATUS} names folder {state.get('folder')!r} but lies in {folder!r}")
    missing = state.get("missing", [])
    if not isinstance(state.get("finished"), bool) or not (isinstance(missing, list)
                                                            and all(isinstance(m, str) for m in missing)):
        raise ValueError(f"{archive}: {inside}: finished={state.get('finished')!r}, missing={missing!r}: expected "
                         "true or false, and a list of stage names")
    return folder, state


def _destination(results: Path, name: str, run: Path) -> Path:
    """results/<name>, where the run may land: every folder on the way a folder (or a symlink to one), and the
    destination new, or holding only `partial/` (a run packed as `<profile>` lands beside its partial landings)."""
    dest = results / name
    for q in [results / Path(*Path(name).parts[:i]) for i in range(1, len(Path(name).parts) + 1)]:
        if q.is_symlink() and not q.exists():
            raise ValueError(f"{q}: a symlink to {os.readlink(q)}, which does not exist: remove it, or make it the "
                             "folder it names, before landing there")
        require(not q.exists() or q.is_dir(), f"{q}: is a file; expected a folder to land the run in")
    if dest.exists():
        held = {p.name for p in dest.iterdir() if not p.name.startswith(".")}
        if not held <= {"partial"} or (run / "partial").exists():
            raise FileExistsError(f"{dest} exists: a landed run is never overwritten (move it away first)")
    return dest


def land(archive: Path, results: Path, partial: bool = False, report: bool = True, log=print) -> Path:
    """Land a packed run into `results` (see the module docstring); returns the folder it landed in."""
    archive, results = Path(archive), Path(results)
    if not archive.is_file():
        raise FileNotFoundError(f"{archive}: no such archive")
    out_dir(results, "--results")  # a file there, or no right to write: named before anything is unpacked
    with tempfile.TemporaryDirectory(dir=results.parent if results.parent.exists() else None) as tmp:
        try:
            with tarfile.open(archive, "r:gz") as t:
                t.extractall(tmp, members=_safe_members(t, archive), filter="data")
        except (tarfile.TarError, EOFError, OSError) as e:
            raise ValueError(f"{archive}: not a readable tar.gz ({e})") from None
        folder, state = _status_folder(Path(tmp), archive)
        dest_name = folder
        if not state.get("finished"):
            missing = ", ".join(state.get("missing", [])) or "unknown"
            require(partial, f"{archive}: its run had not finished (stages left: {missing}); rerun the pipeline "
                             "to finish it, or land it apart with --partial")
            profile, _, rest = folder.partition("/")
            dest_name = f"{profile}/partial/{rest or 'r0'}"
        src = Path(tmp) / folder
        dest = _destination(results, dest_name, src)
        # into the folder of this run's earlier partial landings: beside them, entry by entry
        for entry, to in [(e, dest / e.name) for e in sorted(src.iterdir())] if dest.is_dir() else [(src, dest)]:
            if entry.is_dir():
                with atomic_dir(to) as staged:
                    shutil.copytree(entry, staged, dirs_exist_ok=True)
            else:
                with atomic_path(to) as staged:
                    shutil.copy2(entry, staged)
    plain = sorted(p for d in ("runs", "curve", "verify") for p in (dest / d).glob("**/*.jsonl"))
    for p in plain:
        compact(p)
    log(f"[land] {archive} -> {dest} ({len(plain)} record files gzipped; "
        f"{'finished' if state.get('finished') else 'unfinished: stages left ' + ', '.join(state.get('missing', []))})")
    if report and (dest / "runs").is_dir():
        from dmtp.analysis.report import render_report

        render_report(dest.relative_to(results).as_posix(), results)
        log(f"[land] {dest / 'REPORT.md'}")
    return dest
