"""Analytical workloads: layer-by-layer FLOPs, bytes, parameters and activations per micro-batch.

    >>> from trainsim.plan.workload import preset
    >>> gpt3 = preset("gpt3-175b")
    >>> round(gpt3.total_params() / 1e9, 1)
    174.6
    >>> costs = gpt3.layer_costs(mb=1, tp=8, sp=True, cp=1)   # one entry per pipeline-cuttable layer
    >>> costs[1].name, costs[1].params                        # a transformer block on one of 8 TP ranks
    ('block', 226512384)

Two families. ``Transformer`` covers decoders (GPT: learned positions, GELU MLP, biases, dropout;
Llama: RoPE, RMSNorm, grouped-query attention, SwiGLU gated MLP, no biases, no dropout) and encoders
(BERT). ``Cnn`` covers ResNet-50 and VGG-19 (data and pipeline parallelism only).

Every cost is for **one GPU and one micro-batch** of ``mb`` samples after tensor parallelism ``tp``
(Megatron: column/row-parallel linears, heads split, vocabulary-parallel embedding and logits),
sequence parallelism ``sp`` (norms, dropouts and residuals split along the sequence) and context
parallelism ``cp`` (the sequence split ``cp`` ways; attention sees all keys). Activation bytes follow
Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys'23), §4,
built from the tensors each operator saves (16-bit activations, 1-byte dropout masks), so that GQA,
gated MLPs, missing dropout and context parallelism follow from the same terms. For GPT with
``kv_heads == heads`` and ``ffn = 4h`` they reduce to the paper's ``sbh(10 + 24/t + 5as/(ht))``
(no SP) and ``sbh/t(34 + 5as/h)`` (SP).

Why one module: ``Transformer`` and ``Cnn`` are the two halves of the one ``Model`` type the planner
takes, built from the same ``Op`` and ``LayerCost`` records, and the presets at the end name instances of
both.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from trainsim.errors import UserError

ACT_BYTES = 2  # 16-bit activations (mixed precision)


class OpKind(enum.IntEnum):
    """How an operator's time is modelled (see ``optime``)."""

    GEMM = 0  # dense matmul / convolution as implicit GEMM: compute-bound roofline with efficiency
    ATTN = 1  # batched matmuls inside attention (QK^T, AV) or a fused flash-attention kernel
    MEM = 2  # elementwise / normalisation / softmax / embedding gather: memory-bound
    FLASH = 3  # fused attention kernel (flash attention): its own efficiency, causal blocks skipped


class Op(NamedTuple):
    """One forward operator on one GPU for one micro-batch."""

    name: str
    kind: OpKind
    flops: float  # forward FLOPs (2 per multiply-add)
    bytes: float  # forward bytes read + written
    m: int = 0  # GEMM shape (m x k) @ (k x n), repeated ``batch`` times; 0 for MEM ops
    n: int = 0
    k: int = 0
    batch: int = 1
    bwd: float = 2.0  # backward cost / forward cost
    core: bool = False  # part of the attention core (recomputed under selective recomputation)


class AttnFlops(enum.Enum):
    """How the attention core (``QK^T`` and ``AV``) counts in *model* FLOPs, the numerator of MFU.

    FULL: the whole ``s x s`` square, ``4 s^2 h`` forward FLOPs per layer and sequence, whether or not a
    causal mask discards half of it. Megatron-LM's eq. 3 (Narayanan et al. SC'21) and PaLM's
    ``6N + 12 L H Q T`` (Chowdhery et al. 2022, appendix B) count this way, so it is the default:
    published MFU and TFLOP/s figures compare like for like.
    CAUSAL: the lower triangle only, ``2 s^2 h`` for a causal decoder: the work a causal flash-attention
    kernel actually does. Encoders (BERT) have no mask and count the full square under both.
    """

    FULL = "full"
    CAUSAL = "causal"


class Recompute(enum.IntEnum):
    NONE = 0
    SELECTIVE = 1  # recompute the attention core only (Korthikanti §5)
    FULL = 2  # keep each layer's input, recompute the whole layer in backward


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One pipeline-cuttable layer on one GPU for one micro-batch."""

    name: str
    ops: tuple[Op, ...]
    params: int  # parameters held on this GPU (after TP; a tied head counts its embedding copy)
    act_bytes: tuple[float, float, float]  # saved for backward under Recompute NONE, SELECTIVE, FULL
    transient_bytes: float  # extra live bytes while this layer runs backward (recomputed activations)
    out_bytes: float  # activation sent to the next pipeline stage (per GPU)
    tp_allreduce_bytes: float  # bytes of each TP all-reduce (or RS+AG pair under SP) in forward
    tp_collectives: int  # TP all-reduces in one forward (the same count again in backward)
    cp_kv_bytes: float  # K/V bytes each GPU receives from the other cp-1 ranks per forward
    model_flops: float  # forward matmul FLOPs of the whole layer (unsharded), for MFU
    core_flops: float  # forward matmul FLOPs of the attention core (unsharded)
    tied_params: int = 0  # of ``params``, the copy of the embedding a tied head holds (not needed on stage 0)
    expert_params: int = 0  # of ``params``, the expert weights (split over ep; gradients synced over dp*cp/ep)
    a2a_bytes: float = 0.0  # bytes one GPU sends in one expert all-to-all (dispatch or combine), padding included
    a2a_count: int = 0  # expert all-to-alls in one forward (dispatch + combine; the same again in backward)


@dataclass(frozen=True, kw_only=True, slots=True)
class Transformer:
    """A transformer by its usual hyper-parameters; ``preset`` has the published ones."""

    arch: str = "gpt"
    """gpt (decoder, learned positions, GELU, biases, dropout) | llama (RoPE, RMSNorm, GQA, SwiGLU) | bert"""
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    kv_heads: int = 0
    """0 means = heads (multi-head attention)"""
    head_size: int = 0
    """attention head width; 0 means hidden/heads (Qwen3 and GPT-OSS use wider heads: heads*head_dim != hidden)"""
    ffn_hidden: int = 0
    """0 means 4*hidden (gpt, bert) or Llama's 2/3*4h rounded up to 256"""
    flash_attention: bool = False
    """attention core as one fused kernel (no s x s tensors kept)"""
    tied_embeddings: bool | None = None
    """None: tied for gpt/bert, untied for llama"""
    experts: int = 0
    """routed experts per MoE layer; 0 = a dense model"""
    top_k: int = 2
    """experts each token is routed to (MoE only)"""
    moe_ffn_hidden: int = 0
    """MLP width of one expert; 0 means = ffn"""
    shared_experts: int = 0
    """experts every token goes through besides its top-k (DeepSeek-style)"""
    capacity_factor: float = 0.0
    """expert capacity / mean load; 0 = dropless (each expert gets the mean load, no padding)"""
    dense_layers: int = 0
    """leading layers with a dense MLP in an MoE model (DeepSeek-V3: 3)"""
    expert_groups: int = 0
    """group-limited routing: experts fall into this many groups and a token picks its ``top_k`` from
    ``group_top_k`` of them (DeepSeek-V3: 8 and 4); 0 = any expert"""
    group_top_k: int = 0
    """groups a token may route to under group-limited routing"""
    kv_lora: int = 0
    """multi-head latent attention (DeepSeek-V2/V3): width of the key/value latent; 0 = standard attention.
    Keys and values come from this latent through per-head up projections, queries from ``q_lora``."""
    q_lora: int = 0
    """MLA: width of the query latent; 0 = queries projected from the hidden state directly"""
    qk_nope_dim: int = 0
    """MLA: per-head query/key width without rotary embedding"""
    qk_rope_dim: int = 0
    """MLA: per-head query/key width with rotary embedding (the rotary key is one per token, shared by heads)"""
    v_head_dim: int = 0
    """MLA: per-head value width"""
    name: str = ""

    def __post_init__(self) -> None:
        if self.arch not in ("gpt", "llama", "bert"):
            raise UserError(f"--arch {self.arch!r}; expected gpt, llama or bert")
        for f in ("layers", "hidden", "heads", "seq", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"model: {f}={v!r}; expected a positive integer")
        if self.hidden % self.heads:
            raise UserError(f"model: hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.kv_heads < 0 or self.heads % self.kvh:
            raise UserError(f"model: heads {self.heads} is not divisible by kv_heads {self.kvh}")
        if self.experts < 0 or self.shared_experts < 0 or self.dense_layers < 0 or self.capacity_factor < 0:
            raise UserError("model: experts, shared_experts, dense_layers and capacity_factor must be >= 0")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise UserError(f"--top-k {self.top_k}; expected 1..experts ({self.experts})")
        if self.expert_groups:
            if not self.experts or self.experts % self.expert_groups:
                raise UserError(f"--expert-groups {self.expert_groups}; expected a divisor of experts ({self.experts})")
            per_group = self.experts // self.expert_groups
            if not 1 <= self.group_top_k <= self.expert_groups or self.group_top_k * per_group < self.top_k:
                raise UserError(f"--group-top-k {self.group_top_k}; expected 1..{self.expert_groups} groups holding at "
                                f"least top_k={self.top_k} experts")  # fmt: skip
        elif self.group_top_k:
            raise UserError("--group-top-k needs --expert-groups")
        if self.experts and self.dense_layers >= self.layers:
            raise UserError(f"--dense-layers {self.dense_layers}; expected fewer than layers ({self.layers})")
        if 0 < self.capacity_factor < 1:
            raise UserError(f"--capacity-factor {self.capacity_factor}; expected 0 (dropless) or >= 1")
        mla = (self.q_lora, self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim)
        if self.kv_lora < 0 or min(mla) < 0:
            raise UserError(f"model: MLA widths kv_lora={self.kv_lora}, q_lora, qk_nope_dim, qk_rope_dim, "
                            f"v_head_dim={mla}; expected >= 0")  # fmt: skip
        if self.kv_lora and (min(mla[1:]) < 1 or self.arch != "llama" or self.kvh != self.heads):
            raise UserError(f"model: kv_lora={self.kv_lora} (latent attention) needs qk_nope_dim, qk_rope_dim and "
                            f"v_head_dim > 0 (got {mla[1:]}), arch llama and no kv_heads")  # fmt: skip
        if not self.kv_lora and any(mla):
            raise UserError(f"model: MLA widths q_lora, qk_nope_dim, qk_rope_dim, v_head_dim={mla} need kv_lora > 0")

    # ---------------------------------------------------------------- derived sizes
    @property
    def kvh(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (``kv_lora`` > 0)."""
        return self.kv_lora > 0

    @property
    def qk_dim(self) -> int:
        """Per-head width of queries and keys (MLA: no-position + rotary parts)."""
        return self.qk_nope_dim + self.qk_rope_dim if self.mla else self.head_dim

    @property
    def v_dim(self) -> int:
        """Per-head width of values (and of the attention output)."""
        return self.v_head_dim if self.mla else self.head_dim

    @property
    def mla_down(self) -> int:
        """MLA: width of the down projection's output per token (query latent, key/value latent, rotary key);
        its weights are replicated on tensor-parallel ranks."""
        return self.q_lora + self.kv_lora + self.qk_rope_dim if self.mla else 0

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.arch == "llama":  # Llama: int(2/3 * 4h) rounded up to a multiple of 256
            f = int(2 * 4 * self.hidden / 3)
            return 256 * ((f + 255) // 256)
        return 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden or self.ffn

    @property
    def causal(self) -> bool:
        """Decoders (gpt, llama) mask the future; BERT attends both ways."""
        return self.arch != "bert"

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def gated(self) -> bool:
        return self.arch == "llama"

    @property
    def dropout(self) -> bool:
        return self.arch != "llama"

    @property
    def biases(self) -> bool:
        return self.arch != "llama"

    @property
    def tied(self) -> bool:
        return self.arch != "llama" if self.tied_embeddings is None else self.tied_embeddings

    @property
    def n_units(self) -> int:
        """Pipeline-cuttable layers: embedding, ``layers`` blocks, head."""
        return self.layers + 2

    def check_tp(self, tp: int) -> None:
        if self.heads % tp:
            raise UserError(f"tp={tp} does not divide heads={self.heads}; tensor parallelism splits heads")
        if self.kvh % tp and tp % self.kvh:
            raise UserError(f"tp={tp} and kv_heads={self.kvh}: one must divide the other")
        if self.ffn % tp or (self.vocab % tp and self.vocab < tp):
            raise UserError(f"tp={tp} does not divide ffn_hidden={self.ffn}")
        if self.experts and self.expert_ffn % tp:
            raise UserError(f"tp={tp} does not divide moe_ffn_hidden={self.expert_ffn}")

    def check_ep(self, ep: int) -> None:
        if ep > 1 and not self.experts:
            raise UserError(f"--ep {ep} needs a mixture-of-experts model (--experts)")
        if self.experts and self.experts % ep:
            raise UserError(f"--ep {ep} does not divide experts={self.experts}; each EP rank holds experts/ep experts")

    # ---------------------------------------------------------------- parameters
    def _mlp_params(self, width: int) -> int:
        h = self.hidden
        p = (3 if self.gated else 2) * h * width
        if self.biases:
            p += width * (2 if self.gated else 1) + h
        return p

    def block_params(self, moe: bool = False) -> int:
        """One block; ``moe``: an MoE block with all its experts (``moe_block_split`` separates them)."""
        if moe:
            return sum(self.moe_block_split())
        return self._attn_norm_params() + self._mlp_params(self.ffn)

    def _attn_weights(self) -> int:
        """Weights of the attention's linear layers (what a token multiplies through)."""
        h, a = self.hidden, self.heads
        if self.mla:
            qk, lq = self.qk_dim, self.q_lora
            query = h * lq + lq * a * qk if lq else h * a * qk
            kv = h * (self.kv_lora + self.qk_rope_dim) + self.kv_lora * a * (self.qk_nope_dim + self.v_dim)
            return query + kv + a * self.v_dim * h
        kvd, q = self.kvh * self.head_dim, self.q_dim
        return h * (q + 2 * kvd) + q * h

    def replicated_attn_params(self) -> int:
        """Attention parameters every tensor-parallel rank holds whole (MLA: down projection, latent norms)."""
        return self.hidden * self.mla_down + self.q_lora + self.kv_lora if self.mla else 0

    def _attn_norm_params(self) -> int:
        h, kvd, q = self.hidden, self.kvh * self.head_dim, self.q_dim
        attn = self._attn_weights()
        if self.mla:
            attn += self.q_lora + self.kv_lora  # RMSNorm on the two latents
        elif self.biases:
            attn += q + 2 * kvd + h
        norms = 2 * h * (2 if self.arch != "llama" else 1)  # LayerNorm has a bias, RMSNorm not
        return attn + norms

    def moe_block_split(self) -> tuple[int, int]:
        """(non-expert, routed-expert) parameters of one MoE block: attention, norms, router, shared experts;
        then ``experts`` expert MLPs."""
        fe = self.expert_ffn
        dense = self._attn_norm_params() + self.hidden * self.experts + self.shared_experts * self._mlp_params(fe)
        return dense, self.experts * self._mlp_params(fe)

    def embedding_params(self) -> int:
        p = self.vocab * self.hidden
        if self.arch in ("gpt", "bert"):
            p += self.seq * self.hidden  # learned positions (BERT: 512)
        if self.arch == "bert":
            p += 2 * self.hidden + 2 * self.hidden  # token types + embedding LayerNorm
        return p

    def head_params(self, count_tied: bool = False) -> int:
        h = self.hidden
        p = h * (2 if self.arch != "llama" else 1)  # final norm
        if self.arch == "bert":
            p = (h * h + h) + (h * h + h + 2 * h) + self.vocab  # pooler + MLM transform + decoder bias
        if not self.tied or count_tied:
            p += self.vocab * h
        return p

    def total_params(self) -> int:
        blocks = (self.layers - self.moe_layers) * self.block_params() + self.moe_layers * self.block_params(moe=True)
        return self.embedding_params() + blocks + self.head_params()

    def active_params(self) -> int:
        """Parameters one token passes through (MoE: top-k routed experts, not all of them)."""
        if not self.experts:
            return self.total_params()
        dense, _ = self.moe_block_split()
        act = dense + self.top_k * self._mlp_params(self.expert_ffn)
        return self.total_params() - self.moe_layers * self.block_params(moe=True) + self.moe_layers * act

    # ---------------------------------------------------------------- FLOPs
    def block_flops(self, samples: int = 1, attn: AttnFlops = AttnFlops.FULL, moe: bool = False) -> float:
        """Forward matmul FLOPs of one block (whole, unsharded) for ``samples`` sequences.

        An MoE block counts its router, its shared experts and ``top_k`` routed experts per token
        (not the padding a capacity factor adds: that is executed, not model, work)."""
        t, h = samples * self.seq, self.hidden
        mlp_w = (self.top_k + self.shared_experts) * self.expert_ffn if moe else self.ffn
        router = h * self.experts if moe else 0
        lin = 2 * t * (self._attn_weights() + (3 if self.gated else 2) * h * mlp_w + router)
        return lin + self.core_flops(samples, attn)

    def core_flops(self, samples: int = 1, attn: AttnFlops = AttnFlops.FULL) -> float:
        """QK^T and AV forward FLOPs: ``4 s^2 h`` per sequence (MLA: ``2 s^2 heads (qk_dim + v_dim)``), half under
        ``AttnFlops.CAUSAL`` for a decoder."""
        if self.mla:
            full = 2.0 * samples * self.seq * self.seq * self.heads * (self.qk_dim + self.v_dim)
        else:
            full = 4.0 * samples * self.seq * self.seq * self.q_dim
        return full / 2 if attn == AttnFlops.CAUSAL and self.causal else full

    def head_flops(self, samples: int = 1) -> float:
        return 2.0 * samples * self.seq * self.hidden * self.vocab

    def model_flops_per_sample(self, attn: AttnFlops = AttnFlops.FULL) -> float:
        """Forward + backward matmul FLOPs per sequence, no recomputation (3 x forward)."""
        dense = (self.layers - self.moe_layers) * self.block_flops(1, attn)
        moe = self.moe_layers * self.block_flops(1, attn, moe=True)
        return 3.0 * (dense + moe + self.head_flops())

    # ---------------------------------------------------------------- per-GPU costs
    def layer_costs(self, *, mb: int, tp: int, sp: bool, cp: int, ep: int = 1, eager: bool = False) -> tuple[LayerCost, ...]:
        """``eager``: PyTorch's reference modules run step by step (see ``_block_cost``); default: fused
        elementwise kernels (Megatron-LM, Transformer Engine, torch.compile)."""
        return _transformer_costs(self, mb, tp, sp, cp, ep, eager)


@functools.lru_cache(maxsize=4096)
def _transformer_costs(
    m: Transformer, mb: int, tp: int, sp: bool, cp: int, ep: int = 1, eager: bool = False
) -> tuple[LayerCost, ...]:
    m.check_tp(tp)
    m.check_ep(ep)
    if m.seq % cp:
        raise UserError(f"--cp {cp} does not divide the sequence length {m.seq}")
    blocks = [_block_cost(m, mb, tp, sp, cp, ep, moe=False, eager=eager)] * (m.layers - m.moe_layers)
    if m.moe_layers:
        blocks += [_block_cost(m, mb, tp, sp, cp, ep, moe=True, eager=eager)] * m.moe_layers
    b, s, h = mb, m.seq, m.hidden
    tok = b * (s // cp)
    spd = tp if sp else 1
    B = ACT_BYTES
    drop = 1 if m.dropout else 0
    emb = LayerCost(
        name="embedding",
        ops=(Op("embed", OpKind.MEM, 0.0, 3 * B * tok * h, bwd=1.0),),
        params=m.embedding_params() - m.vocab * h + m.vocab * h // tp,
        act_bytes=(drop * tok * h / spd,) * 3,
        transient_bytes=0.0,
        out_bytes=B * tok * h / spd,
        tp_allreduce_bytes=B * tok * h if tp > 1 else 0.0,
        tp_collectives=1 if tp > 1 else 0,
        cp_kv_bytes=0.0,
        model_flops=0.0,
        core_flops=0.0,
    )
    vt = m.vocab // tp
    head_ops = (
        Op("final_norm", OpKind.MEM, 0.0, 2 * B * tok * h / spd),
        Op("logits", OpKind.GEMM, 2.0 * tok * h * vt, B * (tok * h + h * vt + tok * vt), tok, vt, h),
        Op("cross_entropy", OpKind.MEM, 0.0, 4 * 3 * tok * vt, bwd=1.0),  # fp32 logits: read, exp, write
    )
    head_act = B * tok * h / spd + B * tok * h + 4 * tok * vt  # final-norm input, logits input, fp32 log-softmax
    head = LayerCost(
        name="head",
        ops=head_ops,
        params=m.head_params(count_tied=True) - m.vocab * h + m.vocab * h // tp,
        act_bytes=(head_act, head_act, head_act),
        transient_bytes=4 * tok * vt,  # gradient of the fp32 logits
        out_bytes=0.0,
        tp_allreduce_bytes=0.0,
        tp_collectives=0,
        cp_kv_bytes=0.0,
        model_flops=m.head_flops(b) / cp,
        core_flops=0.0,
        tied_params=m.vocab * h // tp if m.tied else 0,
    )
    return (emb, *blocks, head)


# Bytes per element moved by the elementwise parts of a Llama block when PyTorch runs its reference modules
# one kernel at a time ("eager"), against one fused kernel each (read the 16-bit input, write the output):
#   RMSNorm  x.float() r2 w4, pow r4 w4, mean r4, x * rsqrt r4 w4, type_as r4 w2, * weight r2 w2 = 36 (fused 4)
#   RoPE     per q/k element: float() r2 w4, complex multiply r4 w4, type_as r4 w2 = 20 (fused 4)
#   SwiGLU   silu r2 w2, multiply r2 r2 w2 = 10 per element of the MLP width (fused 6)
# GPT's LayerNorm and GELU are single kernels either way (F.layer_norm, F.gelu).
EAGER_RMSNORM_BYTES, EAGER_ROPE_BYTES, EAGER_SWIGLU_BYTES = 36, 20, 10
FUSED_ROPE_BYTES = 4


def _block_cost(m: Transformer, mb: int, tp: int, sp: bool, cp: int, ep: int, *, moe: bool, eager: bool = False) -> LayerCost:
    """One transformer block on one GPU for one micro-batch (``moe``: routed experts replace the MLP;
    ``eager``: the elementwise parts run as PyTorch's reference modules do, ``EAGER_*_BYTES``)."""
    b, s, h, a, f = mb, m.seq, m.hidden, m.heads, m.ffn
    sl = s // cp
    tok = b * sl  # tokens on this GPU
    hd = m.head_dim
    qd = m.q_dim
    at = a // tp  # heads on this GPU
    kvt = max(1, m.kvh // tp)
    qkv_n = (a + 2 * m.kvh) * hd // tp
    fn = f // tp
    spd = tp if sp else 1  # divisor of sequence-parallel regions
    B = ACT_BYTES
    drop = 1 if m.dropout else 0
    llama_eager = eager and m.arch == "llama"
    norm_bytes = (EAGER_RMSNORM_BYTES if llama_eager else 2 * B) * tok * h / spd
    ops: list[Op] = [Op("norm1", OpKind.MEM, 0.0, norm_bytes)]
    latent_act = 0.0  # MLA: saved latents (down-projection outputs and normed latents)
    if m.mla:
        ops += _mla_qkv_ops(m, tok, tok // spd, at, llama_eager, eager)
        qkv_n = at * (2 * m.qk_dim + m.v_dim)  # per token: q, k (rotary part broadcast to heads), v
        latent_act = B * (tok // spd) * m.mla_down + B * tok * (m.q_lora + m.kv_lora)
    else:
        ops.append(Op("qkv", OpKind.GEMM, 2.0 * tok * h * qkv_n, B * (tok * h + h * qkv_n + tok * qkv_n), tok, qkv_n, h))
    if m.arch == "llama" and not m.mla:  # rotary embedding of q and k
        rope = (EAGER_ROPE_BYTES if eager else FUSED_ROPE_BYTES) * tok * (at + kvt) * hd
        ops.append(Op("rope", OpKind.MEM, 0.0, rope, bwd=1.0))
    if m.mla:
        dq, dv = m.qk_dim, m.v_dim
        fl = 2.0 * b * at * sl * s * (dq + dv) * (0.5 if m.causal and m.flash_attention else 1.0)
        qkvo = B * b * at * (sl * dq + s * dq + s * dv + sl * dv)  # q, k, v in; output
        if m.flash_attention:
            ops.append(Op("flash_attn", OpKind.FLASH, fl, qkvo, sl, s, dq, b * at, 2.5, True))
        else:
            sc = b * at * sl * s
            ops += [
                Op("scores", OpKind.ATTN, 2.0 * sc * dq, B * (b * at * (sl + s) * dq + sc), sl, s, dq, b * at, 2.0, True),
                Op("softmax", OpKind.MEM, 0.0, 2 * B * sc, bwd=1.5, core=True),
                Op("attn_v", OpKind.ATTN, 2.0 * sc * dv, B * (sc + b * at * (s + sl) * dv), sl, dv, s, b * at, 2.0, True),
            ]
        qd = a * dv  # width of the attention output
    elif m.flash_attention:
        # a causal kernel skips the masked half (with cp, the load-balanced split gives every rank half too)
        fl = 4.0 * b * at * sl * s * hd * (0.5 if m.causal else 1.0)
        ops.append(
            Op("flash_attn", OpKind.FLASH, fl, B * b * (at * sl * hd * 2 + kvt * s * hd * 2), sl, s, hd, b * at, 2.5, True)
        )
    else:
        sc = b * at * sl * s  # score elements
        ops += [
            Op("scores", OpKind.ATTN, 2.0 * sc * hd, B * (b * at * sl * hd + b * kvt * s * hd + sc), sl, s, hd, b * at, 2.0, True),
            Op("softmax", OpKind.MEM, 0.0, 2 * B * sc, bwd=1.5, core=True),
            Op("attn_dropout", OpKind.MEM, 0.0, (2 * B + 1) * sc * drop, bwd=1.0, core=True),
            Op("attn_v", OpKind.ATTN, 2.0 * sc * hd, B * (sc + b * kvt * s * hd + b * at * sl * hd), sl, hd, s, b * at, 2.0, True),
        ]
    ops += [
        Op("proj", OpKind.GEMM, 2.0 * tok * (qd // tp) * h, B * (tok * qd / tp + qd * h / tp + tok * h), tok, h, qd // tp),
        Op("residual1", OpKind.MEM, 0.0, (3 * B + drop) * tok * h / spd, bwd=1.0),
        Op("norm2", OpKind.MEM, 0.0, norm_bytes),
    ]
    g = 2 if m.gated else 1
    mlp_act = 0.0  # saved activations of the MLP part (tp region)
    expert_params = a2a = 0.0
    if not moe:
        ops += _mlp_ops("", tok, h, fn, g, 1, eager)
        mlp_act = B * tok * fn * g + B * tok * fn
    else:
        fe = m.expert_ffn // tp
        local = m.experts // ep  # experts on this GPU
        tok_e = tok * m.top_k * (m.capacity_factor or 1.0)  # routed tokens this GPU's experts process (mean)
        ops.append(Op("router", OpKind.GEMM, 2.0 * tok * h * m.experts, B * (tok * h + h * m.experts), tok, m.experts, h))
        ops.append(Op("permute", OpKind.MEM, 0.0, 4 * B * tok_e * h, bwd=1.0))  # gather in, scatter back out
        ops += _mlp_ops("expert_", int(tok_e), h, fe, g, local, eager)
        mlp_act = B * tok_e * h + B * tok_e * fe * g + B * tok_e * fe
        if m.shared_experts:
            ops += _mlp_ops("shared_", tok, h, fe * m.shared_experts, g, 1, eager)
            mlp_act += B * tok * fe * m.shared_experts * (g + 1)
        expert_params = m.moe_block_split()[1] / (tp * ep)
        a2a = B * tok_e * h / spd * (ep - 1) / ep if ep > 1 else 0.0
    ops.append(Op("residual2", OpKind.MEM, 0.0, (3 * B + drop) * tok * h / spd, bwd=1.0))
    # saved activations (bytes), Korthikanti §4 term by term
    seq_region = (4 * B + 2 * drop) * tok * h / spd  # norm in, qkv in, mask, norm2 in, fc1 in, mask
    tp_region = B * tok * qkv_n + B * tok * qd / tp + mlp_act + latent_act
    if m.flash_attention:
        core = 4.0 * b * at * sl  # fp32 log-sum-exp per query row
    else:
        core = b * at * sl * s * (B + drop + (B if m.dropout else 0))  # softmax out, mask, dropout out
    full_layer = seq_region + tp_region + core
    block_in = B * tok * h / spd
    rep = m.replicated_attn_params()  # whole on every TP rank (0 without MLA)
    if moe:
        params = (m.moe_block_split()[0] - rep) // tp + rep + int(expert_params)
    else:
        params = (m.block_params() - rep) // tp + rep if tp > 1 else m.block_params()
    kv_w = at * (m.qk_dim + m.v_dim) if m.mla else 2 * kvt * hd  # K and V widths per token on this GPU
    executed = AttnFlops.CAUSAL if m.flash_attention else AttnFlops.FULL  # unfused kernels compute the whole square
    return LayerCost(
        name="moe_block" if moe else "block",
        ops=tuple(ops),
        params=params,
        act_bytes=(full_layer, seq_region + tp_region + (core if m.flash_attention else 0.0), block_in),
        transient_bytes=full_layer,
        out_bytes=B * tok * h / spd,
        tp_allreduce_bytes=B * tok * h if tp > 1 else 0.0,
        tp_collectives=2 if tp > 1 else 0,
        cp_kv_bytes=B * b * kv_w * s * (cp - 1) / cp if cp > 1 else 0.0,
        model_flops=m.block_flops(b, executed, moe=moe) / cp,
        core_flops=m.core_flops(b, executed) / cp,
        expert_params=int(expert_params),
        a2a_bytes=a2a,
        a2a_count=2 if a2a else 0,
    )


def _mla_qkv_ops(m: Transformer, tok: int, tok_d: int, at: int, llama_eager: bool, eager: bool) -> list[Op]:
    """Multi-head latent attention's projections (DeepSeek-V3 report §2.1.1) on one GPU: the down projection
    to the latents and the shared rotary key (weights replicated on TP ranks; under sequence parallelism it
    runs on this rank's ``tok_d`` tokens before the latents are gathered, which this model prices as the
    hidden-state gather it replaces), RMSNorm on both latents, then per-head up projections split by heads."""
    B, h, dn = ACT_BYTES, m.hidden, m.mla_down
    lq, lkv, dq, dv = m.q_lora, m.kv_lora, m.qk_dim, m.v_dim
    qn, kvn = at * dq, at * (m.qk_nope_dim + dv)
    norm = (EAGER_RMSNORM_BYTES if llama_eager else 2 * B) * tok * (lq + lkv)
    ops = [Op("mla_down", OpKind.GEMM, 2.0 * tok_d * h * dn, B * (tok_d * h + h * dn + tok_d * dn), tok_d, dn, h),
           Op("latent_norm", OpKind.MEM, 0.0, norm)]  # fmt: skip
    q_in = lq or h  # without a query latent the queries come from the hidden state (split by heads)
    ops += [
        Op("q_up", OpKind.GEMM, 2.0 * tok * q_in * qn, B * (tok * q_in + q_in * qn + tok * qn), tok, qn, q_in),
        Op("kv_up", OpKind.GEMM, 2.0 * tok * lkv * kvn, B * (tok * lkv + lkv * kvn + tok * kvn), tok, kvn, lkv),
        # rotary embedding of the queries' rotary parts and of the one shared rotary key per token
        Op("rope", OpKind.MEM, 0.0, (EAGER_ROPE_BYTES if eager else FUSED_ROPE_BYTES) * tok * (at + 1) * m.qk_rope_dim,
           bwd=1.0),
    ]
    return ops


def _mlp_ops(prefix: str, tok: int, h: int, width: int, g: int, batch: int, eager: bool = False) -> list[Op]:
    """fc1 (``g`` = 2: gate and up together), activation, fc2 over ``tok`` tokens split into ``batch`` GEMMs."""
    B = ACT_BYTES
    act = EAGER_SWIGLU_BYTES if eager and g == 2 else B * (g + 1)
    return [
        Op(prefix + "fc1", OpKind.GEMM, 2.0 * tok * h * width * g, B * (tok * h + (h * batch + tok) * width * g),
           tok // batch, width * g, h, batch),
        Op(prefix + "act", OpKind.MEM, 0.0, act * tok * width, bwd=1.5),
        Op(prefix + "fc2", OpKind.GEMM, 2.0 * tok * width * h, B * (tok * width + width * h * batch + tok * h),
           tok // batch, h, width, batch),
    ]


# =============================================================================== CNNs
class _Conv(NamedTuple):
    cin: int
    cout: int
    k: int
    stride: int
    hout: int  # output height = width


@dataclass(frozen=True, kw_only=True, slots=True)
class Cnn:
    """A CNN as a list of pipeline-cuttable layers, each a list of convolutions (+BN/ReLU)."""

    name: str
    image: int = 224
    classes: int = 1000
    units: tuple[tuple[str, tuple[_Conv, ...]], ...] = field(default=())
    fc: tuple[tuple[int, int], ...] = ((2048, 1000),)  # (in, out) of the classifier linears
    batch_norm: bool = True

    arch = "cnn"

    @property
    def n_units(self) -> int:
        return len(self.units) + 1

    def check_tp(self, tp: int) -> None:
        if tp != 1:
            raise UserError(f"tp={tp}: tensor parallelism is modelled for transformers only; use tp=1 for {self.name}")

    def conv_params(self, c: _Conv) -> int:
        return c.cin * c.cout * c.k * c.k + (2 * c.cout if self.batch_norm else c.cout)

    def total_params(self) -> int:
        p = sum(self.conv_params(c) for _, convs in self.units for c in convs)
        return p + sum(i * o + o for i, o in self.fc)

    def macs_per_sample(self) -> float:
        macs = sum(c.cin * c.cout * c.k * c.k * c.hout * c.hout for _, convs in self.units for c in convs)
        return float(macs + sum(i * o for i, o in self.fc))

    def model_flops_per_sample(self) -> float:
        return 3.0 * 2.0 * self.macs_per_sample()

    def layer_costs(self, *, mb: int, tp: int, sp: bool, cp: int, ep: int = 1, eager: bool = False) -> tuple[LayerCost, ...]:
        self.check_tp(tp)
        if ep != 1:
            raise UserError(f"--ep {ep}: expert parallelism needs a mixture-of-experts transformer")
        if cp != 1:
            raise UserError(f"cp={cp}: context parallelism needs a transformer")
        return _cnn_costs(self, mb)


@functools.lru_cache(maxsize=256)
def _cnn_costs(m: Cnn, mb: int) -> tuple[LayerCost, ...]:
    B = ACT_BYTES
    out: list[LayerCost] = []
    for name, convs in m.units:
        ops: list[Op] = []
        act = 0.0
        for c in convs:
            hin = c.hout * c.stride
            pix = mb * c.hout * c.hout
            ops.append(
                Op("conv", OpKind.GEMM, 2.0 * pix * c.cout * c.cin * c.k * c.k,
                   B * (mb * hin * hin * c.cin + c.cin * c.cout * c.k * c.k + pix * c.cout), pix, c.cout, c.cin * c.k * c.k)
            )
            ops.append(Op("bn_relu", OpKind.MEM, 0.0, 4 * B * pix * c.cout, bwd=1.5))
            act += B * mb * hin * hin * c.cin + 2 * B * pix * c.cout  # conv input, BN input, ReLU output
        first = convs[0]
        last = convs[-1]
        block_in = B * mb * (first.hout * first.stride) ** 2 * first.cin
        out_b = B * mb * last.hout**2 * last.cout
        out.append(
            LayerCost(
                name=name, ops=tuple(ops), params=sum(m.conv_params(c) for c in convs),
                act_bytes=(act, act, block_in), transient_bytes=act, out_bytes=out_b,
                tp_allreduce_bytes=0.0, tp_collectives=0, cp_kv_bytes=0.0,
                model_flops=sum(o.flops for o in ops), core_flops=0.0,
            )
        )
    fc_ops = tuple(Op("fc", OpKind.GEMM, 2.0 * mb * i * o, B * (mb * i + i * o + mb * o), mb, o, i) for i, o in m.fc)
    fc_act = float(sum(B * mb * i for i, _ in m.fc) + 4 * mb * m.classes)
    out.append(
        LayerCost(
            name="classifier", ops=fc_ops, params=sum(i * o + o for i, o in m.fc), act_bytes=(fc_act,) * 3,
            transient_bytes=0.0, out_bytes=0.0, tp_allreduce_bytes=0.0, tp_collectives=0, cp_kv_bytes=0.0,
            model_flops=sum(o.flops for o in fc_ops), core_flops=0.0,
        )
    )
    return tuple(out)


def resnet50(image: int = 224, classes: int = 1000) -> Cnn:
    """ResNet-50 v1.5 (He et al. 2016; torchvision: stride on the 3x3): 25.56 M parameters, 4.1 GMACs."""
    units: list[tuple[str, tuple[_Conv, ...]]] = []
    r = image // 2
    units.append(("stem", (_Conv(3, 64, 7, 2, r),)))
    r //= 2  # max-pool
    cin = 64
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        for i in range(blocks):
            stride = 2 if i == 0 and stage > 0 else 1
            rin = r
            r = rin // stride
            convs = [_Conv(cin, width, 1, 1, rin), _Conv(width, width, 3, stride, r), _Conv(width, 4 * width, 1, 1, r)]
            if i == 0:
                convs.append(_Conv(cin, 4 * width, 1, stride, r))  # projection shortcut
            units.append((f"layer{stage + 1}.{i}", tuple(convs)))
            cin = 4 * width
    return Cnn(name="resnet50", image=image, classes=classes, units=tuple(units), fc=((2048, classes),))


def vgg19(image: int = 224, classes: int = 1000) -> Cnn:
    """VGG-19 (Simonyan & Zisserman 2015, config E): 143.7 M parameters, 19.6 GMACs, no batch norm."""
    cfg = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")
    units: list[tuple[str, tuple[_Conv, ...]]] = []
    r, cin = image, 3
    for i, c in enumerate(cfg):
        if c == "M":
            r //= 2
            continue
        assert isinstance(c, int)
        units.append((f"conv{i}", (_Conv(cin, c, 3, 1, r),)))
        cin = c
    fc = ((512 * 7 * 7, 4096), (4096, 4096), (4096, classes))
    return Cnn(name="vgg19", image=image, classes=classes, units=tuple(units), fc=fc, batch_norm=False)


Model = Transformer | Cnn

_PRESETS = {
    # GPT-3 (Brown et al. 2020, Table 2.1); vocabulary 50257, sequence 2048
    "gpt3-175b": dict(arch="gpt", layers=96, hidden=12288, heads=96, seq=2048, vocab=50257),
    "gpt3-1.3b": dict(arch="gpt", layers=24, hidden=2048, heads=16, seq=2048, vocab=50257),
    # Llama 2 (Touvron et al. 2023, Table 1 / released configs)
    "llama2-7b": dict(arch="llama", layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, ffn_hidden=11008),
    "llama2-13b": dict(arch="llama", layers=40, hidden=5120, heads=40, seq=4096, vocab=32000, ffn_hidden=13824),
    "llama2-70b": dict(
        arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, seq=4096, vocab=32000, ffn_hidden=28672
    ),
    # BERT (Devlin et al. 2019): WordPiece 30522, 512 positions
    # Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3): 128,256 vocabulary,
    # 8 KV heads, 8k context in pre-training; flash attention as trained
    "llama3-8b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, seq=8192, vocab=128256,
                      ffn_hidden=14336, flash_attention=True),
    "llama3-70b": dict(arch="llama", layers=80, hidden=8192, heads=64, kv_heads=8, seq=8192, vocab=128256,
                       ffn_hidden=28672, flash_attention=True),
    "llama3-405b": dict(arch="llama", layers=126, hidden=16384, heads=128, kv_heads=8, seq=8192, vocab=128256,
                        ffn_hidden=53248, flash_attention=True),
    # Mixtral 8x7B (Jiang et al. 2024, "Mixtral of Experts", Table 1): 8 experts, top-2, 46.7B parameters
    "mixtral-8x7b": dict(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, seq=4096, vocab=32000,
                         ffn_hidden=14336, experts=8, top_k=2, flash_attention=True),
    # DeepSeek-V3-shaped (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", §4.2): 61 layers, hidden 7168,
    # 128 heads, 256 routed experts of width 2048 + 1 shared, top-8, first 3 layers dense (ffn 18432),
    # 129,280 vocabulary, 4k pre-training context; multi-head latent attention (§2.1.1) with the released
    # config's widths: query latent 1536, key/value latent 512, query/key heads 128 + 64 rotary, values 128.
    # 671.0B / 37.6B parameters (the MTP module is left out, as in the report's 671B).
    "deepseek-v3-like": dict(arch="llama", layers=61, hidden=7168, heads=128, seq=4096, vocab=129280,
                             ffn_hidden=18432, experts=256, top_k=8, moe_ffn_hidden=2048, shared_experts=1,
                             dense_layers=3, expert_groups=8, group_top_k=4, flash_attention=True,
                             q_lora=1536, kv_lora=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128),
    "bert-large": dict(arch="bert", layers=24, hidden=1024, heads=16, seq=512, vocab=30522),
    "bert-base": dict(arch="bert", layers=12, hidden=768, heads=12, seq=512, vocab=30522),
}


def preset(name: str) -> Model:
    """A published model by name; ``UserError`` lists the names on a miss."""
    if name == "resnet50":
        return resnet50()
    if name == "vgg19":
        return vgg19()
    if name not in _PRESETS:
        raise UserError(f"unknown model '{name}'; expected one of {', '.join(preset_names())}")
    return Transformer(name=name, **_PRESETS[name])  # type: ignore[arg-type]


def preset_names() -> list[str]:
    return [*sorted(_PRESETS), "resnet50", "vgg19"]
