"""Every statistical threshold in the suite, each with the reason it has that value.

A key is (level, recipe, tensor, metric). ``floor(...)`` returns the ``Tolerance``; test failures
print the measured value next to ``floor`` and ``why``. Add an entry here rather than writing a
number into a test. Exact checks (casts, communication) need no entry: they compare bits.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    level: str
    recipe: str
    tensor: str
    metric: str
    floor: float
    why: str

    def describe(self, measured: float) -> str:
        return (
            f"{self.level}/{self.recipe}/{self.tensor} {self.metric}: measured {measured:.4g}, "
            f"floor {self.floor:.4g} ({self.why})"
        )


_TABLE: list[Tolerance] = [
    # ---- tensor level: one MX round trip (quantize + dequantize) against the input ----
    Tolerance(
        "tensor", "e4m3", "roundtrip", "sqnr_db", 18.0,
        "torchao's own bar for an MXFP8 round trip of random normal data "
        "(test/prototype/mx_formats/test_mx_tensor.py, torchao 0.18)",
    ),
    Tolerance(
        "tensor", "e4m3", "roundtrip_normal", "sqnr_db", 30.0,
        "derived: E4M3 has 3 mantissa bits, so uniform rounding error gives ~ 6.02*4 + 10.8 - crest "
        "loss ~ 31-32 dB for Gaussian blocks of 32; measured 30.7 (FLOOR) to 31.5 dB (RCEIL) on "
        "8192x7168 bf16 (GPU.md, torchao 0.18, H200); 30 dB leaves 0.7 dB margin below the worst mode",
    ),
    Tolerance(
        "tensor", "e5m2", "roundtrip", "sqnr_db", 12.0,
        "derived: E5M2 has 2 mantissa bits, one fewer than E4M3, so ~6 dB below E4M3's 18 dB bar",
    ),
    # ---- training level: loss-curve comparison (convergence.compare); "floor" holds the default ----
    Tolerance(
        "training", "any", "loss_curve", "relative_margin", 0.0025,
        "DeepSeek-V3 Technical Report (arXiv:2412.19437, sec. 3.3, FP8 training): the FP8 run's loss "
        "stays within 0.25% relative error of the BF16 baseline, 'within training randomness'; used as "
        "the equivalence margin on the mean relative difference of smoothed loss",
    ),
    Tolerance(
        "training", "any", "loss_curve", "confidence", 0.95,
        "family confidence of the two intervals (whole range, final fraction): each is a two-sided "
        "97.5% interval (Bonferroni), so false not_equivalent <= 5% and false equivalent <= 1.25% "
        "by construction; measured rates in README-curves.md (python -m convergence calibrate)",
    ),
    Tolerance(
        "training", "any", "loss_curve", "spike_sigma", 8.0,
        "a spike is log-loss above its trailing median by > 8 robust sigmas (1.4826*MAD); Gaussian "
        "tail at 8 sigma is ~6e-16 per point, so 1e6-point runs of pure noise flag none; measured 0 "
        "diverged verdicts on identical synthetic AR(1) pairs (calibrate)",
    ),
    Tolerance(
        "training", "any", "loss_curve", "spike_min_rise", 0.05,
        "a spike must also raise the loss by > 5% over its trailing median: loss spikes that matter "
        "in LLM pretraining are tens of percent (OPT/PaLM logbooks); smaller bumps are step noise",
    ),
    Tolerance(
        "training", "any", "loss_curve", "recovery_fraction", 0.02,
        "a spike recovers if the loss comes back under the threshold within 2% of the run's steps "
        "(e.g. 2,000 of 100,000); pretraining spikes that heal do so within hundreds of steps",
    ),
    Tolerance(
        "training", "any", "loss_curve", "final_rise", 0.02,
        "diverged if the smoothed final loss exceeds the run's own smoothed minimum by > 2%: ~15x the "
        "0.14% standard error of a 200-point window mean at 2% step noise; a healthy run with a "
        "non-increasing LR schedule ends near its minimum",
    ),
]

_INDEX = {(t.level, t.recipe, t.tensor, t.metric): t for t in _TABLE}
assert len(_INDEX) == len(_TABLE), "duplicate tolerance keys"


def floor(level: str, recipe: str, tensor: str, metric: str) -> Tolerance:
    try:
        return _INDEX[(level, recipe, tensor, metric)]
    except KeyError:
        raise KeyError(
            f"no tolerance for {(level, recipe, tensor, metric)}; add one with its justification "
            "to numerics/tolerances.py"
        ) from None


def all_tolerances() -> list[Tolerance]:
    return list(_TABLE)
