"""Bytes XLA:TPU allocates for an array: its shape rounded up to the tiles of the TPU layout that pads it least.

XLA:TPU lays every array out in tiles (a layout such as ``bf16[2240,2240]{1,0:T(8,128)(2,1)}``): the most minor
dim is padded to a multiple of 128 lanes and the next to a multiple of 8 sublanes (fewer rows tile as 1, 2 or 4;
2 at least for a 2-byte type, which packs two rows into a 32-bit word); a 1-D array is padded to 128, 256, 512 or
1024 elements (512 bytes at least), then to a multiple of 1024. Which dims are the minor two is the compiler's
choice, and for a weight it takes the order that pads least (a [3072, 2240] Linear weight is laid out ``{0,1}``,
3072 minor, unpadded; a [2240, 2240] one gains 2304 / 2240 - 1 = 2.9%).

Measured, not taken from a document (no public one states it): XLA:TPU's ahead-of-time compile (libtpu 0.0.52,
v6e:2x4) of arrays of 1 to 12,288 elements, 1-D to 5-D, bf16 and f32, alone, under a dot, a 1x1 and a depthwise
convolution (``python benchmarks/tpu_tile_layouts.py``; tests/core/data/tpu_layouts.jsonl): every argument's size
equals this rule. So does every argument, inputs included, of XLA:TPU's programs for SANA, Wan 2.1 1.3B,
CogVideoX-5b, LTX-Video and SD3.5 under 2d (two blocks, 256², torch_xla's program: 65 to 83 arguments each;
SANA's and CogVideoX's are kept in tests/check/data), and SANA's weights per chip come to 1.7% more than their
shards (its 2240-wide Linears). Written by hand: XLA's layout assignment is inside libtpu, with no
Python API that answers for a shape without a compile.
"""

from __future__ import annotations

import math
from functools import lru_cache

LANES = 128  # the minor dim's tile
SUBLANES = 8  # the second-minor dim's tile, once it has 8 rows or more
VECTOR_TILES = (128, 256, 512, 1024)  # a 1-D array's tile sizes, in elements
MIN_ARRAY_BYTES = 512  # the smallest tile of any array: 128 lanes of 32 bits


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _rows(rows: int, itemsize: int) -> int:
    """The second-minor dim as tiled: a multiple of 8, or below 8 the power of two that holds it (two rows at least
    for a 2-byte type)."""
    if rows >= SUBLANES:
        return _round_up(rows, SUBLANES)
    return max(1 << (rows - 1).bit_length(), max(1, 4 // itemsize))


@lru_cache(maxsize=4096)
def tiled_elements(shape: tuple[int, ...], itemsize: int) -> int:
    """Elements XLA:TPU allocates for an array of `shape` and `itemsize` bytes per element (see the module)."""
    smallest = MIN_ARRAY_BYTES // itemsize
    if len(shape) <= 1:
        n = shape[0] if shape else 1
        return next((t for t in VECTOR_TILES if t >= smallest and n <= t), _round_up(n, VECTOR_TILES[-1]))
    best = None
    for minor in range(len(shape)):
        for second in range(len(shape)):
            if second == minor:
                continue
            rest = math.prod(n for d, n in enumerate(shape) if d not in (minor, second))
            size = rest * _rows(shape[second], itemsize) * _round_up(shape[minor], LANES)
            best = size if best is None else min(best, size)
    return best


def tiled_bytes(shape: tuple[int, ...], itemsize: int) -> int:
    """Bytes XLA:TPU allocates for an array of `shape` (see the module)."""
    return tiled_elements(tuple(shape), itemsize) * itemsize
