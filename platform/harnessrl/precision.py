"""Numeric precision: one vocabulary for every setting that names one (`encoder.precision`,
`serve.encoder.precision`, `train.precision`, an encoder identity, the benchmarks' flags).

The names are `float32`, `float16` and `bfloat16` (and `auto` where a setting lets the device
decide). `fp32`, `fp16` and `bf16` (train.precision's spelling before) are the same names:
configs are normalised when read, so once loaded a precision is written one way.
Standard library only: bench/cross_probe.py imports it on GPU machines without pydantic.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

# what a model computes in: float32, or bfloat16 autocast (losses, pooling and normalisation in
# float32). The precisions of an encoder identity and of training. int8 dynamic quantization of
# an encoder's Linear layers was measured and left out: 1.9x faster, cosine to float32 only 0.89.
Compute = Literal["float32", "bfloat16"]
Precision = Literal[Compute, "float16"]  # float16: weights on a GPU (within float32's identity)
COMPUTE: tuple[str, ...] = get_args(Compute)
ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def normalise(value: Any) -> Any:
    """`fp32`, `fp16`, `bf16` (any case) -> `float32`, `float16`, `bfloat16`; other names lower
    case; non-strings as given (the setting's own validation says what is allowed)."""
    if not isinstance(value, str):
        return value
    name = value.strip().lower()
    return ALIASES.get(name, name)


def identity_precision(configured: str) -> str:
    """The precision an encoder identity names for a configured encoder precision: bfloat16 when
    asked, else float32 (a GPU's float16 weights stay within float32's identity: at most 3e-4 apart)."""
    return "bfloat16" if normalise(configured) == "bfloat16" else "float32"


def half_weights(configured: str, on_gpu: bool, identity: str) -> bool:
    """Whether an encoder runs with float16 weights: on a GPU, unless float32 is asked for or its
    vectors are bfloat16 ones (those compute under bfloat16 autocast instead)."""
    return on_gpu and normalise(configured) != "float32" and identity == "float32"
