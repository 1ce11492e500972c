"""python -m numerics layers [--config tiny|16b] [--json OUT] [--markdown OUT] — the per-layer table.

Runs every layer of the config FP32 / BF16 / MXFP8 (both torchao recipes) on one device, prints the
table, lists any MXFP8 figure below its floor (exit 1 then), and optionally writes
``{"header": {versions, device, config}, "records": [...]}`` JSON and a Markdown table. Existing
output files are kept unless ``--force`` is given.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from numerics.cli import ArgumentParser, CLIError, run_main
from numerics.files import atomic_write, check_distinct, check_writable
from numerics.layer.configs import SUITES, suite


def _device(name: str | None) -> str:
    import torch

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {name}: no CUDA device is visible")
    if name != "cpu" and not name.startswith("cuda"):
        raise CLIError(f"--device {name!r}: use cpu or cuda[:N]")
    return name


def _writable(path: str | None, force: bool) -> Path | None:
    """Refused up front: an existing file without --force, a directory, a folder that cannot be written."""
    return None if path is None else check_writable(path, force=force)


def _main(argv: Sequence[str] | None) -> int:
    parser = ArgumentParser(prog="python -m numerics layers", description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(SUITES), default="tiny")
    parser.add_argument("--device", help="cpu or cuda[:N]; default cuda when visible")
    parser.add_argument("--json", help="write the records as JSON here")
    parser.add_argument("--markdown", help="write the table as Markdown here")
    parser.add_argument("--force", action="store_true", help="overwrite existing output files")
    args = parser.parse_args(argv)
    device = _device(args.device)
    check_distinct(json=args.json, markdown=args.markdown)
    json_path, md_path = _writable(args.json, args.force), _writable(args.markdown, args.force)

    from numerics.layer import harness as layers
    from numerics.layer import results as results_mod

    cfg = suite(args.config)
    start = time.perf_counter()

    def progress(msg: str) -> None:
        print(f"{time.perf_counter() - start:7.1f}s {msg}", file=sys.stderr, flush=True)

    results = layers.run_suite(cfg, device=device, progress=progress)
    if json_path:
        atomic_write(json_path, results_mod.to_json(results, layers.header(args.config, device)) + "\n", force=True)
    if md_path:
        atomic_write(md_path, f"# Layer statistics: config {cfg.name}, {device}\n\n"
                     + results_mod.format_table(results, markdown=True) + "\n", force=True)
    print(results_mod.format_table(results))
    bad = results_mod.floor_violations(results)
    for line in bad:
        print(f"BELOW FLOOR {line}")
    print(f"{len(results)} layers, {'all above their floors' if not bad else f'{len(bad)} figures below floor'}"
          f" ({time.perf_counter() - start:.1f}s)")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
