"""Which type each tensor of a quantized model gets: Ollama's rules.

Ollama (``server/quantization.go``, ``getTensorNewType``: its port of llama.cpp's
``llama_tensor_get_type``, trimmed to the types it makes) quantizes every weight matrix to
the type asked for, except:

- tensors that are not matrices (norms, biases: anything 1-D) and a list of small or
  sensitive ones (``*_norm``, expert routers, position embeddings, convolution kernels);
- the output projection (``output.weight``, or ``token_embd.weight`` when the model ties
  its output to the embeddings), which gets Q6_K (Q8_0 for a Q8_0 target, or when its rows
  are not whole 256-value blocks);
- for the K mixes: ``attn_v`` and ``ffn_down`` of some layers, which get more bits (Q4_K_M:
  Q6_K for the first and last eighth of the layers and every third between; Q4_K_S: Q5_K
  for the first four ``attn_v`` and the first eighth of ``ffn_down``); ``attn_qkv`` Q5_K in
  Q4_K_M; Qwen3-Next/3.5's attention, SSM and expert tensors a fixed table;
- in a model with 8 experts, ``attn_k`` and ``attn_v``, which get Q8_0 (and ``attn_output``
  Q5_K in the K mixes); the MLA projections (``attn_k_b``, ``attn_q_a``, ...) Q8_0;
- a matrix whose rows are not a whole number of the type's blocks falls back as Ollama does
  (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0), and to F16 if that still does not fit.

The K types are made by ggml (:mod:`.ggml_quants`): without the engine's library a K target
is refused and the output projection of a legacy target gets Q8_0 (Q6_K's fallback) as
before.  For a float target (F32, F16, BF16) every weight matrix simply takes that type
(Ollama would make the output Q6_K there too: a float target is not a quantization here).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import InvalidRequestError
from ..gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

T = GGMLQuantizationType
F = LlamaFileType


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

    @property
    def k_mix(self) -> bool:
        """A K-quant mix (made by ggml only)."""
        return self.tensor_type in _K_TYPES


_FLOATS = (T.F32, T.F16, T.BF16)
_K_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("F32", F.ALL_F32, T.F32),
        Target("F16", F.MOSTLY_F16, T.F16),
        Target("BF16", F.MOSTLY_BF16, T.BF16),
        Target("Q8_0", F.MOSTLY_Q8_0, T.Q8_0),
        Target("Q4_0", F.MOSTLY_Q4_0, T.Q4_0),
        Target("Q4_1", F.MOSTLY_Q4_1, T.Q4_1),
        Target("Q5_0", F.MOSTLY_Q5_0, T.Q5_0),
        Target("Q5_1", F.MOSTLY_Q5_1, T.Q5_1),
        Target("Q4_K_S", F.MOSTLY_Q4_K_S, T.Q4_K),
        Target("Q4_K_M", F.MOSTLY_Q4_K_M, T.Q4_K),
    )
}
#: Other names Ollama takes for a target.
_ALIASES = {"Q4_K": "Q4_K_M"}
#: The file types a model can be quantized from (Ollama's rule).
SOURCES: dict[int, str] = {
    F.ALL_F32: "F32",
    F.MOSTLY_F16: "F16",
    F.MOSTLY_BF16: "BF16",
}
ONLY_FLOAT_SOURCES = "quantization is only supported for F16, BF16 and F32 models"


def k_quants_available() -> bool:
    """Whether ggml's quantizer can be had here (the engine's library, checked)."""
    from .ggml_quants import ggml_quantizer  # numpy and ctypes: only when it matters

    return ggml_quantizer() is not None


def parse_target(requested: str) -> Target:
    """The target named by ``quantize`` (any case; Ollama's names); a 400 naming the
    supported types otherwise, the K mixes among them only where ggml can make them."""
    name = requested.upper()
    target = TARGETS.get(_ALIASES.get(name, name))
    if target is not None and target.k_mix and not k_quants_available():
        target = None
    if target is None:
        supported = ", ".join(
            t.name for t in TARGETS.values() if not t.k_mix or k_quants_available()
        )
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
# Counted as value projections (Ollama's nAttnV).
_ATTN_V_PARTS = ("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight")
_MLA_PARTS = (
    "attn_k_b.weight",
    "attn_v_b.weight",
    "attn_kv_a_mqa.weight",
    "attn_q_a.weight",
    "attn_q_b.weight",
)
# Qwen3-Next and Qwen3.5 in a K mix: a fixed type per tensor suffix (Ollama's table).
_QWEN3_LINEAR_ATTN = ("qwen3next", "qwen35", "qwen35moe")
_QWEN3_LINEAR_TYPES = {
    ".attn_v.weight": T.Q6_K,
    ".ffn_down_exps.weight": T.Q6_K,
    ".ffn_down_shexp.weight": T.Q6_K,
    **{
        f".{part}.weight": T.Q4_K
        for part in (
            "attn_q",
            "attn_k",
            "attn_output",
            "attn_qkv",
            "attn_gate",
            "ssm_ba",
            "ssm_beta",
            "ssm_alpha",
            "ssm_out",
            "ffn_gate_exps",
            "ffn_gate_shexp",
            "ffn_up_exps",
            "ffn_up_shexp",
        )
    },
}
# A type whose blocks do not fit a row: Ollama's next choice (then F16).
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class ModelShape:
    """What the rules need to know of the whole model."""

    has_output: bool  # False: token_embd doubles as the output projection
    expert_count: int = 0
    architecture: str = ""
    attn_v_count: int = 0  # attn_v (attn_qkv, attn_kv_b) tensors: Ollama's nAttnV
    layer_count: int = 0  # blk.N layers: Ollama's nFfnDown

    @classmethod
    def of(
        cls, names: Sequence[str], *, expert_count: int = 0, architecture: str = ""
    ) -> ModelShape:
        """The shape of a model with tensors ``names`` (counted as Ollama counts)."""
        return cls(
            has_output="output.weight" in names,
            expert_count=expert_count,
            architecture=architecture,
            attn_v_count=sum(any(p in n for p in _ATTN_V_PARTS) for n in names),
            layer_count=len({m.group(1) for n in names if (m := _LAYER.match(n))}),
        )


def more_bits(index: int, count: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of ``count`` layers and
    every third layer between."""
    return index < count // 8 or index >= 7 * count // 8 or (index - count // 8) % 3 == 2


def tensor_type(
    name: str,
    shape: Sequence[int],
    current: GGMLQuantizationType,
    target: Target,
    model: ModelShape,
    *,
    index: int = 0,
    k_quants: bool = True,
) -> GGMLQuantizationType:
    """The type tensor ``name`` (GGUF ``ne`` order: ``shape[0]`` is the row length) gets;
    ``index`` is its place among the model's ``attn_v`` (or ``ffn_down``) tensors quantized
    before it; ``k_quants`` whether ggml can make the K types."""
    if not _quantizable(name, shape) or current not in _FLOATS:
        return current
    if not target.quantized:
        return target.tensor_type
    wanted = target.tensor_type
    fixed = _qwen3_linear_type(name, target, model)
    if fixed is not None:
        return _fitting(fixed, shape[0])
    if name == "output.weight" or (not model.has_output and name == "token_embd.weight"):
        if shape[0] % GGML_QUANT_SIZES[T.Q6_K][0] or not k_quants:
            wanted = T.Q8_0
        elif wanted != T.Q8_0:
            wanted = T.Q6_K
    elif "attn_v.weight" in name:
        if target.name == "Q4_K_M" and more_bits(index, model.attn_v_count):
            wanted = T.Q6_K
        elif target.name == "Q4_K_S" and index < 4:
            wanted = T.Q5_K
        if model.expert_count == 8:
            wanted = T.Q8_0
    elif "attn_k.weight" in name:
        if model.expert_count == 8:
            wanted = T.Q8_0
    elif any(part in name for part in _MLA_PARTS):
        wanted = T.Q8_0
    elif "ffn_down" in name:
        if target.name == "Q4_K_M" and more_bits(index, model.layer_count):
            wanted = T.Q6_K
        elif target.name == "Q4_K_S" and index < model.layer_count // 8:
            wanted = T.Q5_K
    elif "attn_output.weight" in name:
        if model.expert_count == 8 and target.k_mix:
            wanted = T.Q5_K
    elif "attn_qkv.weight" in name and target.name == "Q4_K_M":
        wanted = T.Q5_K
    return _fitting(wanted, shape[0])


@dataclass
class TypePlanner:
    """:func:`tensor_type` for a model's tensors in file order, counting the ``attn_v``
    and ``ffn_down`` tensors as Ollama does (its ``quantizeState``)."""

    target: Target
    model: ModelShape
    k_quants: bool = True
    _attn_v: int = field(default=0, init=False)
    _ffn_down: int = field(default=0, init=False)

    def type_of(
        self, name: str, shape: Sequence[int], current: GGMLQuantizationType
    ) -> GGMLQuantizationType:
        index = 0
        counted = (
            _quantizable(name, shape)
            and current in _FLOATS
            and self.target.quantized
            and _qwen3_linear_type(name, self.target, self.model) is None
        )
        is_output = name == "output.weight" or (
            not self.model.has_output and name == "token_embd.weight"
        )
        if counted and not is_output and "attn_v.weight" in name:
            index, self._attn_v = self._attn_v, self._attn_v + 1
        elif counted and not is_output and "ffn_down" in name:
            index, self._ffn_down = self._ffn_down, self._ffn_down + 1
        return tensor_type(
            name, shape, current, self.target, self.model, index=index, k_quants=self.k_quants
        )


def _qwen3_linear_type(name: str, target: Target, model: ModelShape) -> GGMLQuantizationType | None:
    if not target.k_mix or model.architecture not in _QWEN3_LINEAR_ATTN:
        return None
    return next((t for s, t in _QWEN3_LINEAR_TYPES.items() if name.endswith(s)), None)


def _fitting(wanted: GGMLQuantizationType, width: int) -> GGMLQuantizationType:
    """``wanted``, or Ollama's fallback when a row is not a whole number of its blocks."""
    if width % GGML_QUANT_SIZES[wanted][0]:
        wanted = _FALLBACK.get(wanted, wanted)
    if width % GGML_QUANT_SIZES[wanted][0]:
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
