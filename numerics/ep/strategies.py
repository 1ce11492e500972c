"""Routings and payloads for the communication level: Hypothesis strategies and a seeded sampler.

A case is a ``CaseSpec`` (a small frozen dataclass); every rank turns it into the same inputs for
every rank with ``make_inputs(spec, rank, device)`` (seeded ``spec.seed * 1009 + rank``), so each rank
can run ``simulate`` over all ranks without gathering anything. Hypothesis draws and shrinks specs
(``case_specs``); the GPU runner draws them with ``sample_specs`` from the same space, after the
named ``edge_specs``.

Routing families (``ROUTINGS``): ``uniform`` (K distinct experts uniformly), ``zipf`` (expert
popularity ~ 1/rank^1.2, as a skewed router produces), ``one_expert`` (every token picks one expert,
other slots -1), ``starve_rank`` (no token selects an expert of rank ``spec.starved``, which receives
nothing), ``masked`` (uniform with half of the slots -1, some tokens fully masked). ``spec.mask`` masks
a further fraction of slots in any family. Top-k rows are always duplicate-free, as a router's are.

Payloads: bf16 normal values with a fraction ``spec.specials`` replaced by special bit patterns (NaN
with several payloads, +-Inf, -0.0, subnormals, max, arbitrary bits); FP8 data as arbitrary bytes
(every E4M3 code, NaN included) with float32 scales that include special patterns too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from numerics.ep.backend import FP8_BLOCK, MAX_TOKENS
from numerics.errors import SEED_MAX

ROUTINGS = ("uniform", "zipf", "one_expert", "starve_rank", "masked")
PAYLOADS = ("bf16", "fp8")
HIDDENS = (2048, 7168)  # DeepSeek-V3 16B and 671B hidden sizes
TOPKS = (6, 8)  # 16B routes top-6 of 64, V3 top-8 of 256
EXPERTS = (64, 256)
# token counts that are not multiples of DeepEP's 32/128-token chunks and channel splits
ODD_TOKENS = (1, 31, 33, 127, 129, 255, 4095, 4097, 8191)

# bf16 special bit patterns (sign | exponent | mantissa)
BF16_SPECIALS = (
    0x7FC0,  # canonical quiet NaN
    0xFFC1,  # negative quiet NaN with a payload
    0x7F81,  # signalling NaN (must survive transport unquieted)
    0x7FFF,  # NaN, all payload bits
    0x7F80, 0xFF80,  # +Inf, -Inf
    0x8000,  # -0.0
    0x0001, 0x807F,  # smallest subnormal, a negative subnormal
    0x7F7F, 0xFF7F,  # largest finite magnitudes
)
F32_SPECIALS = (0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001)


@dataclass(frozen=True)
class CaseSpec:
    world: int
    seed: int
    tokens: tuple[int, ...]  # per rank
    hidden: int
    topk: int
    num_experts: int
    routing: str = "uniform"
    payload: str = "bf16"
    specials: float = 0.01  # fraction of payload elements replaced with special bit patterns
    mask: float = 0.0  # extra fraction of top-k slots set to -1
    starved: int = -1  # the rank that receives nothing, for routing "starve_rank"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def problem(self) -> str | None:
        """Why this case cannot run (None if it can): checked before any process starts. Types come first: a
        ``--spec`` is JSON typed by hand, and a string or a bool where a number belongs crashed the comparisons below
        with a traceback (exit 1, read as a FAIL)."""
        for name in ("world", "seed", "hidden", "topk", "num_experts", "starved"):
            if not _is_int(getattr(self, name)):
                return f"{name} must be an integer, got {getattr(self, name)!r}"
        if not isinstance(self.tokens, tuple) or not all(_is_int(t) for t in self.tokens):
            return f"tokens must be a list of integers, one per rank, got {self.tokens!r}"
        for name in ("specials", "mask"):
            value = getattr(self, name)
            # NaN compares False, so it fails the range; a bool is an int to Python but no fraction
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                return f"{name} must be a fraction in [0, 1], got {value!r}"
        if not 0 <= self.seed <= SEED_MAX:  # --seed's bound; a far larger one overflowed torch's generator seeding
            return f"seed {self.seed} must be from 0 to {SEED_MAX}"
        if self.world < 2 or len(self.tokens) != self.world:
            return f"world {self.world} needs >= 2 ranks and one token count per rank (got {len(self.tokens)})"
        if any(not 0 <= t <= MAX_TOKENS for t in self.tokens):
            return f"token counts must be in [0, {MAX_TOKENS}]"
        if self.num_experts <= 0 or self.num_experts % self.world:
            return f"num_experts {self.num_experts} is not a positive multiple of the world size {self.world}"
        if not 1 <= self.topk <= self.num_experts:
            return f"topk {self.topk} must be in [1, num_experts {self.num_experts}]"
        block = FP8_BLOCK if self.payload == "fp8" else 8  # FP8: one scale per 128 channels; bf16: 16-byte rows
        if self.hidden <= 0 or self.hidden % block:
            return f"hidden {self.hidden} must be a positive multiple of {block} for {self.payload}"
        if self.hidden > max(HIDDENS):  # the check sizes every backend's buffers for max(HIDDENS) (its max_hidden)
            return f"hidden {self.hidden} is more than the {max(HIDDENS)} the check's buffers are sized for"
        if self.routing not in ROUTINGS or self.payload not in PAYLOADS:
            return f"routing must be one of {', '.join(ROUTINGS)} and payload one of {', '.join(PAYLOADS)}"
        if self.routing == "starve_rank" and not 0 <= self.starved < self.world:
            return f"starved rank {self.starved} is not in [0, {self.world})"
        return None

    @staticmethod
    def from_json(text: str) -> CaseSpec:
        """The case ``to_json`` printed; ValueError or TypeError if ``text`` is not JSON of one with every field
        (a missing or extra key, or not an object); ``problem`` then judges the values."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError(f"not a JSON object: {text}")
        if isinstance(d.get("tokens"), list):  # JSON has no tuples; anything else is left for problem() to name
            d["tokens"] = tuple(d["tokens"])
        return CaseSpec(**d)


def _is_int(value) -> bool:
    """An int that is not a bool (JSON's true is a Python int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _distinct_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    return scores.topk(k, dim=1).indices  # distinct by construction


def make_routing(spec: CaseSpec, rank: int, device: torch.device) -> torch.Tensor:
    """int64 [T, K] top-k expert indices (-1 masked), duplicate-free per row."""
    g = _generator(device, spec.seed * 1009 + rank)
    t, k, e = spec.tokens[rank], spec.topk, spec.num_experts
    local = e // spec.world
    if spec.routing == "zipf":
        weights = 1.0 / torch.arange(1, e + 1, device=device, dtype=torch.float64) ** 1.2
        weights = weights[torch.randperm(e, generator=g, device=device)]
        idx = (torch.multinomial(weights.expand(t, e), k, replacement=False, generator=g) if t
               else torch.zeros(0, k, dtype=torch.int64, device=device))
    elif spec.routing == "one_expert":
        hot = spec.seed % e
        idx = torch.full((t, k), -1, dtype=torch.int64, device=device)
        idx[:, int(torch.randint(k, (1,), generator=g, device=device))] = hot
    elif spec.routing == "starve_rank":
        scores = torch.rand(t, e, generator=g, device=device)
        scores[:, spec.starved * local:(spec.starved + 1) * local] = -1.0  # never in the top-k
        idx = _distinct_topk(scores, k)
    else:  # uniform, masked
        idx = _distinct_topk(torch.rand(t, e, generator=g, device=device), k)
    mask_p = spec.mask + (0.5 if spec.routing == "masked" else 0.0)
    if mask_p > 0 and t:
        drop = torch.rand(t, k, generator=g, device=device) < mask_p
        if spec.routing == "masked":
            drop[:: max(1, t // 3)] = True  # some tokens go nowhere at all
        idx = idx.masked_fill(drop, -1)
    return idx.contiguous()


def _specials(bits: torch.Tensor, table: tuple[int, ...], frac: float, g: torch.Generator,
              signed_from: int) -> torch.Tensor:
    """Replace a fraction of ``bits`` (an integer view) with table entries or arbitrary bits."""
    if frac <= 0 or not bits.numel():
        return bits
    dev = bits.device
    flat = bits.flatten().clone()
    where = (torch.rand(flat.shape, generator=g, device=dev) < frac).nonzero().flatten()
    n = where.numel()
    choices = torch.tensor([v - signed_from if v >= signed_from // 2 else v for v in table],
                           dtype=bits.dtype, device=dev)
    pick = torch.randint(len(table) + 1, (n,), generator=g, device=dev)
    info = torch.iinfo(bits.dtype)
    arbitrary = torch.randint(info.min, info.max, (n,), generator=g, device=dev, dtype=bits.dtype)
    flat[where] = torch.where(pick < len(table), choices[pick.clamp(max=len(table) - 1)], arbitrary)
    return flat.reshape(bits.shape)


def make_inputs(spec: CaseSpec, rank: int, device: torch.device):
    """(x, topk_idx, topk_weights) of ``rank``; identical on every rank that computes them."""
    device = torch.device(device)
    topk_idx = make_routing(spec, rank, device)
    g = _generator(device, (spec.seed * 1009 + rank) * 7 + 1)
    t, h = spec.tokens[rank], spec.hidden
    weights = torch.rand(t, spec.topk, generator=g, device=device)
    weights = _specials(weights.view(torch.int32), F32_SPECIALS, spec.specials, g, 1 << 32).view(torch.float32)
    if spec.payload == "fp8":
        data = torch.randint(0, 256, (t, h), generator=g, device=device, dtype=torch.uint8)
        exps = torch.randint(-20, 20, (t, h // FP8_BLOCK), generator=g, device=device).float()
        scales = torch.exp2(exps)
        scales = _specials(scales.view(torch.int32), F32_SPECIALS, spec.specials, g, 1 << 32)
        x = (data.view(torch.float8_e4m3fn), scales.view(torch.float32))
    else:
        x = torch.randn(t, h, generator=g, device=device).to(torch.bfloat16)
        x = _specials(x.view(torch.int16), BF16_SPECIALS, spec.specials, g, 1 << 16).view(torch.bfloat16)
    return x, topk_idx, weights


def make_combine_input(spec: CaseSpec, rank: int, rows: int, hidden: int | None,
                       device: torch.device) -> torch.Tensor:
    """bf16 [rows, hidden] expert outputs on ``rank``: normal values scaled by 2^-14..2^14, so float32
    sums round and the order of addition matters; plus the same special patterns as the payload."""
    device = torch.device(device)
    g = _generator(device, (spec.seed * 1009 + rank) * 7 + 2)
    h = hidden or spec.hidden
    mantissa = torch.randn(rows, h, generator=g, device=device)
    exponent = torch.rand(rows, h, generator=g, device=device).mul_(29).sub_(14).floor_()  # -14..14
    y = (mantissa * torch.exp2(exponent)).to(torch.bfloat16).view(torch.int16)
    return _specials(y, BF16_SPECIALS, spec.specials, g, 1 << 16).view(torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# The case space, drawn by Hypothesis (tests) or by a seeded sampler (the GPU runner)
# ---------------------------------------------------------------------------------------------

def _cap(tokens: int, hidden: int, max_elements: int) -> int:
    return min(tokens, max(1, max_elements // hidden)) if tokens else 0


@st.composite
def case_specs(draw, *, world: int, max_tokens: int = MAX_TOKENS, max_elements: int = MAX_TOKENS * 7168,
               hiddens: tuple[int, ...] = HIDDENS, payloads: tuple[str, ...] = PAYLOADS) -> CaseSpec:
    """A routing case for ``world`` ranks; ``max_elements`` caps tokens x hidden per rank (CPU sizes)."""
    hidden = draw(st.sampled_from(hiddens))
    count = st.one_of(
        st.just(0),  # a rank with no tokens at all
        st.sampled_from([c for c in ODD_TOKENS if c <= max_tokens]),
        st.integers(0, max_tokens),
    )
    tokens = tuple(_cap(draw(count), hidden, max_elements) for _ in range(world))
    routing = draw(st.sampled_from(ROUTINGS))
    return CaseSpec(
        world=world,
        seed=draw(st.integers(0, 2**20)),
        tokens=tokens,
        hidden=hidden,
        topk=draw(st.sampled_from(TOPKS)),
        num_experts=draw(st.sampled_from(EXPERTS)),
        routing=routing,
        payload=draw(st.sampled_from(payloads)),
        specials=draw(st.sampled_from([0.0, 0.01, 0.2])),
        mask=draw(st.sampled_from([0.0, 0.1])),
        starved=draw(st.integers(0, world - 1)) if routing == "starve_rank" else -1,
    )


def sample_specs(n: int, *, world: int, seed: int, max_tokens: int = MAX_TOKENS,
                 max_elements: int = MAX_TOKENS * 7168, hiddens: tuple[int, ...] = HIDDENS,
                 payloads: tuple[str, ...] = PAYLOADS) -> list[CaseSpec]:
    """``n`` cases from the same space as ``case_specs``, with a seeded NumPy generator."""
    rng = np.random.default_rng(seed)
    odd = [c for c in ODD_TOKENS if c <= max_tokens]
    out = []
    for i in range(n):
        hidden = int(rng.choice(hiddens))
        tokens = []
        for _ in range(world):
            kind = rng.integers(0, 10)
            c = 0 if kind == 0 else int(rng.choice(odd)) if kind <= 3 else int(rng.integers(1, max_tokens + 1))
            tokens.append(_cap(c, hidden, max_elements))
        routing = ROUTINGS[i % len(ROUTINGS)]
        out.append(CaseSpec(
            world=world, seed=int(rng.integers(0, 2**20)), tokens=tuple(tokens), hidden=hidden,
            topk=int(rng.choice(TOPKS)), num_experts=int(rng.choice(EXPERTS)), routing=routing,
            payload=payloads[(i // len(ROUTINGS)) % len(payloads)],
            specials=float(rng.choice([0.0, 0.01, 0.2])), mask=float(rng.choice([0.0, 0.1])),
            starved=int(rng.integers(0, world)) if routing == "starve_rank" else -1,
        ))
    return out


def edge_specs(*, world: int, max_tokens: int = MAX_TOKENS, max_elements: int = MAX_TOKENS * 7168,
               hiddens: tuple[int, ...] = HIDDENS, payloads: tuple[str, ...] = PAYLOADS) -> list[CaseSpec]:
    """Named corner cases, run before the sampled ones."""
    specs = []
    for p_i, payload in enumerate(payloads):
        for h_i, hidden in enumerate(hiddens):
            def tok(n: int) -> int:
                return _cap(min(n, max_tokens), hidden, max_elements)  # noqa: B023 - used at once

            base = {"world": world, "hidden": hidden, "payload": payload, "specials": 0.05}
            seed = 1000 * p_i + 100 * h_i
            specs += [
                CaseSpec(seed=seed + 1, tokens=(0,) * world, topk=8, num_experts=256, **base),
                CaseSpec(seed=seed + 2, tokens=(0,) + (tok(129),) * (world - 1), topk=6, num_experts=64, **base),
                CaseSpec(seed=seed + 3, tokens=(1,) * world, topk=8, num_experts=64, **base),
                CaseSpec(seed=seed + 4, tokens=(tok(max_tokens),) * world, topk=8, num_experts=256, **base),
                CaseSpec(seed=seed + 5, tokens=tuple(tok(c) for c in (33, 4095, 127, 4097)[:world])
                         + (tok(31),) * max(0, world - 4), topk=6, num_experts=64, routing="one_expert", **base),
                CaseSpec(seed=seed + 6, tokens=(tok(255),) * world, topk=8, num_experts=256,
                         routing="starve_rank", starved=world - 1, **base),
                CaseSpec(seed=seed + 7, tokens=(tok(200),) * world, topk=6, num_experts=256, routing="masked",
                         mask=1.0, **base),
                CaseSpec(seed=seed + 8, tokens=(tok(1000),) * world, topk=8, num_experts=64, routing="zipf",
                         **base),
            ]
    return specs
