"""The collectives' codes, one table row each, and how many elements a rank contributes per destination.

A mode code names a collective in plan keys and kernels ("ar", "ag", ...); the row gives its public
name (for messages) and the Config field that picks its kernel.
"""
from __future__ import annotations

from typing import NamedTuple


class Mode(NamedTuple):
    name: str                 # the public call
    variant: str | None       # the Config field that picks its kernel (None: one kernel)


MODES = {
    "ar": Mode("all_reduce", "all_reduce_variant"),
    "ag": Mode("all_gather", "all_gather_variant"),
    "rs": Mode("reduce_scatter", "reduce_scatter_variant"),
    "rst": Mode("reduce_scatter", "reduce_scatter_variant"),  # Iris's layout (out shaped as inp)
    "a2a": Mode("all_to_all", "all_to_all_variant"),
    "bc": Mode("broadcast", None),
}
# modes whose chunk is out's size (a rank's share of what it receives), and all_to_all's: a column block
OUT_SIZED = ("rs", "scatter", "p2p")


def elements(mode: str, out, inp, members: int) -> int:
    """Elements each rank contributes per destination over `members` ranks: its share of out (rs,
    scatter, p2p), one column block (a2a), nothing (barrier), else all of inp."""
    if mode in OUT_SIZED:
        return out.numel()
    if mode == "a2a":
        return inp.numel() // members
    return 0 if mode == "barrier" else inp.numel()
