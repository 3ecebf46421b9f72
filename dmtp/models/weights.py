"""Checks of a checkpoint's tensors against the module its config builds: a checkpoint that does not fit, or whose
numbers are not finite, is refused with one line naming it and the first tensors at fault (never loaded with
pieces re-initialised, dropped or NaN).

    check_fits(f"drafter checkpoint {path}", module.state_dict(), tensors)   # before load_state_dict
    check_finite(f"target checkpoint {path}", module.named_parameters())
"""
from __future__ import annotations

from pathlib import Path

import torch

from dmtp.checks import gist
from dmtp.io import read_json


def _names(keys, limit: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def refuse_misfit(what: str, shapes=(), missing=(), unexpected=()) -> None:
    """Raise for the first kind of misfit there is: `shapes` (key, checkpoint shape, config shape), tensors the
    config needs that are `missing`, tensors it has no place for (`unexpected`)."""
    if shapes:
        s = [f"{k}: {list(a)} in the checkpoint, {list(b)} by config.json" for k, a, b in sorted(shapes)]
        more = f" (and {len(s) - 2} more)" if len(s) > 2 else ""
        raise ValueError(f"{what}: weights of another shape than config.json describes: {'; '.join(s[:2])}{more}")
    if missing:
        raise ValueError(f"{what}: lacks tensors its config.json needs ({_names(missing)})")
    if unexpected:
        raise ValueError(f"{what}: holds tensors its config.json has no place for ({_names(unexpected)})")


def check_fits(what: str, want: dict, got: dict, optional=()) -> None:
    """`got` (the checkpoint's tensors) holds every tensor of `want` (the module's state dict) at its shape and
    nothing else, a floating-point tensor wherever the module holds one (an integer or boolean tensor would be cast
    on load, its weights cut to whole numbers); keys starting with a prefix in `optional` may be absent."""
    refuse_misfit(what, [(k, got[k].shape, v.shape) for k, v in want.items() if k in got and got[k].shape != v.shape],
                  [k for k in want if k not in got and not k.startswith(tuple(optional))],
                  [k for k in got if k not in want])
    bad = sorted(f"{k} ({str(got[k].dtype).removeprefix('torch.')})" for k, v in want.items()
                 if k in got and v.is_floating_point() and not got[k].is_floating_point())
    if bad:
        raise ValueError(f"{what}: weights of a non-floating dtype where the model holds floating-point ones: "
                         f"{_names(bad)}")


def check_finite(what: str, named_tensors) -> None:
    """Every floating-point tensor finite (no NaN, no infinity)."""
    bad = [n for n, t in named_tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(f"{what}: non-finite weights (NaN or infinity) in {_names(bad)}")


def safetensor_files(path: str | Path) -> list[Path]:
    """A checkpoint folder's weight files: the shards its index names, else every *.safetensors file."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
        wmap = read_json(index).get("weight_map")
        if not isinstance(wmap, dict) or not all(isinstance(f, str) for f in wmap.values()):
            raise ValueError(f"{index}: weight_map = {str(wmap)[:40]}: expected an object tensor name -> shard file")
        return [path / f for f in sorted(set(wmap.values()))]
    return sorted(path.glob("*.safetensors"))


def tensor_index(path: str | Path, what: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """{tensor name: (shape, safetensors dtype: "F32", "BF16", "I32", ...)} of a checkpoint folder, from its files'
    headers alone (no tensor is read). A folder without safetensors weights, a shard missing or unreadable: one line
    naming `what`."""
    from safetensors import safe_open

    files = safetensor_files(path)
    if not files:
        raise ValueError(f"{what}: no *.safetensors weights (pickled *.bin weights are never loaded)")
    out = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():
                    s = fh.get_slice(k)
                    out[k] = (tuple(s.get_shape()), s.get_dtype())
        except Exception as e:  # SafetensorError (truncated, empty, not safetensors), a missing shard
            raise ValueError(f"{what} cannot be loaded: {f.name}: {gist(e)}") from None
    return out
