"""KV cache types per side: where each side's type comes from (a request's options, a
Modelfile's parameters, the model's config, the server's), and the rule by which a side
llama.cpp would refuse falls back to f16 for that model alone, with one warning line."""

from __future__ import annotations

import pytest

from ollamatrio.api.bodies import merge_options
from ollamatrio.errors import InvalidRequestError
from ollamatrio.kv_cache import KvCacheTypes, requested_kv_types, usable_kv_types
from ollamatrio.modelfile import ModelfileError, format_modelfile, parse_modelfile
from ollamatrio.scheduler.options import needs_reload, resolve_load_options


@pytest.mark.parametrize(
    ("layers", "default", "expected"),
    [
        ([], "f16", ("f16", "f16")),
        ([], "Q8_0", ("q8_0", "q8_0")),
        ([{"kv_cache_type": "q8_0"}], "f16", ("q8_0", "q8_0")),
        ([{"kv_cache_type": "q8_0", "kv_cache_type_v": "f16"}], "f16", ("q8_0", "f16")),
        ([{"kv_cache_type_k": "q4_0"}], "q8_0", ("q4_0", "q8_0")),
        # A request's (or Modelfile's) both-sides type beats the config's one side.
        ([{"kv_cache_type": "f16"}, {"kv_cache_type_k": "q8_0"}], "q4_0", ("f16", "f16")),
        ([{"kv_cache_type_v": "f32"}, {"kv_cache_type": "q8_0"}], "f16", ("q8_0", "f32")),
        ([{"kv_cache_type": None}, {"kv_cache_type": "q5_1"}], "f16", ("q5_1", "q5_1")),
    ],
)
def test_each_side_from_the_first_layer_that_sets_it(layers, default, expected) -> None:  # type: ignore[no-untyped-def]
    types = requested_kv_types(layers, default)
    assert (types.k, types.v) == expected


@pytest.mark.parametrize(
    ("wanted", "flash", "dims", "used", "reason"),
    [
        (("q8_0", "q8_0"), True, (64, 64), ("q8_0", "q8_0"), None),
        (("q8_0", "f16"), False, (64, 64), ("q8_0", "f16"), None),
        (("f16", "q8_0"), False, (64, 64), ("f16", "f16"), "a quantized V cache (q8_0) needs"),
        (("q4_0", "q4_0"), False, (64, 64), ("q4_0", "f16"), "a quantized V cache (q4_0) needs"),
        (("bf16", "f32"), False, (64, 64), ("bf16", "f32"), None),
        (("q8_0", "q8_0"), True, (16, 16), ("f16", "f16"), "does not divide the head size 16"),
        (("q8_0", "f16"), True, (48, 16), ("f16", "f16"), "K cache type q8_0 does not divide"),
        (("q3_k", "f16"), True, (64, 64), ("f16", "f16"), "K cache type 'q3_k' is unknown"),
        (("q8_0", "q8_0"), True, (0, 0), ("q8_0", "q8_0"), None),  # head size unknown
    ],
)
def test_a_side_llama_cpp_would_refuse_falls_back_to_f16(  # type: ignore[no-untyped-def]
    wanted, flash, dims, used, reason
) -> None:
    types, warning = usable_kv_types(
        KvCacheTypes(*wanted), flash_attention=flash, head_dim_k=dims[0], head_dim_v=dims[1]
    )
    assert (types.k, types.v) == used
    if reason is None:
        assert warning is None
    else:
        assert warning is not None
        assert reason in warning
        assert "\n" not in warning
        assert warning.endswith(f"using {types}")


def test_both_sides_refused_make_one_warning() -> None:
    types, warning = usable_kv_types(
        KvCacheTypes("q8_0", "q4_0"), flash_attention=False, head_dim_k=16, head_dim_v=64
    )
    assert types == KvCacheTypes("f16", "f16")
    assert warning == (
        "kv cache type K q8_0, V q4_0 unusable: K cache type q8_0 does not divide the head "
        "size 16; a quantized V cache (q4_0) needs flash attention; using f16"
    )


# -- a request's options and a Modelfile's parameters --------------------------------------


def resolve(options, configured=KvCacheTypes()):  # type: ignore[no-untyped-def]
    return resolve_load_options(
        options, default_num_ctx=4096, context_length_configured=False, train_ctx=8192,
        num_parallel=1, embedding_only=False, kv_cache_types=configured,
    )  # fmt: skip


def test_options_override_the_configured_types_and_a_change_reloads() -> None:
    configured = KvCacheTypes("q8_0", "f16")
    loaded = resolve({}, configured)
    assert loaded.kv_cache_types == configured
    assert not needs_reload(loaded, resolve({}, configured))
    asked = resolve(merge_options({"kv_cache_type_v": "Q8_0"}), configured)
    assert asked.kv_cache_types == KvCacheTypes("q8_0", "q8_0")
    assert needs_reload(loaded, asked)
    assert resolve({"kv_cache_type": "q4_0"}, configured).kv_cache_types == KvCacheTypes(
        "q4_0", "q4_0"
    )


@pytest.mark.parametrize("value", ["q3_k", 8, ""])
def test_an_unknown_type_in_options_is_a_400(value: object) -> None:
    with pytest.raises(InvalidRequestError, match="option kv_cache_type_k must be one of f32"):
        merge_options({"kv_cache_type_k": value})


def test_modelfile_parameters_name_each_side() -> None:
    mf = parse_modelfile("FROM smol\nPARAMETER kv_cache_type Q8_0\nPARAMETER kv_cache_type_v f16\n")
    assert mf.parameters == {"kv_cache_type": "q8_0", "kv_cache_type_v": "f16"}
    assert "PARAMETER kv_cache_type q8_0\nPARAMETER kv_cache_type_v f16\n" in format_modelfile(mf)
    with pytest.raises(ModelfileError, match="unknown KV cache type 'q3_k'"):
        parse_modelfile("FROM smol\nPARAMETER kv_cache_type_k q3_k\n")
