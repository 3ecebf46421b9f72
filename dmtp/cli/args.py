"""Command-line inputs checked before any work, and one error line instead of a traceback for a user error.

    p.add_argument("--temperature", type=temperature, default=0.0)  # nan, -1, 1e-320 -> "argument --temperature: ..."
    guard("dmtp generate", cmd_generate, a)    # ValueError / KeyError / OSError -> "dmtp generate: error: ...", exit 2

`DMTP_TRACEBACK=1` re-raises instead. An exception outside those classes is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from dmtp import checks
from dmtp.checks import require

USER_ERRORS = (ValueError, KeyError, OSError, NotImplementedError, ImportError)  # ImportError: an optional package


def _converted(conv, s: str, want: str):
    """conv(s), or the argparse error naming what was expected."""
    try:
        return conv(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {want}, got {s!r}") from None


def at_least(lo: int, hi: int | None = None):
    """argparse type: an integer >= lo (and <= hi; at most `checks.MAX_INT`: a larger count is a typo)."""
    want = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"

    def parse(s):
        v = _converted(int, s, want)
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {v}")
        if v > checks.MAX_INT:
            raise argparse.ArgumentTypeError(f"expected {want} and at most {checks.MAX_INT:,} (2**53 - 1), got {v}")
        return v
    return parse


SEED = at_least(0, 2**32 - 1)  # argparse type of a seed (torch and numpy generators take it, plus batch offsets)


def temperature(s):
    """argparse type: 0 (greedy) or a sampling temperature >= checks.MIN_TEMPERATURE."""
    ok, want = checks.temperature
    v = _converted(float, s, want)
    if not ok(v):
        raise argparse.ArgumentTypeError(f"expected {want}, got {s}")
    return v


def number(lo: float | None = None, open_lo: bool = False):
    """argparse type: a finite number (>= lo, or > lo with open_lo)."""
    want = "a finite number" + ("" if lo is None else f" {'>' if open_lo else '>='} {lo:g}")

    def parse(s):
        v = _converted(float, s, want)
        if not math.isfinite(v) or (lo is not None and (v <= lo if open_lo else v < lo)):
            raise argparse.ArgumentTypeError(f"expected {want}, got {s}")
        return v
    return parse


def listed(item):
    """argparse type: comma-separated items, each parsed by `item` (an argparse type above)."""
    def parse(s):
        parts = [x.strip() for x in s.split(",")]
        if not s.strip() or not all(parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {s!r}")
        return [item(x) for x in parts]
    return parse


def names(s: str) -> list[str]:
    """argparse type: comma-separated names, none empty, none repeated."""
    parts = [x.strip() for x in s.split(",")]
    if not s.strip() or not all(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {s!r}")
    dup = sorted({x for x in parts if parts.count(x) > 1})
    if dup:
        raise argparse.ArgumentTypeError(f"{', '.join(dup)} given twice")
    return parts


def failure(e: BaseException) -> str:
    """An error that one piece of a run reports while the others go on: its type and its first line (200 chars)."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def interrupted(e: BaseException) -> bool:
    """Whether `e` is Ctrl-C, or an error it caused (torch.save through a file object reports a KeyboardInterrupt
    raised inside its write as its own failure, the interrupt as its context)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _stop(prog: str):
    """Ctrl-C: exit 130 with one line (under torchrun every rank exits so, rank 0 alone prints it). A rank of
    torchrun's ignores SIGTERM from here on: torch's agent sends one once a rank has ended, and this one is already
    stopping. (Elsewhere it is left alone: an ignored SIGTERM is inherited by every child a test runner starts.)"""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("RANK", "0") == "0":
        print(f"{prog}: interrupted; the same command resumes from what was saved", file=sys.stderr)
    sys.exit(130)


def guard(prog: str, fn, *args):
    """Run fn(*args); a user error prints `prog: error: message` (one line) and exits 2; Ctrl-C exits 130."""
    try:
        return fn(*args)
    except KeyboardInterrupt:
        _stop(prog)
    except Exception as e:
        if interrupted(e):
            _stop(prog)
        oom = getattr(sys.modules.get("torch"), "OutOfMemoryError", ())
        if os.environ.get("DMTP_TRACEBACK") or not isinstance(e, USER_ERRORS + ((oom,) if oom else ())):
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if oom and isinstance(e, oom):
            msg = f"out of device memory ({str(e).splitlines()[0]}); use a smaller batch"
        print(f"{prog}: error: {' '.join(str(msg).split())}", file=sys.stderr)
        sys.exit(2)


def _file_in_the_way(p: Path) -> Path | None:
    """A file where a parent folder of `p` should be, or None."""
    return next((q for q in p.parents if q.exists() and not q.is_dir()), None)


def _cause(p: Path, e: OSError) -> str:
    """Why a folder could not be made at `p`: a file where a parent folder should be, or the system's reason."""
    blocker = _file_in_the_way(p)
    return f"{blocker} is a file, not a folder" if blocker else (e.strerror or str(e))


def out_file(path, flag: str = "--out") -> Path:
    """An output file path checked before any work: not a folder, its folder creatable and writable."""
    p = Path(path)
    require(not p.is_dir(), f"{flag} {p}: is a folder; expected a file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=p.parent).close()
        if p.exists():
            open(p, "a").close()
    except OSError as e:
        raise ValueError(f"{flag} {p}: cannot write there ({_cause(p, e)})") from None
    return p


def out_dir(path, flag: str = "--out", create: bool = True) -> Path:
    """An output folder checked before any work: not a file, creatable and writable. create=False: checked without
    making it (a run with nothing to do leaves no folder)."""
    p = Path(path)
    require(not p.exists() or p.is_dir(), f"{flag} {p}: is a file; expected a folder")
    if not create:
        blocker = _file_in_the_way(p)
        require(blocker is None, f"{flag} {p}: cannot write there ({blocker} is a file, not a folder)")
        base = next(q for q in (p, *p.parents) if q.exists())
        require(os.access(base, os.W_OK | os.X_OK), f"{flag} {p}: cannot write there (Permission denied: {base})")
        return p
    try:
        p.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=p).close()
    except OSError as e:
        raise ValueError(f"{flag} {p}: cannot write there ({_cause(p, e)})") from None
    return p


def in_file(path, flag: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{flag} {p}: no such file")
    require(not p.is_dir(), f"{flag} {p}: is a folder; expected a file")
    return p


def checkpoint(path, flag: str, what: str = "checkpoint", finished: bool = True) -> Path:
    """A checkpoint folder: exists, holds config.json and weights; with `finished`, not of a training under way."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{flag} {p}: no such folder (expected a {what} folder with config.json)")
    if not (p / "config.json").exists():
        inner = p / "drafter"  # a training run's folder (`dmtp train --out DIR` writes DIR/<run>/drafter)
        hint = f"; {inner} is one: pass that" if (inner / "config.json").exists() else ""
        raise FileNotFoundError(f"{flag} {p}: no config.json (expected a {what} folder){hint}")
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise FileNotFoundError(f"{flag} {p}: no weights (*.safetensors or *.bin) beside config.json")
    why = unfinished_training(p) if finished else None
    require(not why, f"{flag} {p}: {why}")
    return p


def method_checkpoints(target, methods, drafters) -> None:
    """`--target`, and the drafter checkpoint `--drafters DIR/<run>/drafter` of each of `methods` that drafts."""
    from dmtp.engine.methods import method_class, run_of

    checkpoint(target, "--target", "target checkpoint")
    for name in methods:
        base = run_of(name.partition("+")[0])
        if method_class(base).needs_drafter:
            require(drafters, f"--methods {name}: a drafter method needs --drafters DIR (holding {base}/drafter)")
            checkpoint(Path(drafters) / base / "drafter", f"--methods {name}:", "drafter checkpoint")


def drafter_of(path, flag: str, target_cfg) -> None:
    """A drafter checkpoint to continue: made for a target of `target_cfg`'s widths, reading layers it has."""
    from dmtp.io import read_json
    from dmtp.models.drafter import DrafterConfig

    keys = ("hidden_size", "vocab_size")
    try:
        d = DrafterConfig.from_hf_dict(read_json(Path(path) / "config.json"))
    except (ValueError, TypeError) as e:  # not JSON, a field out of range
        raise ValueError(f"{flag}{path}: config.json: {e}") from None
    got, want = ({k: getattr(c, k) for k in keys} for c in (d, target_cfg))
    require(got == want, f"{flag}{path}: a drafter for a target of {got}, --target has {want}")
    layers = target_cfg.num_hidden_layers  # the taps read layers 0..L-2 (the last one's output is post-norm)
    if max(d.target_layer_ids) >= layers - 1:
        raise ValueError(f"{flag}{path}: a drafter for a deeper target (it reads layers {d.target_layer_ids}), "
                         f"--target has {layers} layers")


def init_from(items, runs, target_cfg, bare: str | None = None) -> dict[str, str]:
    """`--init-from RUN=PATH[,RUN=PATH]` -> {run: resolved checkpoint}, one per run, each checked (`drafter_of`);
    with `bare`, a PATH alone continues that run."""
    out = {}
    for item in [x for flag in items or [] for x in flag.split(",")]:
        run, eq, path = item.partition("=") if "=" in item or not bare else (bare, "=", item)
        require(eq and run in runs, f"--init-from {item!r}: expected RUN=PATH with RUN one of {', '.join(runs)}")
        flag = f"--init-from {item[: len(item) - len(path)]}"  # as given: RUN=PATH, or PATH alone
        checkpoint(path, flag.rstrip(), "drafter checkpoint")
        drafter_of(path, flag, target_cfg)
        where = str(Path(path).resolve())
        require(out.get(run, where) == where, f"--init-from: run {run!r} given twice ({out.get(run)}, {where}); "
                "give each run one checkpoint")
        out[run] = where
    return out


def unfinished_training(p: Path) -> str | None:
    """Why checkpoint folder `p` is a training's intermediate save, or None: a <run>/drafter whose <run> holds a
    training state or record but no DONE (written after the last step)."""
    run = p.resolve().parent
    if p.resolve().name == "drafter" and not (run / "DONE").exists() and any(
            (run / f).exists() for f in ("trainer_state.pt", "fingerprint.json")):
        return (f"the checkpoint of an unfinished training ({run} has no DONE): finish it (rerun the `dmtp train` or "
                "pipeline stage that trains it: it resumes), or copy the folder out to use it as it is")
    return None


def device(name: str | None) -> str:
    """The device to run on (default: cuda when available), refused up front when it cannot be used."""
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        d = torch.device(name)
    except RuntimeError:
        d = None
    require(d is not None and d.type in ("cpu", "cuda"), f"--device {name!r}: expected cpu, cuda or cuda:N")
    if d.type == "cuda":
        require(torch.cuda.is_available(), f"--device {name}: CUDA is not available here (torch "
                f"{torch.__version__}); use --device cpu")
        require(d.index is None or d.index < torch.cuda.device_count(),
                f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    return name


def _generation_eos(target) -> list[int]:
    """The end-of-text ids of `target`/generation_config.json (releases list every id a turn ends with there)."""
    from dmtp.io import read_json

    path = Path(target) / "generation_config.json"
    if not path.exists():
        return []
    e = read_json(path).get("eos_token_id")  # not JSON, or not an object: an error naming the file
    ids = [e] if isinstance(e, int) else e if isinstance(e, list) else [] if e is None else None
    if ids is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{path}: eos_token_id must be a token id or a list of ids, not {e!r}")
    return ids


EOS_REMEDY = "pass --eos ID[,ID] (or --eos none to always decode --max-new-tokens)"


def eos_ids(flag, cfg, tok, vocab_size, target, remedy: str = EOS_REMEDY) -> list[int]:
    """End-of-text ids: --eos (ids, or `none`), else every id of the config, generation_config.json and tokenizer;
    never invented. `remedy`: what the error without any tells the user to do."""
    if flag is not None:
        if flag.strip().lower() == "none":
            return []
        try:
            ids = [int(x) for x in flag.split(",")]
        except ValueError:
            raise ValueError(f"--eos {flag!r}: expected comma-separated token ids, or none") from None
    else:
        e = getattr(cfg, "eos_token_id", None)
        ids = ([e] if isinstance(e, int) else list(e or [])) + _generation_eos(target)
        if tok is not None and tok.eos_token_id is not None:
            ids.append(tok.eos_token_id)
        require(ids, f"no end-of-text id: {target}/config.json and generation_config.json set no eos_token_id "
                     f"and the folder's tokenizer names none; {remedy}")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        where = "--eos" if flag else f"{target}: config.json, generation_config.json or the tokenizer"
        raise ValueError(f"end-of-text id {bad[0]} ({where}) outside the vocabulary [0, {vocab_size})")
    return sorted(set(ids))


def modified(path) -> str:
    """When a checkpoint's weights were last written (part of a run's fingerprint: retrained in place = changed)."""
    files = sorted(Path(path).glob("*.safetensors"))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(max(f.stat().st_mtime for f in files))) if files else ""


COMPILE_CACHE = "~/.cache/dmtp/inductor"  # where the commands keep torch.compile's caches unless told otherwise


def compile_cache_flag(parser: argparse.ArgumentParser):
    """`--compile-cache DIR` on a command that may compile (`use_compile_cache` applies it)."""
    parser.add_argument("--compile-cache", default=COMPILE_CACHE, metavar="DIR",
                        help="where torch.compile's caches persist across processes; 'none': torch's own default, "
                        f"a temporary directory (default {COMPILE_CACHE})")


def use_compile_cache(path: str | None) -> str | None:
    """Point torch's compile caches at `path` (`TORCHINDUCTOR_CACHE_DIR`, which also holds Triton's kernels unless
    `TRITON_CACHE_DIR` says otherwise), before anything compiles. None or 'none': torch's own default. Returns the
    directory."""
    from dmtp.training.common import deterministic_cublas

    deterministic_cublas()  # before any CUDA work: the training loops' fixed kernels need it (`kernel_choices`)
    if path in (None, "", "none"):
        return None
    d = Path(path).expanduser().resolve()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"--compile-cache {path}: cannot create it ({e.strerror})") from None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(d)
    return str(d)


def phase(command: str, what: str, out=None) -> None:
    """One line on stderr saying what a command is doing, with the seconds since it started (`dmtp.cli.STARTED`)."""
    from dmtp.cli import STARTED

    print(f"[{command} {time.monotonic() - STARTED:6.1f}s] {what}", file=out or sys.stderr, flush=True)
