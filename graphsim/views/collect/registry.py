"""The executor's registry: the kernels bound by op kind (generic, and per model family), the families' parameter
and cache initialisers, and the two values kernels exchange (:class:`Act`) or raise (:class:`Unsupported`).
:mod:`.execute` registers the generic kernels and imports the family modules (``kernels_mla``, ``kernels_v41``,
``kernels_dspark``), which register theirs here; none of them imports the executor."""
from __future__ import annotations

from typing import Callable

import attrs

from graphsim.core.errors import GraphsimError
from graphsim.core.ir import Op


class Unsupported(GraphsimError):
    """The executor has no kernel for an op of this plan (a failure category, not a bug)."""

    def __init__(self, op: Op | None, why: str):
        super().__init__(f"op[{op.name}]" if op is not None else "plan", why)


@attrs.frozen(eq=False)
class Act:
    """An activation: ``x`` [rows of token set ``ts``, width] (or a tuple for routing)."""

    x: object
    ts: str


#: op kind -> kernel(op, ctx, inputs: list[Act], state: dict, params: dict) -> Act | None
KERNELS: dict[str, Callable] = {}
#: model family (the Model class's ``family``) -> op kind -> kernel: a family's own kernels, bound before the
#: generic ones for that family's graphs (graphsim.views.collect.kernels_mla registers DeepSeek-V3's)
FAMILY_KERNELS: dict[str, dict[str, Callable]] = {}
#: model family -> {"params": init_params(compiled, seed), "caches": init_caches(ex, seed)[, "ids": init_ids(ex, seed)]}
FAMILY_INITS: dict[str, dict[str, Callable]] = {}
#: model family -> what its kernels run beyond text forwards whose prefix is on the device: "images" (the
#: vision stage of a request with image patches), "restores" (prefix hits copied in from host / disk memory)
FAMILY_RUNS: dict[str, frozenset] = {}
#: ops that read the forward's inputs (like an embedding reads the ids), not another op's output
INPUT_OPS = {"vision.patch_embed"}  # the pixel patches


def kernel(*kinds: str, family: str = ""):
    def deco(fn):
        for k in kinds:
            (FAMILY_KERNELS.setdefault(family, {}) if family else KERNELS)[k] = fn
        return fn
    return deco
