"""Stop strings for the `natural` evaluation mode, matched on the host against each request's completion.

    stop = StopStrings(HUMANEVAL_STOPS, token_bytes(tok))      # token_bytes: dmtp.data.tokenizer
    generate(target, method, prompts, 0.0, 256, eos_ids=[0], stop=stop)

The rule is the standard code-benchmark truncation: the completion (the output only, never the prompt) is cut at
the earliest start of any stop string in it. A record then keeps
  - output tokens up to and including the token that completes that occurrence (`Match.found[1]` tokens),
  - the text before the stop string (`Match.found[0]` bytes),
  - the verify rounds up to and including the round that emitted that token, each with its full accepted count
    (as for an end-of-text inside a round: `decode.Batch._record` keeps the round whole and cuts only the tokens).
Matching runs on the completion's UTF-8 bytes, token by token (`token_bytes` gives each token's bytes); for ASCII
stop strings this is exactly matching the decoded text.

The decode loop feeds each request's new tokens as the host sees them (the pinned copies it already reads for the
done flags, a round or two late: no extra synchronisation), and ends a request once its stop is certain: found, and
no stop string that starts earlier can still be completed by later tokens. The device may have decoded a round or
two past it by then; the record is cut exactly, so every method keeps the same tokens.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

HUMANEVAL_STOPS = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")  # the Codex paper's HumanEval stop sequences


class StopStrings:
    """Stop strings and the byte string of every token id; `match()` starts one request's matcher."""

    def __init__(self, stops: Sequence[str], token_bytes: Sequence[bytes]):
        if not stops or any(not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stops)!r}")
        self.stops = [s.encode() for s in stops]
        self.table = token_bytes
        self.longest = max(len(s) for s in self.stops)

    def match(self) -> "Match":
        return Match(self)


class Match:
    """One request's completion bytes and its earliest stop. `found` = (byte offset where the stop string starts,
    number of output tokens to keep) or None."""

    def __init__(self, spec: StopStrings):
        self.spec = spec
        self.text = bytearray()
        self.ends: list[int] = []  # byte offset after each token
        self.found: tuple[int, int] | None = None
        self.certain = False
        self._from = 0  # no stop string starts before this byte offset

    def feed(self, ids: Sequence[int]) -> bool:
        """Append output tokens; True once the earliest stop is certain."""
        if self.certain:
            return True
        for t in ids:
            self.text += self.spec.table[t]
            self.ends.append(len(self.text))
        text, stops = self.text, self.spec.stops
        hits = [(i, len(s)) for s in stops if (i := text.find(s, self._from)) >= 0]
        if hits:
            start, n = min(hits)
            self.found = (start, bisect_left(self.ends, start + n) + 1)  # the token whose bytes complete it
        # the first offset where a stop string could begin and still be completed by later tokens
        lo = max(self._from, len(text) - self.spec.longest + 1)
        end = self.found[0] if self.found else len(text)
        partial = next((q for q in range(lo, end) if any(s.startswith(text[q:]) for s in stops)), None)
        self._from = partial if partial is not None else end
        self.certain = self.found is not None and partial is None
        return self.certain


def cut_rounds(accepted: Sequence[int], keep: int) -> list[int]:
    """The verify rounds that emitted output tokens 0..keep-1, each counting only what it emitted inside them: token 0
    comes from the prefill and round i emits accepted[i] + 1 tokens, so the rounds kept are the first r with
    1 + sum_{i<r} (accepted[i] + 1) >= keep, and the last one's count is cut to the tokens it emitted before the end,
    minus its own token: afterwards 1 + sum_i (accepted[i] + 1) = keep exactly. (Drafts accepted past a record's end
    — after its stop string, end-of-text or length cap — are tokens nobody reads; counting them would credit long
    drafts with acceptance the output never shows.)
    >>> cut_rounds([2, 0, 3], 5)      # tokens: 1 + 3 + 1 = 5: both rounds whole
    [2, 0]
    >>> cut_rounds([2, 0, 3], 6)      # the third round emitted 1 of its 4 tokens before the end
    [2, 0, 0]
    """
    n, r = 1, 0
    while n < keep and r < len(accepted):
        n += accepted[r] + 1
        r += 1
    out = list(accepted[:r])
    if out and n > keep:  # the last round ran past the end: it emitted accepted + 1 - (n - keep) tokens inside
        out[-1] -= n - keep
    return out
