"""Early checks: what a long run will need, checked before its first expensive minute (weights allocated, a
regeneration or a training started, a GPU stage begun). One mechanism for every entry point: the pipeline checks its
evaluation sets and data size right after the corpus and tokenizer stages; `dmtp reproduce`, `dmtp train` and
`dmtp generate` check a checkpoint's config against its weights before building the model.

    from dmtp.preflight import Check, run
    run([Check("eval set pytests", lambda: f"{len(rows)} prompts"),      # a note for the log
         Check("target config", lambda: check_config(path))], log=print)  # raises ValueError on a problem

A check is a name and a function that returns a short note (what it found) or raises `ValueError` with one line
naming the file or field and what was expected. `run` runs every check (a later one may still fail after an earlier
one did: the user sees every shortfall at once) and raises `PreflightFailed` (a ValueError: the commands print it as
one error line and exit 2) naming each failed check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable


class PreflightFailed(ValueError):
    """One or more early checks failed: `preflight: <check>: <why>[; <check>: <why> ...]`."""

    def __init__(self, failures: list[tuple[str, str]]):
        self.failures = failures
        super().__init__("preflight: " + "; ".join(f"{name}: {why}" for name, why in failures))


@dataclass(frozen=True)
class Check:
    name: str  # what is checked ("eval set pytests", "target config.json")
    fn: Callable[[], str | None]  # a note on success; ValueError (one line) on a problem


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def run(checks: Iterable[Check], log: Callable[[str], None] | None = None) -> dict[str, str]:
    """Run every check; returns {name: note}. Failures (ValueError, FileNotFoundError, KeyError) are collected and
    raised together as one `PreflightFailed`; anything else is a bug and propagates."""
    notes, failures = {}, []
    for ch in checks:
        try:
            note = ch.fn()
        except (ValueError, FileNotFoundError, KeyError) as e:
            failures.append((ch.name, _line(e)))
            continue
        notes[ch.name] = note or "ok"
        if log is not None:
            log(f"preflight {ch.name}: {notes[ch.name]}")
    if failures:
        raise PreflightFailed(failures)
    return notes
