"""Typed settings that change what a decoded token or a timing means, passed down from the entry point (torch-free).

`EngineConfig` says how the one decode loop runs (dmtp/engine/decode.py) and how the compiled forwards are built
(dmtp/models/fast.py). The profile holds one (`Profile.engine`, `--set engine.attention=dense`); `generate`,
`Server`, `run_generate` and the compiled forwards take it as an argument — the library reads no environment
variable — and every output's meta file records it with the values it resolved to on that machine
(`resolved(device)`).

    eng = EngineConfig(attention="dense", cache_write="graph")       # a named variant of the default
    generate(tgt, method, prompts, 0.0, 128, engine=eng)
    eng.resolved("cuda")  # {'engine': 'compiled', 'cache_write': 'graph', ...}: what ran
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from dmtp.checks import at_least, between, check, one_of

ENGINES = ("auto", "compiled", "fast-eager", "hf")
ATTENTIONS = ("flex", "dense")
CACHE_WRITES = ("auto", "graph", "eager")
TUNINGS = ("default", "fixed", "autotune")
DRAFTER_PATHS = ("compiled", "hf")
PREFILLS = ("hf", "compiled", "graphed")
DTYPES = ("fp32", "bf16", "fp16")
VERIFY_MODES = ("target", "sample", "block")  # how drafts are drawn and accepted at T > 0 (dmtp/engine/verify.py)
EVAL_MODES = ("natural", "fixed")  # natural: a request ends at end-of-text, a stop string or the length cap; fixed:
# exactly max_new_tokens, end-of-text ignored (dmtp/engine/runner.py)


@dataclass(frozen=True)
class EngineConfig:
    """How the decode loop and its compiled forwards run. Every field changes timings; `dtype` and `engine` can also
    change tokens at near-ties (every engine equals the HF reference in fp32; bf16 forwards round differently)."""
    engine: str = "auto"  # "compiled": fast.py's forwards compiled, the other stages compiled whole, under CUDA graphs;
    # "fast-eager": fast.py's forwards uncompiled (debugging; CPU tests); "hf": the HF layers with dense masks (the
    # reference); "auto": compiled on CUDA, hf on CPU. Targets fast.py does not cover (hybrid, MoE) decode on "hf"
    graphs: bool = True  # CUDA graphs of the round's stages (CUDA, full-attention targets)
    attention: str = "flex"  # attention kernel of the compiled forwards: "flex" (flex attention over the key blocks a
    # request can see) | "dense" (two GQA matmuls over the whole cache, visibility evaluated inside the softmax)
    cache_write: str = "auto"  # where the compiled forwards write their K/V rows: "graph" (inside the compiled graph),
    # "eager" (outside it: a graph break per write), "auto" = eager on CUDA with flex attention (a compiled graph that
    # writes the cache and reads it with flex attention gave wrong outputs on the H200), graph otherwise
    tuning: str = "fixed"  # Inductor's kernel selection for the compiled forwards on CUDA: "fixed" (Inductor's
    # deterministic mode: its heuristics with every timed choice that can change numerics replaced by a fixed function
    # of the shape, so records do not depend on when, after what, or beside what the compilation ran: identical
    # commands give identical records, `experiments/determinism_check.py`) | "default" (Inductor's heuristics; a
    # reduction kernel with several launch settings, or a matmul Inductor may pad, is timed on the device at compile
    # time and the fastest kept, so what else runs on the card can pick another summation order) | "autotune"
    # (max_autotune + coordinate-descent tuning: faster decoding at large shapes for minutes more compilation per
    # method and shape; its choices are timed too). Not applied on CPU
    drafter: str = "compiled"  # the drafter's decode forward on the compiled engine: "compiled" (fast.py) | "hf"
    prefill: str = "hf"  # the target's prompt pass: "hf" (the HF layers, eager) | "compiled" (fast.py's layers with
    # the dense kernel, compiled once for every prompt shape: dynamic shapes); on the compiled engine only |
    # "graphed": a `Server`'s newcomers through the compiled pass replayed from CUDA graphs, one per (group size,
    # prompt length) bucket, the method's own prefill a second graph per bucket (`dmtp/engine/prompts.py`; the
    # first batch and `generate` take the compiled pass)
    admit: int = 1  # dynamic batching (`Server`): newcomers are prefilled and join once this many slots are free (or
    # the rest of the queue fits, or no request is left running): one prompt pass per group of newcomers
    admit_beside: int = 0  # dynamic batching (`Server`): L > 0 prefills the next group of newcomers beside the
    # running requests (on CUDA a second stream) before their slots are free; the group joins once enough slots are
    # free and at least L rounds after its prefill began. 0: a group is prefilled once its slots are free, the decode
    # waiting for its prompt pass. A `Server`-only setting (records decoded by `generate` do not depend on it)
    in_flight: int = 2  # round copies to the host (done flags) that may be in flight before the host waits for the
    # oldest: the host queues up to that many rounds ahead of what it has seen, so a finished request rides along
    # (its row frozen) for up to that many rounds before its slot is freed; 1 keeps one round queued on the device
    # while the host prepares the next. No record depends on it (out of the records key)
    dtype: str = "fp32"  # precision of the target, MTP head and drafters when decoding (fp32: exact losslessness;
    # bf16: every method equals the engine's own bf16 AR up to measured top-2 ties)

    def __post_init__(self):
        check(self, engine=one_of(*ENGINES), attention=one_of(*ATTENTIONS), cache_write=one_of(*CACHE_WRITES),
              tuning=one_of(*TUNINGS), drafter=one_of(*DRAFTER_PATHS), prefill=one_of(*PREFILLS),
              dtype=one_of(*DTYPES), admit=at_least(1), admit_beside=at_least(0), in_flight=between(1, 8))
        if not isinstance(self.graphs, bool):
            raise ValueError(f"graphs={self.graphs!r}: expected true or false")

    def kind(self, device_type: str) -> str:
        """The engine that runs on a device of this type ("auto" resolved)."""
        if self.engine != "auto":
            return self.engine
        return "compiled" if device_type == "cuda" else "hf"

    def write(self, device_type: str) -> str:
        """Where K/V rows are written ("auto" resolved): "graph" or "eager"."""
        if self.cache_write != "auto":
            return self.cache_write
        return "eager" if device_type == "cuda" and self.attention == "flex" else "graph"

    def resolved(self, device_type: str) -> dict:
        """The settings as they ran on a device of this type (what meta files record beside the config)."""
        return dict(asdict(self), engine=self.kind(device_type), cache_write=self.write(device_type))

    def records_key(self) -> dict:
        """The settings that records decoded by `generate` (the data stage, the evaluation) depend on: all of them but
        the `Server`-only prompt pass, "graphed" being "compiled" outside a server (`records_key_of`)."""
        return records_key_of(asdict(self))

    def with_(self, **changes) -> "EngineConfig":
        return replace(self, **changes)

    @classmethod
    def of(cls, x: "EngineConfig | str | None") -> "EngineConfig":
        """None: the default config; a name: the default config on that engine ("hf", "fast-eager", "compiled")."""
        if x is None:
            return cls()
        if isinstance(x, str):
            return cls(engine=x)
        if not isinstance(x, cls):
            raise TypeError(f"engine={x!r}: expected an EngineConfig or an engine name ({', '.join(ENGINES)})")
        return x


SERVER_ONLY = ("admit_beside", "in_flight")  # settings no record of `generate` depends on (how far the host runs
# ahead changes when a request is seen finished, not what it emitted), out of the records key (an experiment recorded
# before they existed is the same experiment)


SERVER_VARIANTS = {"beside": "admit_beside", "flight": "in_flight"}  # a server variant's name: its Server-only
# settings, e.g. "beside2+flight1" = admit_beside 2, in_flight 1 (bench rows <method>@<variant>)


def server_variant(name: str) -> dict:
    """The `EngineConfig` fields a server variant's name sets ("beside2+flight1" -> {"admit_beside": 2, "in_flight":
    1}); a clear error for a name that is not one."""
    out = {}
    for part in name.split("+"):
        key = part.rstrip("0123456789")
        num = part[len(key):]
        if key not in SERVER_VARIANTS or not num or SERVER_VARIANTS[key] in out:
            raise ValueError(f"server variant {name!r}: expected parts <setting><number> joined by '+', each setting "
                             f"once, settings {', '.join(SERVER_VARIANTS)} (e.g. beside2+flight1)")
        out[SERVER_VARIANTS[key]] = int(num)
    try:
        EngineConfig(**out)  # each value in its field's range
    except ValueError as e:
        raise ValueError(f"server variant {name!r}: {e}") from None
    return out


def describe_variant(name: str) -> str:
    """A server variant in words ("beside2+flight1" -> "the next newcomers prefilled beside the decode
    (`engine.admit_beside` = 2), 1 round copy in flight before the host waits (`engine.in_flight` = 1)")."""
    words = {"admit_beside": lambda v: (f"the next newcomers prefilled beside the decode (`engine.admit_beside` = {v})"
                                        if v else "newcomers prefilled once their slots are free, the decode waiting "
                                        "for their prompt pass (`engine.admit_beside` = 0)"),
             "in_flight": lambda v: f"{v} round cop{'y' if v == 1 else 'ies'} in flight before the host waits "
                                    f"(`engine.in_flight` = {v})"}
    return ", ".join(words[k](v) for k, v in server_variant(name).items())


def records_key_of(engine: dict) -> dict:
    """`EngineConfig.records_key` of an engine dict (experiment.json's "engine"): prefill "graphed" read as
    "compiled", the pass `generate` takes under it (only a `Server`'s newcomers are graphed); `SERVER_ONLY` left
    out."""
    key = {k: v for k, v in engine.items() if k not in SERVER_ONLY}
    return dict(key, prefill="compiled") if key.get("prefill") == "graphed" else key
