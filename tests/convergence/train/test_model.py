"""The DeepSeek-V3 model family: shapes and parameter counts, causality, MoE routing, RoPE/YaRN."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from convergence.train.model import Transformer, build_on_meta
from numerics.layer.configs import CONFIGS, deepseek_v3_16b, get_config, param_count, tiny
from numerics.layer.deepseek_v3 import MoE, rope_frequencies

# DeepSeek-V2-Lite / torchtitan DeepSeek-V3 16B: "15.7B total parameters" (model card), untied head
KNOWN_16B_TOTAL = 15.7e9


def test_param_count_16b_is_the_known_total():
    total = param_count(deepseek_v3_16b())["total"]
    assert abs(total - KNOWN_16B_TOTAL) / KNOWN_16B_TOTAL < 0.005, total  # 15.706B: rounds to 15.7B


@pytest.mark.parametrize("name", list(CONFIGS))
def test_param_count_formula_matches_the_built_module(name):
    cfg = get_config(name)
    model = build_on_meta(cfg)
    assert sum(p.numel() for p in model.parameters()) == param_count(cfg)["total"]


def test_16b_config_has_torchtitans_16b_shape():
    c = deepseek_v3_16b()
    assert (c.dim, c.n_layers, c.n_dense_layers, c.vocab_size, c.n_heads) == (2048, 27, 1, 102400, 16)
    assert (c.n_routed_experts, c.top_k, c.score_func, c.n_shared_experts) == (64, 6, "softmax", 2)
    assert (c.moe_hidden, c.dense_hidden, c.kv_lora_rank, c.q_lora_rank) == (1408, 10944, 512, 0)
    assert (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (128, 64, 128)


def test_proxy_is_half_to_one_billion_with_16b_layer_shapes():
    p, b = get_config("proxy"), deepseek_v3_16b()
    assert 0.5e9 <= param_count(p)["total"] <= 1.0e9
    same = ("dim", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
            "moe_hidden", "dense_hidden", "top_k", "n_shared_experts", "score_func")
    assert all(getattr(p, f) == getattr(b, f) for f in same)


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny().dim = 3


def _model(seed=0, **changes):
    m = Transformer(dataclasses.replace(tiny(), **changes))
    m.init_weights(torch.Generator().manual_seed(seed))
    return m


def test_transformer_is_causal():
    m = _model()
    tok = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    changed = tok.clone()
    changed[:, 20:] = (changed[:, 20:] + 7) % 256
    with torch.no_grad():
        a, b = m(tok), m(changed)
    # not bit-equal: changing later tokens regroups the experts' grouped GEMMs (other M per expert),
    # which may change the summation order of earlier tokens' rows in the last bits
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=1e-5, atol=1e-5)
    assert (a[:, 20:] - b[:, 20:]).abs().max() > 1e-2


def test_init_is_a_function_of_the_seed():
    a, b, c = _model(0), _model(0), _model(1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.output.weight, c.output.weight)


@pytest.mark.parametrize("score_func,route_norm", [("softmax", False), ("sigmoid", True)])
def test_moe_dispatch_combine_matches_a_per_token_loop(score_func, route_norm):
    torch.manual_seed(0)
    m = _model(score_func=score_func, route_norm=route_norm).layers[1].moe
    with torch.no_grad():
        m.expert_bias.copy_(torch.randn(m.n_experts) * 0.01)
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        got = m(x).reshape(-1, 64)
        xf = x.reshape(-1, 64)
        scores = m.router(xf, score_func)
        idx = (scores + m.expert_bias).topk(m.top_k, -1).indices
        w = scores.gather(-1, idx)
        if route_norm:
            w = w / w.sum(-1, keepdim=True)
        want = m.shared_experts(xf).clone()
        e = m.experts
        for t in range(xf.shape[0]):
            for j in range(m.top_k):
                k = int(idx[t, j])
                h = torch.nn.functional.silu(e.w1.weight[k] @ xf[t]) * (e.w3.weight[k] @ xf[t])
                want[t] += w[t, j] * (e.w2.weight[k] @ h)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_moe_counts_every_routed_slot_and_bias_moves_toward_balance():
    m: MoE = _model().layers[1].moe
    with torch.no_grad():
        m(torch.randn(4, 32, 64))
    counts = m.tokens_per_expert.clone()
    assert counts.sum() == 4 * 32 * m.top_k
    share = m.end_step(1e-3)
    assert share == pytest.approx(float(counts.max() / counts.sum()))
    assert m.tokens_per_expert.sum() == 0
    busiest, idlest = int(counts.argmax()), int(counts.argmin())
    assert m.expert_bias[busiest] < 0 < m.expert_bias[idlest]
    assert abs(float(m.expert_bias.sum())) < 1e-6


def test_rope_is_plain_without_yarn_and_interpolated_with_it():
    plain_cfg = dataclasses.replace(tiny(), max_seq_len=128, original_seq_len=128)
    _, sin = rope_frequencies(plain_cfg, 4)
    d = plain_cfg.qk_rope_head_dim
    inv = 1.0 / (plain_cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    torch.testing.assert_close(sin[1].double(), torch.sin(inv), rtol=1e-6, atol=1e-7)
    _, ysin = rope_frequencies(tiny(), 4)  # tiny: max_seq_len 512 > original 128, factor 40
    yinv = torch.asin(ysin[1].double().clamp(-1, 1))
    assert yinv[0] == pytest.approx(float(inv[0]), rel=1e-6)  # highest frequency kept
    assert yinv[-1] == pytest.approx(float(inv[-1]) / tiny().rope_factor, rel=1e-4)  # lowest divided


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_activation_checkpointing_changes_no_bit_and_counts_each_token_once(recipe):
    """The 16B fits two GPUs only with activation checkpointing, so it must be free of numerics:
    one forward and backward of the tiny model with and without it give the same loss and gradients bit for
    bit, and the MoE's token counts (the expert-load metric and the bias update) are not doubled by the
    recompute. A control: a forward run twice without the guard does double them."""
    from numerics.layer.recipes import apply_recipe, get_recipe

    cfg = dataclasses.replace(tiny(), vocab_size=256)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    runs = {}
    for ac in (False, True):
        model = Transformer(cfg)
        model.init_weights(torch.Generator().manual_seed(0))
        apply_recipe(model, get_recipe(recipe), "cpu", kernel="emulated" if recipe != "bf16" else None)
        model.activation_checkpointing = ac
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        runs[ac] = (loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
                    [m.tokens_per_expert.clone() for _, m in model.moe_layers()])
    (loss0, grads0, counts0), (loss1, grads1, counts1) = runs[False], runs[True]
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys() and all(torch.equal(grads0[n], grads1[n]) for n in grads0)
    assert all(torch.equal(a, b) for a, b in zip(counts0, counts1)) and counts0[0].sum() > 0
    moe = model.moe_layers()[0][1]
    before = moe.tokens_per_expert.clone()
    with torch.no_grad():
        model(tokens[:, :-1])
    assert torch.equal(moe.tokens_per_expert, 2 * before)  # the counter does count every forward it is not told to skip


def test_the_16b_keeps_its_real_vocabulary_with_a_small_tokenizer():
    """The 16B's embedding and output head at their real 102,400 rows (0.4B parameters) even with
    the byte tokenizer; the smaller models take the tokenizer's vocabulary."""
    from convergence.train.loop import TrainConfig, model_config

    assert model_config(TrainConfig(model="16b", recipes=("bf16",), steps=1), 256).vocab_size == 102400
    assert model_config(TrainConfig(model="16b", recipes=("bf16",), steps=1), 120000).vocab_size == 120000
    assert model_config(TrainConfig(model="proxy", recipes=("bf16",), steps=1), 256).vocab_size == 256
    assert param_count(model_config(TrainConfig(model="16b", recipes=("bf16",), steps=1), 256))["total"] \
        == param_count(deepseek_v3_16b())["total"]


def test_floor_control_is_torchaos_floor_ops_on_either_kernel():
    """The mxfp8-floor positive control converts the same modules as mxfp8 and puts torchao's FLOOR ops in
    them: one forward and backward of the tiny model is the same bit for bit with the emulated kernel
    (torchao's ops, ScaleCalculationMode.FLOOR) and the fast one, and differs from mxfp8's (RCEIL)."""
    pytest.importorskip("triton", reason="the fast kernels run on CPU in Triton's interpreter: pip install '.[fast]'")
    from numerics.layer.recipes import CONTROLS, MX_RECIPES, apply_recipe, get_recipe

    assert "mxfp8-floor" in CONTROLS and "mxfp8-floor" not in MX_RECIPES
    cfg = dataclasses.replace(tiny(), vocab_size=256)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(2))
    runs = {}
    for recipe, kernel in (("mxfp8-floor", "emulated"), ("mxfp8-floor", "fast"), ("mxfp8", "emulated")):
        model = Transformer(cfg)
        model.init_weights(torch.Generator().manual_seed(0))
        info = apply_recipe(model, get_recipe(recipe), "cpu", kernel=kernel)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        runs[recipe, kernel] = (info, logits.detach(), {n: p.grad for n, p in model.named_parameters()
                                                        if p.grad is not None})
    (info_e, out_e, g_e), (_, out_f, g_f), (info_r, out_r, _) = runs.values()
    assert info_e["torchao_config"]["scale_calculation_mode"] == "FLOOR"
    assert info_r["torchao_config"]["scale_calculation_mode"] == "RCEIL" and info_e["quantized"] == info_r["quantized"]
    assert torch.equal(out_e, out_f) and g_e.keys() == g_f.keys() and all(torch.equal(g_e[n], g_f[n]) for n in g_e)
    assert not torch.equal(out_e, out_r)


def test_init_draws_in_place_the_numbers_of_randn_times_scale():
    """init_weights fills each parameter in place (the 16b's 63 GB without a copy) with the numbers
    ``randn(shape) * scale`` draws in parameter order from the same generator (golden runs and checkpoints depend on
    them), written here independently as the reference."""
    import math

    model = Transformer(tiny())
    model.init_weights(torch.Generator().manual_seed(3))
    g, std, n = torch.Generator().manual_seed(3), tiny().init_std, tiny().n_layers
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        scale = std / math.sqrt(2 * n) if name.endswith((".wo.weight", ".w2.weight")) else std
        assert torch.equal(p, torch.randn(p.shape, generator=g, dtype=torch.float32) * scale), name


def test_fingerprint_is_the_bits_whatever_the_thread_count():
    """The same weights fingerprint the same on one thread (a torchrun rank) and on several (one process),
    which float64 sums of the weights do not above torch's parallel grain (shown below: the control); and a
    one-ulp change in one weight changes it."""
    from convergence.train.loop import fingerprint

    big = torch.nn.Linear(1024, 1024)
    with torch.no_grad():
        big.weight.normal_(generator=torch.Generator().manual_seed(0)).mul_(0.02).add_(0.001)
    threads = torch.get_num_threads()
    try:
        prints, squares = [], []
        for n in (1, 2):
            torch.set_num_threads(n)
            prints.append(fingerprint(big))
            squares.append(float((big.weight.detach().double() ** 2).sum()))
    finally:
        torch.set_num_threads(threads)
    assert prints[0] == prints[1] and prints[0].startswith("sha256:")
    assert squares[0] != squares[1]  # the control: a float64 sum of the weights depends on the thread count
    with torch.no_grad():
        big.weight[5, 7] = torch.nextafter(big.weight[5, 7], torch.tensor(1.0))
    assert fingerprint(big) != prints[0]


@pytest.mark.parametrize("changes", [{}, {"n_dense_layers": 2, "n_layers": 3}])
def test_built_without_default_init_is_the_same_model(changes):
    """build_initialised skips the modules' own initialisation (it builds on the meta device, then allocates):
    every parameter and buffer equals a plainly constructed model's after the same init_weights."""
    from convergence.train.model import build_initialised

    cfg = dataclasses.replace(tiny(), **changes)
    plain = Transformer(cfg)
    plain.init_weights(torch.Generator().manual_seed(7))
    fast = build_initialised(cfg, 7)
    a, b = dict(plain.named_buffers()) | dict(plain.named_parameters()), dict(fast.named_buffers()) | dict(
        fast.named_parameters())
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]) and a[name].device == b[name].device, name
