"""Linear layers whose weights are repacked once, after loading, for the CPU's GEMM library.

Decode multiplies one row (or a handful of rows) by every weight matrix, so on CPU it is bound
by how fast the GEMV/small-M GEMM streams the weights from memory.  Measured on the 2-core AVX2
host this project is developed on (fp32, SmolLM2-135M shapes, 30 layers cycled so nothing stays
in cache), microseconds per layer, plain ``F.linear`` -> oneDNN prepacked:

=================  ============  ============  ============
weight [out, in]   1 row         4 rows        8 rows
=================  ============  ============  ============
qkv 960 x 576      185 -> 121    335 -> 174    272 -> 226
gate_up 3072 x 576 563 -> 424    1210 -> 435   1275 -> 522
down 576 x 1536    223 -> 191    447 -> 256    483 -> 295
=================  ============  ============  ============

The 49152 x 576 LM head: 11.5 -> 5.7 ms for 1 row; for 8 rows 7.4 ms, where the transposed copy
this replaced took 30 ms.

Prefill (hundreds of rows) is within a few per cent either way, so one packed copy replaces the
dense weight rather than keeping both.  oneDNN only packs the dtypes the CPU computes natively
(fp32 always; bf16/fp16 with the matching instructions); anything else keeps ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def onednn_packs(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can be repacked for oneDNN's linear on this machine."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    if weight.dtype == torch.float32:
        return True
    probe = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}
    name = probe.get(weight.dtype)
    # these private probes differ across torch releases: a missing one means "don't pack"
    return name is not None and hasattr(ops, name) and bool(getattr(ops, name)())


class Linear(nn.Linear):
    """``nn.Linear`` that, after :meth:`pack_for_cpu`, multiplies with a oneDNN-prepacked weight.

    The hot path calls :meth:`run` rather than the module: ``nn.Module.__call__``'s hook machinery
    costs ~10 us a call, and a CPU decode step makes hundreds of such calls per token.
    """

    packed: torch.Tensor | None = None

    def pack_for_cpu(self) -> bool:
        """Replace the dense weight by oneDNN's packed copy (one copy in memory); returns whether it did.

        The dense ``weight`` attribute becomes ``None`` afterwards; a tied weight (the LM head sharing
        the embedding table) stays alive through the module that shares it.
        """
        if self.weight is None or not onednn_packs(self.weight):
            return False
        self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())
        self.weight = None
        return True

    def run(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            if torch.compiler.is_compiling():  # inductor lowers this op only for frozen constant weights
                return packed_linear(x, self.packed, self.bias)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(x)


@torch.library.custom_op("kvreuse::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The oneDNN-packed linear as an opaque op for ``torch.compile`` (``CausalLM.compile_decode``)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0])  # the packed weight keeps its [out, in] size
