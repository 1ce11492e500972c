"""Diagnostic: GPU memory still allocated after a proxy training run returns, before and after gc.collect()."""
import gc
import tempfile
from pathlib import Path

import torch

from convergence.train.loop import TrainConfig, defaults_for, run

for recipes in (("bf16", "mxfp8-null"), ("bf16",)):  # twice: a cache stays level, a leak grows
    cfg = TrainConfig(model="proxy", recipes=recipes, steps=3, device="cuda", deterministic=True,
                      **(defaults_for("proxy") | {"probe_every": 0, "ckpt_every": 0, "val_every": 3}))
    with tempfile.TemporaryDirectory() as d:
        run(cfg, Path(d), progress=False)
    print("allocated after run GiB", torch.cuda.memory_allocated() / 2**30)
    gc.collect()
    print("allocated after gc GiB", torch.cuda.memory_allocated() / 2**30)
