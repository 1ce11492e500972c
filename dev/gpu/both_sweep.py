"""Tile sweep of the fast cast on one GPU: along the last dim, along dim -2, and both layouts in one launch.

Run from a tree that has ``numerics.layer.fast.cast._cast_both``:  python3 dev/gpu/both_sweep.py
For each 16B cast shape: the single casts (dim -1, dim -2) at their default tiles, each of them at the tiles of
``DIM1_TILES`` and ``DIM2_TILES``, then the both-layouts cast at each tile of ``TILES``, each checked bit for bit
against the defaults; device ms (median of the bench's timer) and the ratio to the default (for both layouts: to
the two single casts' sum). A development probe: nothing here is a product figure.
"""

from __future__ import annotations

import torch

from numerics.layer.fast.bench import CAST_SHAPES, _timer
from numerics.layer.fast.cast import _cast, _cast_both

TILES = ((64, 64, 4), (64, 32, 2), (32, 32, 1), (32, 64, 1), (64, 32, 1), (32, 32, 2))  # BR: a multiple of 32
# along dim -2 (the transposed store): on an H200 and an H100 fewer warps a tile were faster (docs/studies/bench.md)
DIM2_TILES = ((64, 64, 4), (64, 32, 2), (32, 64, 1), (32, 128, 1), (32, 32, 1), (64, 64, 1), (32, 128, 2))
# along the last dim (default 32 x 128 x 4): one warp on 8 x 128 was 4-5 % faster on an H100, not yet swept on an H200
DIM1_TILES = ((32, 128, 4), (16, 128, 2), (8, 128, 1), (16, 64, 1), (32, 64, 2), (32, 128, 2), (16, 256, 2))


def main() -> None:
    dev = torch.device("cuda")
    measure = _timer(dev, iters=50, warmup=5)
    print(torch.cuda.get_device_name(dev), torch.__version__)
    for m, k in CAST_SHAPES:
        x = torch.randn(m, k, device=dev).to(torch.bfloat16)
        one = {d: (lambda d=d, x=x: _cast(x, "e4m3", "rceil", d == -2, "torchao", torch.bfloat16, return_bytes=False))
               for d in (-1, -2)}
        ref = (one[-1](), one[-2]())
        singles = {d: measure(fn)["ms"] for d, fn in one.items()}
        total = singles[-1] + singles[-2]
        print(f"{m}x{k}: dim -1 {singles[-1]:.4f} ms, dim -2 {singles[-2]:.4f} ms, sum {total:.4f} ms")
        for dim, tiles in ((-1, DIM1_TILES), (-2, DIM2_TILES)):
            for tile in tiles:
                fn = lambda t=tile, x=x, d=dim: _cast(x, "e4m3", "rceil", d == -2, "torchao",  # noqa: E731
                                                      torch.bfloat16, return_bytes=False, config=t)
                same = torch.equal(fn().view(torch.int16), ref[dim == -2].view(torch.int16))
                ms = measure(fn)["ms"]
                print(f"  dim {dim} {'x'.join(map(str, tile)):>10}: {ms:.4f} ms  /default {ms / singles[dim]:.2f}  "
                      f"{'bit-identical' if same else 'DIFFERS'}", flush=True)
        for tile in TILES:
            fn = lambda t=tile, x=x: _cast_both(x, "e4m3", "rceil", "torchao", torch.bfloat16, config=t)  # noqa: E731
            got = fn()
            same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, ref))
            ms = measure(fn)["ms"]
            print(f"  both {'x'.join(map(str, tile)):>10}: {ms:.4f} ms  both/sum {ms / total:.2f}  "
                  f"{'bit-identical' if same else 'DIFFERS'}", flush=True)


if __name__ == "__main__":
    main()
