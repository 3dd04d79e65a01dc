"""FLOP and parameter counts against published models; activation bytes against Korthikanti et al."""

from __future__ import annotations

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
