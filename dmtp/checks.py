"""Checks of user-given values: a bad value fails at once with one line naming the field and what was expected.

    @dataclass
    class TrainConfig:
        steps: int = 200
        lr: float = 6e-4
        def __post_init__(self):
            check(self, steps=at_least(1), lr=positive)   # TrainConfig(steps=0) -> BadValue("steps=0: expected ...")

A rule is a (test, expectation) pair; `check` also refuses NaN and infinities in every float field of a dataclass,
and integers beyond `MAX_INT` in every field (an item of a list or a dict value too), with or without a rule: a
token budget of 10**30 is a typo, and downstream counts (steps, progress bars, tensors) overflow on it. Configs
check themselves in `__post_init__`, so a value set from a profile, a `--set` override or a command-line flag is
checked in the same place (`dataclasses.replace` runs `__post_init__` again; `schema.override` once, after every
assignment).
"""
from __future__ import annotations

import math
from dataclasses import fields, is_dataclass


class BadValue(ValueError):
    """A value outside what its field accepts: `name=value: expected ...`."""

    def __init__(self, name: str, value, expected: str):
        self.name, self.value, self.expected = name, value, expected
        super().__init__(f"{name}={value!r}: expected {expected}")


MAX_INT = 2**53 - 1  # the largest integer a config may hold: exact as a float (JSON readers, numpy, progress bars)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def at_least(lo: int):
    """An integer >= lo."""
    return (lambda v: _is_int(v) and v >= lo), f"an integer >= {lo}"


def between(lo: int, hi: int):
    """An integer in [lo, hi]."""
    return (lambda v: _is_int(v) and lo <= v <= hi), f"an integer from {lo} to {hi}"


def number(lo: float | None = None, hi: float | None = None, open_lo: bool = False):
    """A finite number in [lo, hi] ((lo, hi] with open_lo)."""
    def test(v):
        return _is_number(v) and (lo is None or (v > lo if open_lo else v >= lo)) and (hi is None or v <= hi)
    bounds = ([f"{'>' if open_lo else '>='} {lo:g}"] if lo is not None else []) + \
        ([f"<= {hi:g}"] if hi is not None else [])
    return test, "a finite number" + (" " + " and ".join(bounds) if bounds else "")


positive = number(0, open_lo=True)
non_negative = number(0)
fraction = number(0, 1)

# The smallest sampling temperature (0 is greedy). Below it fp32's softmax(logits / T) is one-hot for any top-two gap
# over 0.01 (e^-100 is under fp32's smallest normal), so sampling is greedy in all but ties, and a T that is a
# denormal or rounds to 0 in fp32 makes the division overflow (every draw then the same token, under T's label).
MIN_TEMPERATURE = 1e-4
sampling_temperature = number(MIN_TEMPERATURE)
temperature = ((lambda v: v == 0 or sampling_temperature[0](v)),
               f"0 (greedy) or a finite number >= {MIN_TEMPERATURE:g} (the sampling floor)")


def one_of(*choices):
    return (lambda v: v in choices), "one of " + ", ".join(map(repr, choices))


def each(rule, what: str = "list"):
    """A non-empty list/tuple whose every item passes `rule`."""
    test, exp = rule
    return (lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(test(x) for x in v)), \
        f"a non-empty {what}, each item {exp}"


def check(obj, **rules) -> None:
    """Raise BadValue for the first field of `obj` that breaks its rule, is a NaN/infinite float or holds an integer
    beyond MAX_INT."""
    for name, (test, expected) in rules.items():
        v = getattr(obj, name)
        if not test(v):
            raise BadValue(name, v, expected)
    for f in fields(obj) if is_dataclass(obj) else ():
        v = getattr(obj, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise BadValue(f.name, v, "a finite number")
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else (v,)
        if any(_is_int(x) and abs(x) > MAX_INT for x in items):
            raise BadValue(f.name, v, f"{'an integer' if _is_int(v) else 'integers'} of at most {MAX_INT:,} "
                           "(2**53 - 1)")


def require(ok: bool, message: str) -> None:
    """A cross-field rule: raise ValueError(message) unless ok."""
    if not ok:
        raise ValueError(message)


def text(s: str, where: str) -> str:
    """`s` if it is encodable text; a lone surrogate (JSON's "\\ud800": a valid escape, no character) is an error
    naming `where` and the character's position, not a tokenizer's or writer's traceback later."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: not encodable text: a lone surrogate {s[e.start]!r} at character {e.start + 1} "
                         "(a \\ud800-\\udfff escape that is half of a pair, or bytes that are not UTF-8)") from None
    return s


def gist(e: BaseException, limit: int = 300) -> str:
    """An exception's message as one line: every line of it joined (a library's first line is often only a heading,
    e.g. "Validation error for field 'eos_token_id':"), cut at `limit` characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
