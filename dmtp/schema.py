"""Typed configs as plain dataclasses: derive one from another, override fields from the command line, read one back
from JSON, with the declared field types checked and unknown keys an error at every level. No torch (the report
reads the experiment's ablation spec with it).

    derive(p, "smoke", data=dict(prompts=16))         # a dict merges into the dataclass field it names
    override(p, ["train.steps=10", "ablation.only=ar,dflash"])
    from_dict(Profile, json.loads(text))              # the inverse of dataclasses.asdict
"""
from __future__ import annotations

import copy
import json
import types
import typing
from dataclasses import fields, is_dataclass, replace

from dmtp.checks import BadValue


def derive(base, name: str | None = None, **over):
    """`base` with fields replaced; a dict given for a dataclass field replaces fields inside it (recursively), so
    `derive(tiny(), "smoke", data=dict(prompts=16))` keeps tiny's other data settings. Unknown keys fail."""
    known = {f.name for f in fields(base)}
    bad = sorted(set(over) - known)
    if bad:
        raise KeyError(f"{type(base).__name__}{f' {name}' if name else ''}: unknown keys {bad}")
    for k, v in over.items():
        cur = getattr(base, k)
        if isinstance(v, dict) and is_dataclass(cur):
            over[k] = derive(cur, None, **v)
    if name is not None:
        over["name"] = name
    return replace(base, **over)


def override(p, assignments: list[str], flag: str = "--set"):
    """`KEY=VALUE` assignments (`pretrain.tokens=20000000`, `data.batch=4`, `ablation.only=dflash,token_only`)
    applied to a profile. A value is read as its field's declared type (bool: true/false; tuple: JSON list or
    comma-separated; dict: JSON), so a typo fails instead of training on a string; the name stays, so the work and
    results folders are the profile's. A key given twice with two values is refused (neither wins silently). The
    result is checked once, after every assignment (each config's
    `__post_init__`, innermost first): a value that is valid only together with another assignment is accepted in
    any order, and a failed check names the assignment that set the field, or those that touched the failing
    section. `flag`: the command-line flag the assignments came from, named in errors."""
    try:
        return _override(p, assignments)
    except (ValueError, KeyError) as e:
        if flag == "--set":
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise type(e)(msg.replace("--set ", f"{flag} ")) from None


def _override(p, assignments: list[str]):
    done: list[tuple[str, str]] = []
    for a in assignments:
        key, eq, raw = a.partition("=")
        if not eq or not key:
            first = fields(p)[0].name if is_dataclass(p) and not hasattr(p, "pretrain") else ""
            example = f"{first}={getattr(p, first)}" if first else "pretrain.tokens=20000000"
            raise ValueError(f"--set {a!r}: expected KEY=VALUE, e.g. {example}")
        twice = [r for k, r in done if k == key and r != raw]
        if twice:  # the later one would win silently
            raise ValueError(f"--set {key} given twice ({key}={twice[0]}, {key}={raw}): which value to use is "
                             "ambiguous; give it once")
        try:
            p = _assign(p, key.split("."), raw, key)
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith("--set ") else f"--set {key}={raw}: {e}") from None
        done.append((key, raw))
    try:
        return _checked(p, "")
    except _Invalid as bad:
        e, where = bad.error, bad.where
        if isinstance(e, BadValue):  # a field's own check: the assignment that set it
            key = f"{where}.{e.name}" if where else e.name
            mine = [(k, r) for k, r in done if k == key]
            if mine:
                raise ValueError(f"--set {key}={mine[-1][1]}: expected {e.expected}") from None
        inside = [(k, r) for k, r in done if not where or k == where or k.startswith(where + ".")] or done
        msg = str(e)
        if msg.startswith("--set "):
            raise ValueError(msg) from None
        raise ValueError(f"{', '.join(f'--set {k}={r}' for k, r in inside)}: {msg}") from None


class _Invalid(Exception):
    """A config that failed its check, and where it sits in the profile (dotted; "" for the profile itself)."""

    def __init__(self, where: str, error: ValueError):
        super().__init__(where, error)
        self.where, self.error = where, error


def _checked(obj, where: str):
    """`obj` rebuilt through its dataclass checks (`__post_init__`), its nested configs first."""
    if not is_dataclass(obj):
        return obj
    kids = {f.name: _checked(getattr(obj, f.name), f"{where}.{f.name}" if where else f.name) for f in fields(obj)
            if is_dataclass(getattr(obj, f.name))}
    try:
        return replace(obj, **kids)
    except (ValueError, TypeError) as e:
        raise _Invalid(where, e if isinstance(e, ValueError) else ValueError(str(e))) from None


def _set(obj, name: str, value):
    """A copy of dataclass `obj` with one field set, unchecked (`override` checks the whole profile at the end)."""
    new = copy.copy(obj)
    object.__setattr__(new, name, value)
    return new


def _assign(obj, path: list[str], raw: str, key: str):
    if isinstance(obj, dict):  # a dict-valued field takes a whole JSON object, not one key at a time
        field = key[: -len(".".join(path)) - 1]
        try:
            item = json.loads(raw)
        except json.JSONDecodeError:
            item = raw
        example = json.dumps({**obj, path[0]: item})
        raise ValueError(f"--set {key}={raw}: {field} is a dict-valued field: set it whole, as a JSON object (the "
                         f"keys you keep included), e.g. --set '{field}={example}'")
    names = {f.name for f in fields(obj)} if is_dataclass(obj) else set()
    if path[0] not in names or path[0] == "name":
        raise KeyError(f"--set {key}: {type(obj).__name__} has no field {path[0]!r}"
                       + (f" (fields: {', '.join(sorted(names - {'name'}))})" if names else ""))
    if len(path) > 1:
        return _set(obj, path[0], _assign(getattr(obj, path[0]), path[1:], raw, key))
    tp = typing.get_type_hints(type(obj))[path[0]]
    try:
        val = _parse(tp, raw)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--set {key}={raw}: {e}") from None
    return _set(obj, path[0], val)


def _parse(tp, raw: str):
    """A command-line string as a value of type `tp`."""
    if tp is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError("expected true or false")
        return raw.lower() in ("true", "1")
    if tp is int:
        return _int(raw)
    if tp in (float, str):
        return tp(raw)
    if typing.get_origin(tp) is tuple and not raw.lstrip().startswith("["):  # comma-separated items
        item = (typing.get_args(tp) or (str,))[0]
        return tuple(_parse(item, x.strip()) for x in raw.split(",") if x.strip())
    try:
        v = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError(f"expected JSON for a {getattr(typing.get_origin(tp) or tp, '__name__', tp)}") from None
    return _typed(tp, v, "value")


def _int(raw: str) -> int:
    """An integer, also written 1e8 or 100_000_000 (token and byte budgets); 1.5e3 or 2.5 is not one."""
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        f = float(raw)
    except ValueError:
        raise ValueError(f"expected an integer, got {raw!r}") from None
    if not f.is_integer():
        raise ValueError(f"expected an integer, got {raw!r}")
    return int(f)


def from_dict(cls, d: dict, where: str = ""):
    """A dataclass from its `asdict` form, types checked and tuples restored; unknown keys fail."""
    if not isinstance(d, dict):
        raise ValueError(f"{where or cls.__name__}: expected an object, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    bad = sorted(set(d) - known)
    if bad:
        raise KeyError(f"{where or cls.__name__}: unknown keys {bad} (fields: {', '.join(sorted(known))})")
    return cls(**{k: _typed(hints[k], v, f"{where}.{k}" if where else k) for k, v in d.items()})


def _typed(tp, v, where: str):
    """JSON value `v` as type `tp` (dataclass, tuple[...], dict[str, X], X | None, int/float/str/bool)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if is_dataclass(tp):
        return from_dict(tp, v, where)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        return _typed(next(a for a in args if a is not type(None)), v, where)
    if origin is tuple:
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {v!r}")
        items = args[:1] * len(v) if len(args) == 2 and args[1] is Ellipsis else args
        if args and len(items) != len(v):
            raise ValueError(f"{where}: expected {len(items)} items, got {v!r}")
        return tuple(_typed(t, x, f"{where}[{i}]") for i, (t, x) in enumerate(zip(items, v))) if args else tuple(v)
    if origin is dict or tp is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{where}: expected an object, got {v!r}")
        return {k: _typed(args[1], x, f"{where}[{k}]") for k, x in v.items()} if args else dict(v)
    if tp in (int, float, str, bool):
        ok = (int, float) if tp is float else tp  # JSON writes 1.0 as 1
        if not isinstance(v, ok) or (isinstance(v, bool) and tp is not bool):
            raise ValueError(f"{where}: expected {tp.__name__}, got {v!r}")
        return float(v) if tp is float else v
    return v
