"""Which type each tensor of a quantized model gets: Ollama's rules, with numpy's reach.

Ollama (``server/quantization.go`` before it handed the work to ``llama-quantize``, whose
``llama_tensor_get_type`` it ported) quantizes every weight matrix to the type asked for,
except:

- tensors that are not matrices (norms, biases: anything 1-D) and a list of small or
  sensitive ones (``*_norm``, expert routers, position embeddings, convolution kernels);
- the output projection (``output.weight``, or ``token_embd.weight`` when the model ties
  its output to the embeddings), which gets Q6_K — here Q8_0, since the ``gguf`` package
  quantizes no K-quant; Q8_0 is what llama.cpp itself falls back to for Q6_K;
- in a model with 8 experts, ``attn_k`` and ``attn_v``, which get Q8_0;
- a matrix whose rows are not a whole number of the type's blocks, which gets F16.

For a float target (F32, F16, BF16) every weight matrix simply takes that type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidRequestError
from ..gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

T = GGMLQuantizationType


@dataclass(frozen=True)
class Target:
    """A type a model can be quantized to: its name as Ollama prints it, the GGUF file type
    it gives, and the tensor type of its weight matrices."""

    name: str
    file_type: LlamaFileType
    tensor_type: GGMLQuantizationType

    @property
    def quantized(self) -> bool:
        return self.tensor_type not in _FLOATS


_FLOATS = (T.F32, T.F16, T.BF16)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("F32", LlamaFileType.ALL_F32, T.F32),
        Target("F16", LlamaFileType.MOSTLY_F16, T.F16),
        Target("BF16", LlamaFileType.MOSTLY_BF16, T.BF16),
        Target("Q8_0", LlamaFileType.MOSTLY_Q8_0, T.Q8_0),
        Target("Q4_0", LlamaFileType.MOSTLY_Q4_0, T.Q4_0),
        Target("Q4_1", LlamaFileType.MOSTLY_Q4_1, T.Q4_1),
        Target("Q5_0", LlamaFileType.MOSTLY_Q5_0, T.Q5_0),
        Target("Q5_1", LlamaFileType.MOSTLY_Q5_1, T.Q5_1),
    )
}
#: The file types a model can be quantized from (Ollama's rule).
SOURCES: dict[int, str] = {
    LlamaFileType.ALL_F32: "F32",
    LlamaFileType.MOSTLY_F16: "F16",
    LlamaFileType.MOSTLY_BF16: "BF16",
}
ONLY_FLOAT_SOURCES = "quantization is only supported for F16, BF16 and F32 models"


def parse_target(requested: str) -> Target:
    """The target named by ``quantize`` (any case; ``Q4_K`` aside, as Ollama's names); a
    400 naming the supported types otherwise."""
    name = requested.upper()
    target = TARGETS.get(name)
    if target is None:
        supported = ", ".join(TARGETS)
        raise InvalidRequestError(
            f"unsupported quantization type {name} - supported types are {supported}"
        )
    return target


# Ollama's newType: names that stay as they are, whatever the target.
_KEPT_PARTS = (
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_inp_shexp.weight",
    "ssm_conv1d.weight",
    "shortconv.conv.weight",
    "time_mix_first.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    "per_layer_token_embd.weight",
    "mm.",
)
_KEPT_NAMES = ("position_embd.weight", "token_types.weight")


@dataclass(frozen=True)
class ModelShape:
    """What the rules need to know of the whole model."""

    has_output: bool  # False: token_embd doubles as the output projection
    expert_count: int = 0


def tensor_type(
    name: str,
    shape: Sequence[int],
    current: GGMLQuantizationType,
    target: Target,
    model: ModelShape,
) -> GGMLQuantizationType:
    """The type tensor ``name`` (GGUF ``ne`` order: ``shape[0]`` is the row length) gets."""
    if not _quantizable(name, shape) or current not in _FLOATS:
        return current
    wanted = target.tensor_type
    if target.quantized:
        if name == "output.weight" or (not model.has_output and name == "token_embd.weight"):
            wanted = T.Q8_0  # Ollama: Q6_K (no K-quant here); llama.cpp's fallback for it
        elif model.expert_count == 8 and ("attn_v.weight" in name or "attn_k.weight" in name):
            wanted = T.Q8_0
        if shape[0] % GGML_QUANT_SIZES[wanted][0]:
            wanted = T.F16
    return wanted


def _quantizable(name: str, shape: Sequence[int]) -> bool:
    return (
        name.endswith("weight")
        and len(shape) >= 2
        and not name.startswith(("v.", "a."))
        and name not in _KEPT_NAMES
        and not any(part in name for part in _KEPT_PARTS)
    )
