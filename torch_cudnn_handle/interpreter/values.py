"""Moving values between the caller's torch tensors and the interpreter's.

Inside, every tensor's value is a dense torch tensor of the described dims in a floating
compute dtype, or int64 for integers (booleans are 0/1, integers exact). At the edges:

* An input is read the way cuDNN reads a buffer: from the tensor's address (its storage
  and storage offset) with the strides the description declares, which is how the op
  binds a natural operand's view (registry/operand_views.py); dtype must match.
* A ragged tensor (one with a ragged offset) is read and written per batch element:
  element ``[b, h, s, d]`` lies at ``offsets[b] * multiplier`` plus the declared strides
  of ``h, s, d``; batch element ``b`` holds ``(offsets[b+1] - offsets[b]) / stride[s]``
  tokens. Its dense value is ``[B, H, S, D]`` with the rows past those tokens zero.
* A value is stored in a declared dtype with the conversions cuDNN's kernels use
  (``cast``): float types round to nearest even (fp16 overflows to inf), fp8 saturates to
  its largest finite value (satfinite), integers round to nearest even and saturate
  (NaN -> 0), BOOLEAN is ``!= 0``.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from .description import Refused, dims, strides, torch_dtype

_FP8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name))


def cast(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` stored as ``dtype``, with cuDNN's conversion rules (module docstring)."""
    if dtype == torch.bool:
        return value != 0
    if dtype.is_floating_point:
        if dtype in _FP8:
            limit = torch.finfo(dtype).max
            value = torch.where(value.isnan(), value, value.clamp(-limit, limit))
        return value.to(dtype)
    info = torch.iinfo(dtype)
    if not value.is_floating_point():  # an integer value (int64, exact): saturated, never through a float
        return value.to(torch.int64).clamp(info.min, info.max).to(dtype)
    wide = value.to(torch.float64)
    wide = torch.nan_to_num(wide, nan=0.0).round().clamp(info.min, info.max)
    return wide.to(dtype)


def rounded(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as it reads back after being stored as ``dtype`` (in its own dtype)."""
    if dtype == value.dtype:
        return value
    return cast(value, dtype).to(value.dtype)


def _check_dtype(desc, data: torch.Tensor) -> None:
    expected = torch_dtype(desc)
    if data.dtype != expected:
        raise ValueError(
            f"interpreter: input {desc.name!r} (uid {desc.uid}) is described as {expected} but the tensor given is {data.dtype}"
        )


def read(desc, data: torch.Tensor, compute: torch.dtype, offsets: Optional[Sequence[int]] = None) -> torch.Tensor:
    """The value of input ``desc`` held by ``data`` (pointer semantics, module docstring)."""
    _check_dtype(desc, data)
    shape, stride = dims(desc), strides(desc)
    if offsets is not None:
        return _read_ragged(desc, data, compute, offsets)
    try:
        view = torch.as_strided(data, shape, stride, data.storage_offset())
    except RuntimeError as error:
        raise ValueError(
            f"interpreter: input {desc.name!r} (uid {desc.uid}) is described as {shape} stride {stride}, which the tensor "
            f"given ({list(data.shape)} stride {list(data.stride())}) does not hold: {error}"
        ) from None
    return view.to(compute)


def pass_by_value(desc, data: Optional[torch.Tensor], compute: torch.dtype, device) -> torch.Tensor:
    """A pass-by-value operand: the one-element host tensor given for it, else the value
    the description embeds (``tensor_scalar``; a Python float is a FLOAT scalar there, so
    it is rounded to float32 first), as a tensor of the described dims."""
    if data is not None:
        if data.numel() != 1:
            raise ValueError(f"interpreter: pass-by-value {desc.name!r} (uid {desc.uid}) takes one element, got {list(data.shape)}")
        value = data.detach().reshape(()).to(device=device, dtype=compute)
    elif desc.pass_by_value is not None:
        raw = desc.pass_by_value
        source = torch.float32 if isinstance(raw, float) else None
        value = torch.tensor(raw, dtype=source).to(device=device, dtype=compute)
    else:
        raise ValueError(f"interpreter: no value given for pass-by-value {desc.name!r} (uid {desc.uid})")
    return value.expand(dims(desc)) if desc.dim else value


def _token_layout(desc) -> List[int]:
    """A ragged tensor's strides, checked to be token-major 4-D ([B, H, S, D], S slowest of H, S, D)."""
    shape, stride = dims(desc), strides(desc)
    if len(shape) != 4 or stride[2] < max(stride[1], stride[3]):
        raise Refused(
            f"interpreter: ragged tensor {desc.name!r} is {shape} stride {stride}; only token-major [B, H, S, D] ragged "
            "layouts (the sequence dim the slowest of H, S, D) are supported"
        )
    return stride


def _tokens(desc, offsets: Sequence[int], batch: int) -> int:
    stride = _token_layout(desc)
    scale = int(getattr(desc, "ragged_offset_multiplier", 1) or 1)
    tokens = (int(offsets[batch + 1]) - int(offsets[batch])) * scale // stride[2]
    return max(0, min(tokens, dims(desc)[2]))


def _batch_view(desc, storage: torch.Tensor, offsets: Sequence[int], batch: int) -> torch.Tensor:
    stride = _token_layout(desc)
    _, heads, _, width = dims(desc)
    scale = int(getattr(desc, "ragged_offset_multiplier", 1) or 1)
    start = storage.storage_offset() + int(offsets[batch]) * scale
    return torch.as_strided(storage, (heads, _tokens(desc, offsets, batch), width), (stride[1], stride[2], stride[3]), start)


def _read_ragged(desc, data: torch.Tensor, compute: torch.dtype, offsets: Sequence[int]) -> torch.Tensor:
    shape = dims(desc)
    if len(offsets) != shape[0] + 1:
        raise ValueError(f"interpreter: ragged tensor {desc.name!r} has {shape[0]} batch elements but {len(offsets)} offsets")
    dense = torch.zeros(shape, dtype=compute, device=data.device)
    for b in range(shape[0]):
        view = _batch_view(desc, data, offsets, b)
        dense[b, :, : view.shape[1]] = view.to(compute)
    return dense


def write(desc, value: torch.Tensor, device, offsets: Optional[Sequence[int]] = None) -> torch.Tensor:
    """A new tensor of ``desc``'s dims, strides and dtype holding ``value``. A ragged one
    gets each batch element's tokens at its offset; the rest of its storage is zero."""
    dtype = torch_dtype(desc)
    shape, stride = dims(desc), strides(desc)
    value = value.to(device)
    if list(value.shape) != shape:
        value = value.broadcast_to(shape)
    if offsets is None:
        out = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        out.copy_(cast(value, dtype))
        return out
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    out = torch.zeros(span, dtype=dtype, device=device).as_strided(shape, stride)
    for b in range(shape[0]):
        view = _batch_view(desc, out, offsets, b)
        view.copy_(cast(value[b, :, : view.shape[1]], dtype))
    return out

