"""FLOP and parameter counts against published models; activation bytes against Korthikanti et al."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainsim.errors import UserError
from trainsim.plan.workload import Recompute, Transformer, preset


@pytest.mark.parametrize(
    ("name", "billions", "tol"),
    [
        ("gpt3-175b", 174.6, 0.002),  # Brown et al. 2020: 175B (174.6B with the 50257 vocabulary)
        ("llama2-7b", 6.74, 0.002),  # Touvron et al. 2023 / released checkpoint: 6,738,415,616
        ("llama2-70b", 68.98, 0.002),  # released checkpoint: 68,976,648,192
        ("bert-large", 0.336, 0.005),  # Devlin et al. 2019: 340M; 336M with pooler + MLM head, no NSP
        ("resnet50", 0.025557, 0.001),  # torchvision resnet50: 25,557,032
        ("vgg19", 0.143667, 0.001),  # torchvision vgg19: 143,667,240
    ],
)
def test_parameter_counts(name: str, billions: float, tol: float) -> None:
    assert preset(name).total_params() / 1e9 == pytest.approx(billions, rel=tol)


def test_exact_llama_counts() -> None:
    assert preset("llama2-7b").total_params() == 6_738_415_616
    assert preset("llama2-70b").total_params() == 68_976_648_192


def test_cnn_macs() -> None:
    r50 = preset("resnet50")
    assert r50.macs_per_sample() / 1e9 == pytest.approx(4.09, rel=0.01)  # ~4.1 GMACs at 224x224
    assert preset("vgg19").macs_per_sample() / 1e9 == pytest.approx(19.6, rel=0.01)


def test_gpt_flops_match_megatron_formula() -> None:
    # Narayanan et al. SC'21 eq. 3 without recomputation: 72 B s l h^2 (1 + s/6h + V/12lh)
    m = Transformer(arch="gpt", layers=24, hidden=2304, heads=24, seq=2048, vocab=51200)
    s, n_layers, h, V = 2048, 24, 2304, 51200
    expected = 72 * s * n_layers * h * h * (1 + s / (6 * h) + V / (12 * n_layers * h))
    assert m.model_flops_per_sample() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_activation_bytes_match_korthikanti(tp: int) -> None:
    m = preset("gpt3-175b")
    assert isinstance(m, Transformer)
    s, b, h, a = 2048, 1, 12288, 96
    no_sp = m.layer_costs(mb=b, tp=tp, sp=False, cp=1)[1].act_bytes
    assert no_sp[Recompute.NONE] == pytest.approx(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))
    assert no_sp[Recompute.FULL] == pytest.approx(2 * s * b * h)
    if tp > 1:
        sp = m.layer_costs(mb=b, tp=tp, sp=True, cp=1)[1].act_bytes
        assert sp[Recompute.NONE] == pytest.approx(s * b * h / tp * (34 + 5 * a * s / h))
        assert sp[Recompute.SELECTIVE] == pytest.approx(s * b * h / tp * 34)


def test_gqa_shrinks_kv_and_context_parallel_splits_tokens() -> None:
    m = preset("llama2-70b")
    assert isinstance(m, Transformer)
    blk = m.layer_costs(mb=1, tp=8, sp=True, cp=1)[1]
    qkv = next(o for o in blk.ops if o.name == "qkv")
    assert qkv.n == (64 + 2 * 8) * 128 // 8  # q heads + k,v heads (GQA, 8 kv heads) on one of 8 ranks
    cp2 = m.layer_costs(mb=1, tp=8, sp=True, cp=2)[1]
    assert next(o for o in cp2.ops if o.name == "qkv").m == qkv.m // 2


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        (dict(hidden=100, heads=3), "not divisible by heads"),
        (dict(layers=0), "layers"),
    ],
)
def test_bad_models(kw: dict[str, int], msg: str) -> None:
    base = dict(arch="gpt", layers=2, hidden=96, heads=4, seq=64, vocab=100)
    base.update(kw)
    with pytest.raises(UserError, match=msg):
        Transformer(**base)  # type: ignore[arg-type]


def test_tp_must_divide_heads() -> None:
    with pytest.raises(UserError, match="tp=64 does not divide heads=96"):
        preset("gpt3-175b").layer_costs(mb=1, tp=64, sp=False, cp=1)
    with pytest.raises(UserError, match="unknown model"):
        preset("gpt5")


def test_causal_convention_halves_the_attention_core_of_decoders_only() -> None:
    from trainsim.plan.workload import AttnFlops

    m = preset("llama3-8b")
    assert isinstance(m, Transformer)
    assert m.core_flops(1, AttnFlops.CAUSAL) == m.core_flops(1, AttnFlops.FULL) / 2 == 2.0 * 8192**2 * 4096
    full, causal = m.model_flops_per_sample(AttnFlops.FULL), m.model_flops_per_sample(AttnFlops.CAUSAL)
    assert full - causal == pytest.approx(3 * 32 * 2.0 * 8192**2 * 4096)
    bert = preset("bert-large")
    assert isinstance(bert, Transformer)
    assert bert.core_flops(1, AttnFlops.CAUSAL) == bert.core_flops(1, AttnFlops.FULL)
    # a causal flash kernel executes half the square: the layer's executed FLOPs count that half
    blk = m.layer_costs(mb=1, tp=1, sp=False, cp=1)[1]
    assert blk.core_flops == m.core_flops(1, AttnFlops.CAUSAL)


@pytest.mark.parametrize(
    ("name", "total", "active", "tol"),
    [
        ("mixtral-8x7b", 46.70, 12.88, 0.002),  # Jiang et al. 2024: 46.7B total, 12.9B active
        ("llama3-405b", 405.85, 405.85, 0.002),  # Llama 3 paper: 405B
        ("deepseek-v3-like", 671.03, 37.55, 0.001),  # DeepSeek-V3 report: 671B / 37B (latent attention, no MTP)
    ],
)
def test_moe_and_llama3_parameter_counts(name: str, total: float, active: float, tol: float) -> None:
    m = preset(name)
    assert isinstance(m, Transformer)
    assert m.total_params() / 1e9 == pytest.approx(total, rel=tol)
    assert m.active_params() / 1e9 == pytest.approx(active, rel=tol)


def test_expert_parallel_splits_experts_and_sends_routed_tokens() -> None:
    m = preset("mixtral-8x7b")
    one, four = (m.layer_costs(mb=1, tp=1, sp=False, cp=1, ep=e)[1] for e in (1, 4))
    assert one.expert_params == 8 * 3 * 4096 * 14336 and four.expert_params == one.expert_params // 4
    assert one.a2a_bytes == 0 and one.a2a_count == 0
    # each of 4096 tokens goes to top-2 experts: 2 x 4096 x 4096 x 2 B sent, 3/4 of it to other ranks
    assert four.a2a_bytes == pytest.approx(2 * 4096 * 4096 * 2 * 3 / 4) and four.a2a_count == 2
    padded = replace(m, capacity_factor=1.25).layer_costs(mb=1, tp=1, sp=False, cp=1, ep=4)[1]
    assert padded.a2a_bytes == pytest.approx(1.25 * four.a2a_bytes)
    with pytest.raises(UserError, match="--ep 3 does not divide experts=8"):
        m.layer_costs(mb=1, tp=1, sp=False, cp=1, ep=3)
    with pytest.raises(UserError, match="needs a mixture-of-experts"):
        preset("llama2-7b").layer_costs(mb=1, tp=1, sp=False, cp=1, ep=2)


def test_long_context_activations_with_and_without_recomputation() -> None:
    m = replace(preset("llama3-8b"), seq=131072)
    blk = m.layer_costs(mb=1, tp=8, sp=True, cp=8)[1]
    tok = 131072 // 8
    # full recomputation keeps only the block input: s/cp x h x 2 B / tp (sequence parallel)
    assert blk.act_bytes[Recompute.FULL] == 2 * tok * 4096 / 8
    # without it, flash attention keeps no s x s tensor: bytes stay linear in the sequence
    assert blk.act_bytes[Recompute.NONE] < 40 * tok * 4096 / 8 * 2
    with pytest.raises(UserError, match="--cp 3 does not divide the sequence length 131072"):
        m.layer_costs(mb=1, tp=8, sp=True, cp=3)


def test_eager_elementwise_bytes() -> None:
    """Eager Llama blocks move the bytes of PyTorch's reference RMSNorm, RoPE and SwiGLU step by step; fused
    ones one pass each. GEMMs and attention are the same either way, and GPT blocks do not change."""
    m = replace(preset("llama3-8b"), seq=4096)
    tok, h, hd, fn = 4096, 4096, 128, m.ffn
    fused = {o.name: o for o in m.layer_costs(mb=1, tp=1, sp=False, cp=1)[1].ops}
    eager = {o.name: o for o in m.layer_costs(mb=1, tp=1, sp=False, cp=1, eager=True)[1].ops}
    assert fused["norm1"].bytes == 4 * tok * h and eager["norm1"].bytes == 36 * tok * h
    assert fused["rope"].bytes == 4 * tok * (32 + 8) * hd and eager["rope"].bytes == 20 * tok * (32 + 8) * hd
    assert fused["act"].bytes == 6 * tok * fn and eager["act"].bytes == 10 * tok * fn
    for name in ("qkv", "flash_attn", "proj", "fc1", "fc2", "residual1"):
        assert fused[name] == eager[name]
    gpt = preset("gpt3-1.3b")
    assert gpt.layer_costs(mb=1, tp=1, sp=False, cp=1) == gpt.layer_costs(mb=1, tp=1, sp=False, cp=1, eager=True)


def _dsv3() -> Transformer:
    m = preset("deepseek-v3-like")
    assert isinstance(m, Transformer)
    return m


def test_latent_attention_block_parameters_by_hand() -> None:
    m = _dsv3()
    h = 7168
    attn = (h * 1536 + 1536  # query down projection + its RMSNorm
            + 1536 * 128 * (128 + 64)  # query up: 128 heads x (no-position 128 + rotary 64)
            + h * (512 + 64) + 512  # key/value latent + shared rotary key, latent RMSNorm
            + 512 * 128 * (128 + 128)  # key (no-position) and value up projections
            + 128 * 128 * h)  # output projection from 128 heads x value width 128  # fmt: skip
    assert attn == 187_107_328
    assert m.block_params() == attn + 2 * h + 3 * h * 18432  # first 3 layers: dense SwiGLU MLP
    # on 2 TP ranks the down projections and latent norms stay whole, the rest is split by heads
    rep = h * (1536 + 512 + 64) + 1536 + 512
    blk = m.layer_costs(mb=1, tp=2, sp=True, cp=1)[1]
    assert blk.params == (m.block_params() - rep) // 2 + rep


def test_latent_attention_flops_use_query_width_192_and_value_width_128() -> None:
    from trainsim.plan.workload import AttnFlops, OpKind

    m, s = _dsv3(), 4096
    assert m.core_flops(1) == 2.0 * s * s * 128 * (192 + 128)  # QK^T over 192, AV over 128: 2.86x width 56
    assert m.core_flops(1, AttnFlops.CAUSAL) == m.core_flops(1) / 2
    lin = 2.0 * s * (187_107_328 - 1536 - 512 + 3 * 7168 * 18432)
    assert m.block_flops(1) == pytest.approx(lin + m.core_flops(1), rel=1e-12)
    # one GPU's operators add up to the model's count: flash kernel on its 64 heads (causal half), the
    # down projection on its half of the tokens under sequence parallelism, up projections on its heads
    blk = m.layer_costs(mb=1, tp=2, sp=True, cp=1)[1]
    ops = {op.name: op for op in blk.ops}
    assert ops["flash_attn"].flops == 2.0 * 64 * s * s * 320 / 2 and ops["flash_attn"].k == 192
    assert ops["mla_down"].flops == 2.0 * (s // 2) * 7168 * (1536 + 512 + 64)
    gemm = sum(op.flops for op in blk.ops if op.kind == OpKind.GEMM)
    assert gemm * 2 == pytest.approx(lin, rel=1e-12)
    assert blk.core_flops == m.core_flops(1, AttnFlops.CAUSAL)
    # under context parallelism each rank receives the K (192 wide) and V (128 wide) of its heads
    cp2 = m.layer_costs(mb=1, tp=1, sp=False, cp=2)[1]
    assert cp2.cp_kv_bytes == 2 * 128 * (192 + 128) * s / 2
    # model FLOPs per sample: 3 dense + 58 MoE blocks and the head, 3x forward
    moe = m.block_flops(1, moe=True)
    assert m.model_flops_per_sample() == 3.0 * (3 * m.block_flops(1) + 58 * moe + m.head_flops())


def test_standard_attention_is_unchanged_by_the_latent_fields() -> None:
    m = preset("llama3-8b")
    assert isinstance(m, Transformer) and not m.mla
    h, kvd, f = 4096, 8 * 128, 14336
    assert m.block_params() == h * (h + 2 * kvd) + h * h + 2 * h + 3 * h * f
    assert m.core_flops(1) == 4.0 * 8192 * 8192 * h
    assert m.block_flops(1) == 2.0 * 8192 * (h * (h + 2 * kvd) + h * h + 3 * h * f) + m.core_flops(1)
    blk = m.layer_costs(mb=1, tp=2, sp=True, cp=2)[1]
    assert blk.params == m.block_params() // 2
    assert blk.cp_kv_bytes == 2 * 2 * 4 * 8192 * 128 / 2  # K and V of 4 local KV heads
    assert {op.name for op in blk.ops} >= {"qkv", "rope", "flash_attn", "proj"}


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        (dict(kv_lora=512), "needs qk_nope_dim, qk_rope_dim and v_head_dim > 0"),
        (dict(q_lora=1536), "need kv_lora > 0"),
        (dict(kv_lora=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, kv_heads=8), "no kv_heads"),
    ],
)
def test_bad_latent_attention(kw: dict[str, int], msg: str) -> None:
    with pytest.raises(UserError, match=msg):
        Transformer(arch="llama", layers=2, hidden=1024, heads=16, seq=128, vocab=1000, **kw)  # type: ignore[arg-type]
