"""Stage fingerprints: every stage output records the configuration that produced it, and finished (or half-done)
work is reused only for the same configuration.

A fingerprint is the JSON form of the settings that determine an output (its stage's and those of the stages it
reads), without run control. It is recorded under the key "fingerprint" in `<folder>/fingerprint.json` for a folder
output, in the `.meta.json` beside a file output (written before the file).

    u = Unit("work/smoke/target", want, record=Path("work/smoke/target/fingerprint.json"), outputs=[...])
    check(u, force)     # False: nothing there; True: there, same configuration (skip / resume);
                        # differs: StageMismatch naming the fields, or with force the outputs are removed (False)
    record(u)           # before the work starts (a half-done output is tagged too)

An output without a fingerprint (made before them) is kept, with a note; an unreadable record is an error.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path

from dmtp.checks import require
from dmtp.dist import barrier, is_main
from dmtp.io import read_json, write_json

# how a run is cut into pieces, logged and executed (compiled, fused, sharded, recomputed, micro-batched: the same
# math), not what it makes
RUN_CONTROL = ("stop_after", "save_every", "log_every", "compile", "fused_ce", "ce_chunk", "one_region", "fsdp",
               "shard_target", "activation_checkpointing", "micro_batch", "grad_sync", "kernels")


class StageMismatch(ValueError):
    pass


def fingerprint(obj, drop=RUN_CONTROL):
    """JSON-normal form of a config: dataclasses and dicts -> dicts (minus `drop` keys), tuples -> lists, other
    objects (paths) -> str."""
    if is_dataclass(obj):
        obj = asdict(obj)
    if isinstance(obj, dict):
        return {str(k): fingerprint(v, drop) for k, v in obj.items() if k not in drop}
    if isinstance(obj, (list, tuple)):
        return [fingerprint(v, drop) for v in obj]
    return obj if obj is None or isinstance(obj, (bool, int, float, str)) else str(obj)


def differences(old, new, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs (dotted keys; a key on one side only: `(none)` on the other)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in list(old) + [k for k in new if k not in old]
                for d in differences(old.get(k, _NONE), new.get(k, _NONE), f"{prefix}.{k}" if prefix else k)]
    return [] if old == new else [f"{prefix or 'value'}: {_short(old)} -> {_short(new)}"]


_NONE = object()  # a key missing on one side


def _short(v) -> str:
    s = "(none)" if v is _NONE else json.dumps(v)
    return s if len(s) <= 60 else s[:57] + "..."


@dataclass
class Unit:
    """One piece of resumable work: its name, the configuration requested, its record and the paths it writes
    (removed together by --force)."""
    what: str
    want: dict
    record: Path
    outputs: list[Path] = field(default_factory=list)
    run: dict = field(default_factory=dict)  # what the unit is, for its stage (e.g. {"run": ..., "seed": ...})

    def there(self) -> bool:
        return any(p.exists() or p.is_symlink() for p in self.outputs)


CORRUPT = "(record unreadable)"  # mismatch() of an output whose record cannot be read


def recorded(u: Unit):
    """The recorded fingerprint, or None when the output predates fingerprints; a record that is not a JSON object
    raises ValueError naming it."""
    if not u.record.exists():
        return None
    rec = read_json(u.record)
    require(isinstance(rec, dict), f"{u.record}: expected a JSON object with `fingerprint`, got {type(rec).__name__}")
    return rec.get("fingerprint")


def mismatch(u: Unit) -> list[str]:
    """The differing fields of existing work (none when it is not there, matches or has no record); an unreadable
    record: [CORRUPT + the reason]."""
    if not u.there():
        return []
    try:
        old = recorded(u)
    except ValueError as e:
        return [f"{CORRUPT}: {e}"]
    return [] if old is None else differences(old, u.want)


def describe(bad: list[tuple[Unit, list[str]]], limit: int = 6) -> str:
    """One line: each group of outputs with the same differences, by its first path and a count."""
    groups: dict[tuple, list[Unit]] = {}
    for u, d in bad:
        groups.setdefault(tuple(d), []).append(u)
    parts = []
    for d, us in groups.items():
        more = f", and {len(d) - limit} more" if len(d) > limit else ""
        also = f" and {len(us) - 1} more like it" if len(us) > 1 else ""
        parts.append(f"{us[0].what}{also} ({', '.join(d[:limit])}{more})")
    return ("finished or started work was made with another configuration, or its record cannot be read: "
            + "; ".join(parts) + ". Pass --force to redo it with the requested one, or request the recorded settings")


def preflight(units: list[Unit]) -> None:
    """Refuse, before any work, every unit whose existing output has another configuration (one message)."""
    if bad := [(u, d) for u in units if (d := mismatch(u))]:
        raise StageMismatch(describe(bad))


def remove(u: Unit) -> None:
    for p in u.outputs + [u.record]:
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)


def check(u: Unit, force: bool = False, log=print) -> bool:
    """True when `u`'s outputs exist and may be used; False when there is nothing (or force removed a mismatch). A
    mismatch without force raises StageMismatch."""
    if not u.there():
        return False
    d = mismatch(u)
    if d and not force:
        raise StageMismatch(describe([(u, d)]))
    if d:
        log(f"{u.what}: redone with the requested configuration (--force; {', '.join(d[:6])})")
        barrier()  # under torchrun: every rank has read the record before rank 0 removes it
        if is_main():
            remove(u)
        barrier()
        return False
    if recorded(u) is None:
        log(f"{u.what}: made before configurations were recorded (no fingerprint in {u.record}); kept as it is")
    return True


def record(u: Unit, **extra) -> None:
    """Write `u`'s fingerprint to its record (rank 0 only)."""
    if is_main():
        write_json(u.record, {"fingerprint": u.want, **extra})
