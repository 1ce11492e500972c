"""Named MX cases with hand-derived bytes: one table drives the oracle, ml_dtypes and torchao tests.

Each case is one 32-value block: ``values`` lists (index, value) pairs, every other value is +0.0.
``scale`` is the expected E8M0 byte, ``elements`` the expected bytes at the listed indices (the
rest are 0x00, or the NaN code in a NaN block). The comment on each case derives its bytes from the
rules in ``numerics.tensor.mx``:
E4M3 codes are S.EEEE.MMM with bias 7 (1.0 = 0x38, 448 = 0x7E), E5M2 codes S.EEEEE.MM with bias
15 (1.0 = 0x3C, 57344 = 0x7B), E2M1 (MXFP4's element, one code a byte here) S.EE.M with bias 1: 0.5 = 0x1
(subnormal), 1 = 0x2, 1.5 = 0x3, 2 = 0x4, 3 = 0x5, 4 = 0x6, 6 = 0x7 (emax 2), E8M0 stores 2^s as s + 127.
``findings`` names the FINDINGS.md entries a subject trips on this case (each id belongs to one
subject: ``numerics.tensor.findings.BY_ID``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str
    elem: str
    mode: str
    values: tuple[tuple[int, float], ...]
    scale: int
    elements: tuple[int, ...]
    findings: tuple[str, ...] = ()

    def block(self) -> np.ndarray:
        x = np.zeros((1, 32), dtype=np.float32)
        for i, v in self.values:
            x[0, i] = v
        return x

    def expected_elements(self) -> np.ndarray:
        """Listed bytes at their indices; 0x00 elsewhere, or the NaN code everywhere in a NaN block."""
        from numerics.tensor.elements import E8M0_NAN, ELEMENTS

        fill = ELEMENTS[self.elem].nan_code if self.scale == E8M0_NAN else 0
        e = np.full((1, 32), fill, dtype=np.uint8)
        for (i, _), byte in zip(self.values, self.elements):
            e[0, i] = byte
        return e


CASES: tuple[Case, ...] = (
    # amax 1 = 2^0: s = 0 - 8 = -8 -> byte 119 (0x77); 1 / 2^-8 = 256 = 2^8 -> E4M3 exponent field 15 -> 0x78.
    Case("e4m3_floor_one", "e4m3", "floor", ((0, 1.0),), 0x77, (0x78,)),
    # sign bit only: -1 -> 0x80 | 0x78.
    Case("e4m3_floor_negative_one", "e4m3", "floor", ((0, -1.0),), 0x77, (0xF8,)),
    # amax 1.875 = 1.111b: FLOOR s = -8, 1.875 * 256 = 480 > 448 -> saturates to 448 = 0x7E.
    Case("e4m3_floor_saturates", "e4m3", "floor", ((0, 1.875),), 0x77, (0x7E,)),
    # RCEIL: mantissa 1.875 > 1.75 (448's), so s = 0 - 8 + 1 = -7 (byte 120); 1.875 * 128 = 240
    # = 1.875 * 2^7 -> exponent field 14, mantissa 111 -> 0x77. Nothing saturates.
    Case("e4m3_rceil_no_saturation", "e4m3", "rceil", ((0, 1.875),), 0x78, (0x77,)),
    # RCEIL at exactly 448: mantissa 1.75 is not > 1.75, so s = 8 - 8 = 0 (byte 127); 448 -> 0x7E.
    Case("e4m3_rceil_exact_max", "e4m3", "rceil", ((0, 448.0),), 0x7F, (0x7E,)),
    # RCEIL one float32 ulp above 57344 = 1.75 * 2^15: mantissa > 1.75, so s = 15 - 8 + 1 = 8 (byte 135);
    # 57344.004 / 2^8 = 224.00002 rounds to 224 = 1.75 * 2^7 -> 0x76. torchao 0.18 picks s = 7 and saturates (F2).
    Case("e4m3_rceil_above_max_at_2^15", "e4m3", "rceil",
         ((0, float(np.nextafter(np.float32(57344.0), np.float32(np.inf)))),),
         0x87, (0x76,), findings=("F2",)),
    # CEIL at a power of two: ceil(log2 2) = 1, s = 1 - 8 = -7 (byte 120); 2 * 128 = 256 -> 0x78.
    Case("e4m3_ceil_power_of_two", "e4m3", "ceil", ((0, 2.0),), 0x78, (0x78,)),
    # CEIL just above a power of two: ceil(log2 1.125) = 1, s = -7; 1.125 * 128 = 144 = 1.125 * 2^7 -> 0x71.
    Case("e4m3_ceil_above_power_of_two", "e4m3", "ceil", ((0, 1.125),), 0x78, (0x71,)),
    # EVEN: 1.9375 = 1.1111b rounds (half to even) to 2.0 at 3 mantissa bits, so s = 1 - 8 = -7
    # (byte 120); 1.9375 * 128 = 248, a tie between 240 and 256 -> even mantissa -> 256 = 0x78.
    Case("e4m3_even_carries", "e4m3", "even", ((0, 1.9375),), 0x78, (0x78,)),
    # EVEN without carry: 1.8125 = 1.1101b rounds to 1.75, s = -8; 1.8125 * 256 = 464 > 448 -> 0x7E.
    Case("e4m3_even_saturates_below_carry", "e4m3", "even", ((0, 1.8125),), 0x77, (0x7E,)),
    # Subnormal elements, block scale 2^-8 from x[0] = 1: 2^-17 * 2^8 = 2^-9, E4M3's smallest
    # subnormal -> 0x01; 2^-18 -> 2^-10, a tie between 0 and 2^-9 -> even -> 0x00;
    # 3 * 2^-19 -> 1.5 * 2^-10 = 0.75 * 2^-9 -> nearest 2^-9 -> 0x01; 3 * 2^-17 -> 3 * 2^-9 -> 0x03.
    Case("e4m3_subnormal_elements", "e4m3", "floor",
         ((0, 1.0), (1, 2.0**-17), (2, 2.0**-18), (3, 3 * 2.0**-19), (4, 3 * 2.0**-17)),
         0x77, (0x78, 0x01, 0x00, 0x01, 0x03)),
    # Ties to even in the normal range, scale 2^-8: 1.0625 (between 1.0 = 0x38 and 1.125 = 0x39)
    # -> 0x38; 1.1875 (between 1.125 and 1.25 = 0x3A) -> 0x3A.
    Case("e4m3_ties_to_even", "e4m3", "floor",
         ((0, 1.0), (1, 1.0625 * 2.0**-8), (2, 1.1875 * 2.0**-8)), 0x77, (0x78, 0x38, 0x3A)),
    # Tiny block: 2^-130 gives s = -130 - 8 = -138, clamped to -127 (byte 0x00); 2^-130 / 2^-127
    # = 2^-3 -> exponent field 4 -> 0x20. torchao 0.18 stores 2^-4 = 0x18 (F1).
    Case("e4m3_floor_tiny_block", "e4m3", "floor", ((0, 2.0**-130),), 0x00, (0x20,), findings=("F1",)),
    # The same block under RCEIL: s = -130 - 8 + 0 -> clamped -127, element 2^-3 -> 0x20; torchao flushes to 0 (F1).
    Case("e4m3_rceil_tiny_block", "e4m3", "rceil", ((0, 2.0**-130),), 0x00, (0x20,), findings=("F1",)),
    # All-zero block: every rule gives s -> -inf, clamped to -127 (byte 0x00); zeros keep their sign.
    # microxcaling writes +0 for -0 (X2).
    Case("e4m3_zero_block", "e4m3", "floor", ((0, 0.0), (1, -0.0)), 0x00, (0x00, 0x80), findings=("X2",)),
    # One float32 ulp below 2^15: amax = 2^15 - 2^-9 = 1.11..1b * 2^14, so floor(log2) = 14 and
    # s = 14 - 8 = 6 (byte 133 = 0x85); amax / 2^6 = 511.99997 > 448 -> saturates to 0x7E.
    # microxcaling's float32 log2 rounds up to 15: s = 7 (0x86), element 256 = 0x78 (X1).
    Case("e4m3_floor_just_below_power_of_two", "e4m3", "floor",
         ((0, float(np.nextafter(np.float32(32768.0), np.float32(0)))),), 0x85, (0x7E,), findings=("X1",)),
    # NaN block: scale 0xFF, every element NaN (0x7F; the spec leaves the payload open).
    Case("e4m3_nan_block", "e4m3", "rceil", ((0, float("nan")), (1, 1.0)), 0xFF, (0x7F, 0x7F)),
    # E5M2: amax 1, FLOOR s = 0 - 15 = -15 (byte 112 = 0x70); 2^15 -> exponent field 30 -> 0x78.
    Case("e5m2_floor_one", "e5m2", "floor", ((0, 1.0),), 0x70, (0x78,)),
    # E5M2 RCEIL at exactly 57344 = 1.75 * 2^15: s = 0 (byte 127); element 57344 -> 0x7B.
    Case("e5m2_rceil_exact_max", "e5m2", "rceil", ((0, 57344.0),), 0x7F, (0x7B,)),
    # E5M2 RCEIL one ulp above 448 = 1.75 * 2^8: s = 8 - 15 + 1 = -6 (byte 121); 448.00003 * 64
    # = 28672.002 rounds to 28672 = 1.75 * 2^14 -> 0x77. torchao 0.18 picks s = -7 and saturates (F2).
    Case("e5m2_rceil_above_max", "e5m2", "rceil", ((0, float(np.nextafter(np.float32(448.0), np.float32(np.inf)))),),
         0x79, (0x77,), findings=("F2",)),
    # EVEN at the top of float32: amax = (2 - 2^-23) * 2^127 rounds (3 mantissa bits) up to 2^128, so
    # s = 128 - 8 = 120 (byte 247 = 0xF7), a finite scale; amax / 2^120 = 255.99998 rounds to 256 = 2^8 -> 0x78.
    # torchao 0.18.0 agrees; torchao main at 36027d8 gives the NaN scale 0xFF (F4, unreleased).
    Case("e4m3_even_amax_rounds_to_2^128", "e4m3", "even", ((31, float(np.finfo(np.float32).max)),), 0xF7, (0x78,)),
    # E5M2 FLOOR saturation: amax 1.875 -> s = -15; 1.875 * 2^15 = 61440 > 57344 -> 0x7B.
    Case("e5m2_floor_saturates", "e5m2", "floor", ((0, 1.875),), 0x70, (0x7B,)),
    # E2M1: amax 1, FLOOR s = 0 - 2 = -2 (byte 125 = 0x7D); 1 / 2^-2 = 4 -> 0x6; -1 -> 0x8 | 0x6.
    Case("e2m1_floor_one", "e2m1", "floor", ((0, 1.0), (1, -1.0)), 0x7D, (0x6, 0xE)),
    # FLOOR saturation: amax 1.75 -> s = -2; 1.75 * 4 = 7 > 6 -> 6 = 0x7.
    Case("e2m1_floor_saturates", "e2m1", "floor", ((0, 1.75),), 0x7D, (0x7,)),
    # RCEIL: mantissa 1.75 > 1.5 (6's), so s = 0 - 2 + 1 = -1 (byte 126); 1.75 * 2 = 3.5, a tie between
    # 3 (0x5) and 4 (0x6) -> the even code -> 0x6. Nothing saturates.
    Case("e2m1_rceil_no_saturation", "e2m1", "rceil", ((0, 1.75),), 0x7E, (0x6,)),
    # RCEIL at exactly 6: mantissa 1.5 is not > 1.5, so s = 2 - 2 = 0 (byte 127); 6 -> 0x7.
    Case("e2m1_rceil_exact_max", "e2m1", "rceil", ((0, 6.0),), 0x7F, (0x7,)),
    # RCEIL one float32 ulp above 192 = 1.5 * 2^7: mantissa > 1.5, so s = 7 - 2 + 1 = 6 (byte 133 = 0x85);
    # 192.00002 / 2^6 = 3.0000005 rounds to 3 -> 0x5. torchao 0.18 picks s = 5 and saturates to 6 (F2).
    Case("e2m1_rceil_above_max_at_2^7", "e2m1", "rceil",
         ((0, float(np.nextafter(np.float32(192.0), np.float32(np.inf)))),), 0x85, (0x5,), findings=("F2",)),
    # Ties to even at every E2M1 midpoint, scale 2^0 from x[0] = 4 (FLOOR s = 2 - 2 = 0, byte 127 -> 0x6):
    # 0.25 (0 | 0.5) -> 0x0; 0.75 (0.5 | 1) -> 1 = 0x2; 1.25 (1 | 1.5) -> 0x2; 1.75 (1.5 | 2) -> 2 = 0x4;
    # 2.5 (2 | 3) -> 0x4; 3.5 (3 | 4) -> 4 = 0x6; 5 (4 | 6) -> 0x6; -0.75 -> 0x8 | 0x2.
    Case("e2m1_ties_to_even", "e2m1", "floor",
         ((0, 4.0), (1, 0.25), (2, 0.75), (3, 1.25), (4, 1.75), (5, 2.5), (6, 3.5), (7, 5.0), (8, -0.75)),
         0x7F, (0x6, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xA)),
    # Subnormal element: scale 2^0 from x[0] = 4; 0.5 -> 0x1; 0.375 (between 0.25 and 0.5, above the tie) -> 0x1.
    Case("e2m1_subnormal_element", "e2m1", "floor", ((0, 4.0), (1, 0.5), (2, 0.375)), 0x7F, (0x6, 0x1, 0x1)),
    # EVEN at the top of float32 for E2M1: amax = 1.75 * 2^127 (1.11b) rounds to 1 mantissa bit as a tie
    # between 1.5 and 2.0 -> even -> 2^128, so s = 128 - 2 = 126 (byte 253 = 0xFD), a finite scale;
    # 1.75 * 2^127 / 2^126 = 3.5, a tie between 3 (0x5) and 4 (0x6) -> 0x6. torchao 0.18.0 agrees; main at 36027d8
    # gives the NaN scale 0xFF (F4, unreleased).
    Case("e2m1_even_amax_rounds_to_2^128", "e2m1", "even", ((31, 1.75 * 2.0**127),), 0xFD, (0x6,)),
    # Tiny block: 2^-125 gives FLOOR s = -125 - 2 = -127 (byte 0x00); 2^-125 / 2^-127 = 4 -> 0x6.
    # torchao 0.18 scales by 2^-126 and stores 2 = 0x4 (F1).
    Case("e2m1_floor_tiny_block", "e2m1", "floor", ((0, 2.0**-125),), 0x00, (0x6,), findings=("F1",)),
    # The same block under RCEIL: s = ceil(log2(2^-125 / 6)) = -127 (byte 0x00), element 4 -> 0x6; torchao
    # flushes it to 0 (F1).
    Case("e2m1_rceil_tiny_block", "e2m1", "rceil", ((0, 2.0**-125),), 0x00, (0x6,), findings=("F1",)),
)
BY_NAME = {c.name: c for c in CASES}
