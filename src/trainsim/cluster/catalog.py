"""Catalog of accelerators and links, every figure with its source.

    >>> from trainsim.cluster.catalog import device, link
    >>> device("a100-80gb").peak_tflops["bf16"], link("ib-hdr").bw_gbyte_s
    (312.0, 25.0)

Rates are *dense* peaks (no 2:4 sparsity) in TFLOP/s; memory bandwidth in GB/s (10^9 bytes/s), memory
size in GiB as the vendor states it (GB on datasheets). Link bandwidth ``bw_gbyte_s`` is GB/s (10^9 bytes/s)
*per direction*; ``latency_us`` is the one-way per-message latency an alpha-beta model uses.
A dtype a device does not accelerate falls back to its FP32 rate (``Device.tflops``).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from trainsim.errors import UserError

DTYPES = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One accelerator (or CPU) model."""

    name: str
    """catalog key, lower case, e.g. ``"h100-sxm"``"""
    peak_tflops: dict[str, float]
    """dense peak per dtype (subset of ``DTYPES``), TFLOP/s"""
    mem_bw_gbps: float
    """memory bandwidth, GB/s"""
    mem_gib: float
    """memory size as stated by the vendor, GB"""
    source: str
    """where the figures come from"""

    def __post_init__(self) -> None:
        if "fp32" not in self.peak_tflops:
            raise UserError(f"device {self.name!r}: peak_tflops needs an 'fp32' entry")
        for k, v in self.peak_tflops.items():
            if k not in DTYPES:
                raise UserError(f"device {self.name!r}: unknown dtype {k!r}; expected one of {', '.join(DTYPES)}")
            if not v > 0:
                raise UserError(f"device {self.name!r}: peak_tflops[{k!r}]={v!r}; expected > 0")
        if not self.mem_bw_gbps > 0 or not self.mem_gib > 0:
            raise UserError(f"device {self.name!r}: memory bandwidth and size must be > 0")

    def tflops(self, dtype: str = "fp32") -> float:
        """Peak rate for ``dtype``; FP32's when the device has no faster path for it."""
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        return self.peak_tflops.get(dtype, self.peak_tflops["fp32"])

    @property
    def ridge_flop_per_byte(self) -> float:
        """Roofline ridge point at FP32: arithmetic intensity above which a kernel is compute-bound."""
        return self.peak_tflops["fp32"] * 1e12 / (self.mem_bw_gbps * 1e9)


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One kind of link, per direction."""

    name: str
    """catalog key, e.g. ``"pcie4-x16"``, ``"eth-100g"``"""
    bw_gbyte_s: float = 0.0
    """bandwidth per direction, GB/s (10^9 bytes/s)"""
    latency_us: float
    """one-way latency per message (alpha), microseconds"""
    source: str = field(default="")
    """where the figures come from"""
    bw_gbps: InitVar[float | None] = None
    """``bw_gbyte_s``'s former name, for callers and calibration files not yet renamed; reads as None"""

    def __post_init__(self, bw_gbps: float | None) -> None:
        if bw_gbps is not None:
            object.__setattr__(self, "bw_gbyte_s", bw_gbps)
        if not self.bw_gbyte_s > 0:
            raise UserError(f"link {self.name!r}: bandwidth {self.bw_gbyte_s!r} GB/s; expected > 0")
        if not self.latency_us >= 0:
            raise UserError(f"link {self.name!r}: latency {self.latency_us!r} us; expected >= 0")

    @property
    def bytes_per_us(self) -> float:
        return self.bw_gbyte_s * 1e3


# --------------------------------------------------------------------------- sources
_V100 = "NVIDIA V100 datasheet (SXM2), https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
_A100 = "NVIDIA A100 datasheet (SXM), https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_H100 = "NVIDIA H100 datasheet (SXM5; dense = half the sparse figures), https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "NVIDIA H200 product page (SXM; dense = half the sparse figures), https://www.nvidia.com/en-us/data-center/h200/"
_TURING = "NVIDIA Turing architecture whitepaper, Table 1 (RTX 2080 Ti reference clocks), https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf"
_THIS_CPU = (
    "measured on this machine (2 vCPU AMD EPYC, KVM) on 2026-11-22 02:41 UTC (load average 1.35) with torch.mm 2048x2048 on 2 threads and"
    " a 256 MiB tensor copy (read + write bytes), the method of `benchmarks/cluster_cpu_peak.py` (an inline run of the"
    " same code, before the script existed); memory size from /proc/meminfo"
)
_PCIE = "PCI-SIG specifications via https://en.wikipedia.org/wiki/PCI_Express#Comparison_table (x16, per direction)"
_NVLINK = "NVIDIA NVLink page (total bidirectional per GPU / 2), https://www.nvidia.com/en-us/data-center/nvlink/"
_IB = "InfiniBand Trade Association roadmap (4x port data rate), https://www.infinibandta.org/infiniband-roadmap/"
_ETH = "IEEE 802.3 nominal line rates (1/10/25/100/200/400GBASE)"
# Per-hop latencies: NCCL's own ring/Simple hardware latencies, NVIDIA/nccl src/graph/tuning.cc hwLat
# (commit 01afd20): NVLink 3.4 us, PCI 5.7 us, NET 9.6 us. For kernel TCP over Ethernet no datasheet gives
# a figure; 25 us is an assumed default (no source) that `trainsim calibrate` is meant to replace.
_NCCL_LAT = "latency: NVIDIA/nccl src/graph/tuning.cc hwLat ring/Simple (commit 01afd20)"
_TCP_LAT = "latency: assumed default for kernel TCP (no source), replace with `trainsim calibrate`"

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # V100 SXM2: 15.7 FP32, 125 FP16 tensor; no TF32/BF16 hardware; 900 GB/s HBM2, 32 GB
        Device(name="v100", peak_tflops={"fp32": 15.7, "fp16": 125.0}, mem_bw_gbps=900.0, mem_gib=32.0,
               source=_V100),  # fmt: skip
        # A100 SXM: 19.5 FP32, 156 TF32, 312 BF16/FP16 dense; 1,555 GB/s (40 GB) / 2,039 GB/s (80 GB)
        Device(name="a100-40gb", peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
               mem_bw_gbps=1555.0, mem_gib=40.0, source=_A100),  # fmt: skip
        Device(name="a100-80gb", peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
               mem_bw_gbps=2039.0, mem_gib=80.0, source=_A100),  # fmt: skip
        # H100 SXM5: 67 FP32, 494.7 TF32, 989.5 BF16/FP16 dense (989/1,979 with sparsity); 3.35 TB/s, 80 GB
        Device(name="h100-sxm", peak_tflops={"fp32": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5},
               mem_bw_gbps=3350.0, mem_gib=80.0, source=_H100),  # fmt: skip
        # H100 96 GB HBM2e at 500 W (Meta Grand Teton; pytorch/torchtitan docs/performance.md): 2.4 TB/s; peak
        # "between SXM and NVL" (989 and 835 dense BF16), not stated: the midpoint is assumed, as in plan.devices
        Device(name="h100-96gb", peak_tflops={"fp32": 62.0, "tf32": 456.0, "bf16": 912.0, "fp16": 912.0},
               mem_bw_gbps=2400.0, mem_gib=96.0,
               source="pytorch/torchtitan@eaea6f6:docs/performance.md; peak the SXM/NVL midpoint (assumed)"),  # fmt: skip
        # H200 SXM: same GH100 compute as H100 SXM; 4.8 TB/s HBM3e, 141 GB
        Device(name="h200", peak_tflops={"fp32": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5},
               mem_bw_gbps=4800.0, mem_gib=141.0, source=_H200),  # fmt: skip
        # H800 SXM: H100 SXM compute and HBM (the export variant differs in NVLink, which the network
        # catalog describes); DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024) §3.1
        Device(name="h800", peak_tflops={"fp32": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5},
               mem_bw_gbps=3350.0, mem_gib=80.0, source=_H100 + "; H800 as H100 SXM compute (DeepSeek-V3 report §3.1)"),  # fmt: skip
        # RTX 2080 Ti (reference): 13.4 FP32, 53.8 FP16 tensor with FP32 accumulate; 616 GB/s GDDR6, 11 GB
        Device(name="rtx2080ti", peak_tflops={"fp32": 13.4, "fp16": 53.8}, mem_bw_gbps=616.0, mem_gib=11.0,
               source=_TURING),  # fmt: skip
        # this machine's CPU (2 vCPU, AVX-512 with BF16 dot products, no native FP16 math)
        Device(name="this-cpu", peak_tflops={"fp32": 0.177, "bf16": 0.402}, mem_bw_gbps=61.7, mem_gib=23.5,
               source=_THIS_CPU),  # fmt: skip
    )
}

LINKS: dict[str, Link] = {
    k.name: k
    for k in (
        # PCIe x16 per direction: gen3 8 GT/s -> 15.75 GB/s, gen4 16 GT/s -> 31.5, gen5 32 GT/s -> 63 (128b/130b)
        Link(name="pcie3-x16", bw_gbyte_s=15.75, latency_us=5.7, source=f"{_PCIE}; {_NCCL_LAT}"),
        Link(name="pcie4-x16", bw_gbyte_s=31.5, latency_us=5.7, source=f"{_PCIE}; {_NCCL_LAT}"),
        Link(name="pcie5-x16", bw_gbyte_s=63.0, latency_us=5.7, source=f"{_PCIE}; {_NCCL_LAT}"),
        # NVLink per GPU per direction: gen2 (V100) 300/2, gen3 (A100) 600/2, gen4 (H100/H200) 900/2 GB/s
        Link(name="nvlink2", bw_gbyte_s=150.0, latency_us=3.4, source=f"{_NVLINK}; {_NCCL_LAT}"),
        Link(name="nvlink3", bw_gbyte_s=300.0, latency_us=3.4, source=f"{_NVLINK}; {_NCCL_LAT}"),
        Link(name="nvlink4", bw_gbyte_s=450.0, latency_us=3.4, source=f"{_NVLINK}; {_NCCL_LAT}"),
        # Ethernet line rates / 8 (GB/s)
        Link(name="eth-1g", bw_gbyte_s=0.125, latency_us=25.0, source=f"{_ETH}; {_TCP_LAT}"),
        Link(name="eth-10g", bw_gbyte_s=1.25, latency_us=25.0, source=f"{_ETH}; {_TCP_LAT}"),
        Link(name="eth-25g", bw_gbyte_s=3.125, latency_us=25.0, source=f"{_ETH}; {_TCP_LAT}"),
        Link(name="eth-100g", bw_gbyte_s=12.5, latency_us=25.0, source=f"{_ETH}; {_TCP_LAT}"),
        Link(name="eth-200g", bw_gbyte_s=25.0, latency_us=25.0, source=f"{_ETH}; {_TCP_LAT}"),
        Link(name="eth-400g", bw_gbyte_s=50.0, latency_us=25.0, source=f"{_ETH}; {_TCP_LAT}"),
        # InfiniBand 4x: EDR 100 Gb/s, HDR 200 Gb/s, NDR 400 Gb/s
        Link(name="ib-edr", bw_gbyte_s=12.5, latency_us=9.6, source=f"{_IB}; {_NCCL_LAT}"),
        Link(name="ib-hdr", bw_gbyte_s=25.0, latency_us=9.6, source=f"{_IB}; {_NCCL_LAT}"),
        Link(name="ib-ndr", bw_gbyte_s=50.0, latency_us=9.6, source=f"{_IB}; {_NCCL_LAT}"),
    )
}


DEVICE_ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "h100-80gb": "h100-sxm", "h200-141gb": "h200", "v100-32gb": "v100", "a100": "a100-80gb",
    "2080ti": "rtx2080ti",
}  # fmt: skip
"""other names of catalog devices: those of the planner's GPU catalog (``trainsim.plan.devices``) among them,
so that one name works in a cluster file and on ``trainsim estimate --gpu``"""


def device(name: str) -> Device:
    """The catalog device ``name`` (case-insensitive, or one of ``DEVICE_ALIASES``); ``UserError`` listing the
    valid names on a miss."""
    key = name.lower()
    d = DEVICES.get(DEVICE_ALIASES.get(key, key))
    if d is None:
        raise UserError(
            f"unknown device {name!r}; expected one of {', '.join(DEVICES)} (or {', '.join(DEVICE_ALIASES)})"
        )
    return d


def link(name: str) -> Link:
    """The catalog link ``name``; ``custom:<Gbit/s>[:<latency us>]`` makes an ad-hoc one (e.g. ``custom:0.1:500``)."""
    key = name.lower()
    if key.startswith("custom:"):
        parts = key.split(":")[1:]
        try:
            gbit = float(parts[0])
            lat = float(parts[1]) if len(parts) > 1 else 0.0
        except (ValueError, IndexError):
            raise UserError(f"link {name!r}: expected custom:<Gbit/s>[:<latency us>]") from None
        if len(parts) > 2:
            raise UserError(f"link {name!r}: expected custom:<Gbit/s>[:<latency us>]")
        return Link(name=key, bw_gbyte_s=gbit / 8, latency_us=lat, source="user-given")
    k = LINKS.get(key)
    if k is None:
        raise UserError(f"unknown link {name!r}; expected one of {', '.join(LINKS)} or custom:<Gbit/s>[:<us>]")
    return k
