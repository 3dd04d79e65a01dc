"""Round trips, exact wire sizes, error feedback and the registry of trainsim.compress."""

from __future__ import annotations

import math

import pytest
import torch

from trainsim.compress import make, make_codec, names, register_function
from trainsim.compress.bits import pack_codes, packed_bytes, per_byte, unpack_table
from trainsim.errors import UserError

SIZES = [1, 7, 8, 9, 1000, 4099, 70_001]


def wire_formula(name: str, n: int) -> int:
    k = max(1, min(n, math.ceil(n * 0.01)))
    k3 = max(1, min(n, math.ceil(n * 0.001)))
    return {
        "none": 4 * n,
        "fp16": 2 * n,
        "bf16": 2 * n,
        "onebit": 8 + math.ceil(n / 8),
        "signsgd": math.ceil(n / 8),
        "efsignsgd": 4 + math.ceil(n / 8),
        "tbq": 4 + math.ceil(n / 4),
        "terngrad": 4 + math.ceil(n / 4),
        "terngrad_minmax": 8 + math.ceil(n / 4),
        "qsgd": 4 * math.ceil(n / 512) + n,
        "topk": 8 * k,
        "randomk": 4 * k,
        "dgc": 8 * k3,
        "graddrop": 8 * k3,
    }[name]


BUILTIN = [n for n in names() if n not in ("powersgd",) and not n.startswith("test_")]


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 3, 8, 13, 64, 1001])
def test_pack_unpack_exact(bits: int, n: int) -> None:
    per = per_byte(bits)
    pad = (n + per - 1) // per * per
    codes = torch.zeros(pad, dtype=torch.uint8)
    codes[:n] = torch.randint(0, 1 << bits, (n,), dtype=torch.uint8)
    packed = torch.empty(packed_bytes(n, bits), dtype=torch.uint8)
    pack_codes(codes, bits, packed)
    assert packed.numel() == (n * bits + 7) // 8
    values = torch.arange(1 << bits, dtype=torch.float32)
    out = torch.empty(n)
    unpack_table(packed, values, bits, out)
    assert torch.equal(out, codes[:n].float())
    acc = torch.ones(n)
    unpack_table(packed, values, bits, acc, accumulate=True)
    assert torch.equal(acc, codes[:n].float() + 1)


def test_one_bit_layout_is_lsb_first() -> None:
    codes = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1], dtype=torch.uint8)
    packed = torch.empty(1, dtype=torch.uint8)
    pack_codes(codes, 1, packed)
    assert int(packed[0]) == 0b1000_0001


@pytest.mark.parametrize("name", BUILTIN)
@pytest.mark.parametrize("n", SIZES)
def test_exact_wire_bytes(name: str, n: int) -> None:
    c = make(name)
    wire = c.compress(torch.randn(n))
    assert wire.numel() * wire.element_size() == c.wire_bytes(n) == wire_formula(name, n)


def test_powersgd_wire_bytes() -> None:
    c = make("powersgd", rank=2)
    assert c.wire_bytes(4096 * 4096) == 4 * 2 * (4096 + 4096)
    assert c.compress(torch.randn(1000)).numel() * 1 == c.wire_bytes(1000)


def roundtrip(name: str, x: torch.Tensor, **kw: object) -> torch.Tensor:
    c = make(name, error_feedback=False, **kw)  # type: ignore[arg-type]
    return c.decompress(c.compress(x), x.numel())


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("name", "bound"),
    [("none", 0.0), ("fp16", 1e-3), ("bf16", 1e-2), ("onebit", 1.0), ("efsignsgd", 1.0), ("tbq", 1.0),
     ("topk", 1.0), ("randomk", 1.0), ("dgc", 1.0), ("graddrop", 1.0)],
)  # fmt: skip
def test_roundtrip_error_bound(name: str, bound: float) -> None:
    x = torch.randn(50_003)
    assert rel(roundtrip(name, x), x) <= bound + 1e-6


def test_signsgd_gives_signs() -> None:
    x = torch.randn(1001)
    assert torch.equal(roundtrip("signsgd", x), torch.where(x < 0, -1.0, 1.0))


@pytest.mark.parametrize("n", [1000, 200_000])
def test_topk_is_exact(n: int) -> None:
    x = torch.randn(n)
    y = roundtrip("topk", x, ratio=0.01)
    k = math.ceil(n * 0.01)
    top = torch.topk(x.abs(), k).indices
    assert torch.equal(y[top], x[top])
    assert int((y != 0).sum()) == k


@pytest.mark.parametrize("name", ["dgc", "graddrop"])
def test_sampled_threshold_sends_at_most_k_true_values(name: str) -> None:
    x = torch.randn(100_000)
    y = roundtrip(name, x, ratio=0.01)
    kept = y != 0
    assert 0 < int(kept.sum()) <= 1000
    assert torch.equal(y[kept], x[kept])
    assert float(x[kept].abs().min()) > float(x.abs().median())  # it keeps large entries


@pytest.mark.parametrize(
    ("name", "kw"), [("terngrad", {}), ("qsgd", {"bits": 4}), ("terngrad_minmax", {"bits": 2})]
)
def test_stochastic_quantisers_are_unbiased(name: str, kw: dict[str, int]) -> None:
    x = torch.randn(2000)
    c = make(name, error_feedback=False, **kw)  # type: ignore[arg-type]
    total = torch.zeros_like(x)
    trials = 400
    for step in range(trials):
        c.step = step
        total += c.decompress(c.compress(x), x.numel())
    assert rel(total / trials, x) < 0.15
    c.step = 0
    assert torch.equal(c.decompress(c.compress(x), 2000), c.decompress(c.compress(x), 2000))  # seeded


def test_minmax_deterministic_rounding_bound() -> None:
    x = torch.randn(5000)
    y = roundtrip("terngrad_minmax", x, bits=4, random=False)
    gap = float((x.max() - x.min()) / 15)
    assert float((y - x).abs().max()) <= gap / 2 + 1e-5


def test_powersgd_recovers_low_rank() -> None:
    a, b = torch.randn(80, 2), torch.randn(2, 80)  # the codec views 6400 elements as 80 x 80
    m = (a @ b).reshape(-1)
    c = make("powersgd", rank=2, error_feedback=False)
    for _ in range(3):  # warm start: each step is one more power iteration
        y = c.decompress(c.compress(m), m.numel())
    assert rel(y, m) < 1e-3


@pytest.mark.parametrize(
    "name", ["onebit", "efsignsgd", "tbq", "topk", "randomk", "signsgd", "qsgd", "powersgd"]
)
def test_error_feedback_sums_to_true_gradient(name: str) -> None:
    """With EF: sum of what was sent + the final residual == sum of the true gradients."""
    c = make(name, error_feedback=True)
    n, steps = 3000, 20
    sent = torch.zeros(n)
    true = torch.zeros(n)
    for step in range(steps):
        c.step = step
        g = torch.randn(n, generator=torch.Generator().manual_seed(step))
        true += g
        sent += c.decompress(c.compress(g, key="w"), n, key="w")
    residual = c.workspace("w").get("ef", n)
    assert rel(sent + residual, true) < 1e-5


def test_graddrop_residual_identity() -> None:
    c = make("graddrop", ratio=0.01)
    n = 5000
    sent, true = torch.zeros(n), torch.zeros(n)
    for _ in range(10):
        g = torch.randn(n)
        true += g
        sent += c.decompress(c.compress(g, key=1), n, key=1)
    assert rel(sent + c.workspace(1).get("v", n), true) < 1e-5


def test_dgc_warmup_grows_sparsity() -> None:
    c = make("dgc", ratio=0.001, warmup_steps=100)
    sizes = []
    for step in (0, 50, 100):
        c.step = step
        sizes.append(c.wire_bytes(1_000_000))
    assert sizes[0] > sizes[1] > sizes[2] == 8 * 1000


def test_bad_input_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"unknown compression algorithm 'nope'.*onebit"):
        make("nope")
    with pytest.raises(UserError, match="ratio"):
        make("topk", ratio=0.0)
    with pytest.raises(UserError, match="ratio"):
        make("dgc", ratio=1.5)
    with pytest.raises(UserError, match="rank"):
        make("powersgd", rank=0)
    with pytest.raises(UserError, match="bits"):
        make("qsgd", bits=3)
    with pytest.raises(UserError, match="bad options"):
        make("onebit", ratio=0.1)


def test_user_algorithm_in_a_few_lines() -> None:
    @register_function("test_halfsign")
    def encode(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x > 0), x.abs().mean().reshape(1)

    @encode.decoder
    def decode(parts: tuple[torch.Tensor, ...] | list[torch.Tensor], numel: int) -> torch.Tensor:
        pos, scale = parts
        return (pos.float() * 2 - 1) * scale

    assert "test_halfsign" in names()
    c = make("test_halfsign")
    x = torch.randn(1003)
    wire = c.compress(x)
    assert c.wire_bytes(1003) == wire.numel() == 1008 + 4  # bool part padded to 8 bytes, then fp32
    y = c.decompress(wire, 1003)
    assert torch.allclose(y.abs(), x.abs().mean().expand(1003))
    codec = make_codec("test_halfsign")
    assert codec.name == "test_halfsign"


def test_auto_compile_keeps_small_gradients_eager() -> None:
    from trainsim.compress.base import Compressor, FunctionCodec

    def enc(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.half(),)

    def dec(parts: tuple[torch.Tensor, ...] | list[torch.Tensor], numel: int) -> torch.Tensor:
        return parts[0].float()

    codec = FunctionCodec("test_auto", enc, dec, compile="auto")
    c = Compressor(codec)
    x = torch.randn(100)
    assert torch.allclose(c.decompress(c.compress(x), 100), x, atol=1e-2)
    assert codec.compile_choices == {100: False}  # under AUTO_MIN_NUMEL: never compiled
    with pytest.raises(UserError, match="compile"):
        FunctionCodec("test_bad", enc, dec, compile="sometimes")
