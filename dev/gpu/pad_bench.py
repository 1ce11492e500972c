"""The fast path's group pad as a gather (branch `gatherpad`) against the scatter before it, at the proxy's MoE shapes.

Run from a tree whose ``numerics.layer.fast.padding`` has ``sources``:  python3 dev/gpu/pad_bench.py
Per shape ([tokens x top-k, dim] and [.., moe_hidden], 16 experts, routing drawn at random): device ms of the
scatter pad, of the gather pad (its maps made once, as the grouped GEMM makes them), and of the maps, with a
bit-for-bit check of the two pads. A development probe: the step-level figure is `convergence profile-step`'s.
"""

from __future__ import annotations

import torch

from numerics.layer.configs import proxy
from numerics.layer.fast import padding
from numerics.layer.fast.bench import _timer


def scatter_pad(x: torch.Tensor, dest: torch.Tensor, rows: int) -> torch.Tensor:
    return x.new_zeros(rows, *x.shape[1:]).index_copy_(0, dest, x)


def main() -> None:
    dev = torch.device("cuda")
    cfg = proxy()
    measure = _timer(dev, iters=50, warmup=5)
    g = torch.Generator(device="cpu").manual_seed(0)
    tokens = 4 * 2048 * cfg.top_k
    picks = torch.multinomial(torch.ones(cfg.n_routed_experts), tokens, replacement=True, generator=g)
    offs = torch.bincount(picks, minlength=cfg.n_routed_experts).cumsum(0).to(torch.int32).to(dev)
    rows = padding.padded_rows(tokens, cfg.n_routed_experts)
    dest, _, ends = padding.destinations(offs, tokens)
    src, blank = padding.sources(offs, dest, ends, rows)
    print(torch.cuda.get_device_name(dev), torch.__version__, f"{tokens} routed rows, {rows} padded")
    print(f"maps (sources): {measure(lambda: padding.sources(offs, dest, ends, rows))['ms']:.4f} ms")
    for width in (cfg.dim, cfg.moe_hidden):
        x = torch.randn(tokens, width, device=dev).to(torch.bfloat16)
        same = torch.equal(scatter_pad(x, dest, rows).view(torch.int16), padding.pad(x, src, blank).view(torch.int16))
        old = measure(lambda x=x: scatter_pad(x, dest, rows))["ms"]
        new = measure(lambda x=x: padding.pad(x, src, blank))["ms"]
        print(f"[{tokens}, {width}]: scatter {old:.4f} ms, gather {new:.4f} ms, gather/scatter {new / old:.2f}, "
              f"{'bit-identical' if same else 'DIFFERS'}")


if __name__ == "__main__":
    main()
