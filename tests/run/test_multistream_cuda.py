"""The two-stream runner on a CUDA device (marked ``gpu``; CI has no GPU, run it on one).

    python -m pytest -m gpu tests/run/test_multistream_cuda.py -q

W and the updates run on a second stream with device-side waits; the losses must equal PyTorch's
own loop on the same GPU. Tolerance 1e-4 absolute over 30 steps: cuDNN/cuBLAS may choose different
algorithms for the explicit weight-gradient calls than autograd does (different summation order), so
float32 rounding differs from the first step on; 1e-4 is about 40 ulps of a loss near 2.3.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainsim.models.zoo import ZooSpec, build_with_batches  # noqa: E402
from trainsim.run.multistream import TwoStreamTrainer, measure_step_ms  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here"),
]


def _losses(name: str, smap: object, steps: int, native: bool = False) -> list[float]:
    from torch import nn

    spec = ZooSpec(batch_size=64, width=256)
    net, batches = build_with_batches(name, seed=0, spec=spec)
    net = net.cuda()
    data = [tuple(t.cuda() for t in batches(s)) for s in range(steps)]
    if native:
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        out = []
        for x, y in data:
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.detach())
        return [float(v) for v in out]
    tr = TwoStreamTrainer(net, smap)  # type: ignore[arg-type]
    got = [tr.step(x, y) for x, y in data]  # no host sync inside: streams really overlap
    tr.flush()
    torch.cuda.synchronize()
    return [float(v) for v in got]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_two_streams_train_like_torch(name: str) -> None:
    torch.backends.cudnn.deterministic = True
    n = len(list(build_with_batches(name, spec=ZooSpec(batch_size=2, width=8))[0].children()))
    ref = _losses(name, None, 30, native=True)
    maps = [
        None,
        [("BWD", i) for i in range(n)],
        [("FWD", 0)] + [("FWD", i - 1) if i % 2 else ("BWD", i) for i in range(1, n)],
    ]
    for smap in maps:
        assert _losses(name, smap, 30) == pytest.approx(ref, abs=1e-4), smap


def test_measure_runs_every_mode() -> None:
    for smap in (None, [("BWD", i) for i in range(6)]):
        assert measure_step_ms("cnn", 64, smap, steps=5, warmup=2) > 0
