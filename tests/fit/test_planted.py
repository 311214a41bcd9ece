"""Planted ground truth: the target is a reparametrised source, so the true mapping is known.

See conftest.py for the construction (value maps compensated in o_proj, per-RoPE-pair scaled
rotations of keys compensated on the queries, duplicated KV heads, inserted identity layers).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kvbridge.fit import transfer_state
from kvbridge.fit.mapping import FittedMapping
from kvbridge.handoff import generate

from .conftest import build, llama_config, token_ids

GEN = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)


def continuation(planted, mapping, host, prompt):
    source, target = planted["source"], planted["target"]
    state = host.adapter_for(source.config.to_dict()).extract(source, prompt)
    moved = transfer_state(state, mapping, host=host)
    assert moved.approximate and moved.rope_applied and moved.num_layers == target.config.num_hidden_layers
    with torch.no_grad():
        ours = generate(target, moved, prompt, host=host, **GEN)
        native = target.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **GEN)
    kl = max(
        float(
            torch.nn.functional.kl_div(
                torch.log_softmax(b[0], -1), torch.log_softmax(a[0], -1), log_target=True, reduction="sum"
            )
        )
        for a, b in zip(native.logits, ours.logits)
    )  # KL(native || transferred), worst step
    return kl, torch.equal(ours.sequences, native.sequences)


def test_the_planted_target_computes_the_source_function(planted):
    ids = planted["ids"][:2]
    with torch.no_grad():
        a, b = planted["source"](ids).logits, planted["target"](ids).logits
    assert float((a - b).abs().max()) < 1e-3 and float(a.std()) > 0.5  # same function, non-trivial logits


def test_transferred_cache_continues_like_the_native_one(planted, planted_fit, fit_host):
    for seed, length in ((101, 20), (102, 33)):
        kl, same = continuation(planted, planted_fit, fit_host, token_ids(1, length, seed=seed))
        print(f"planted ridge top-2: prompt {length} tokens, worst next-token KL {kl:.2e}, greedy identical {same}")
        assert kl <= 1e-4 and same


def test_layer_selection_finds_the_true_source_layers(planted, planted_fit):
    truth = planted["truth"]
    assert [sel[0] for sel in planted_fit.layer_selection()] == truth
    summary = planted_fit.report.r2_summary
    print(f"planted held-out R²: mean {summary['mean']:.8f}, min {summary['min']:.8f}; selection {truth}")
    assert summary["min"] > 0.9999 and not planted_fit.report.warnings
    scores = torch.tensor(planted_fit.report.selection_scores["mean"])
    for t, s in enumerate(truth):  # the true layer is the only near-perfect single source
        others = torch.cat([scores[t, :s], scores[t, s + 1 :]])
        assert scores[t, s] > 0.9999 and float(others.max()) < 0.9


def test_a_wrong_mapping_is_detected(planted, planted_fit, fit_host):
    """Control: feeding each target layer the features in the wrong order breaks the continuation."""
    layers = [replace(lm, sources=tuple(reversed(lm.sources))) for lm in planted_fit.layers]
    wrong = FittedMapping(planted_fit.source_spec, planted_fit.target_spec, layers)
    kl, _ = continuation(planted, wrong, fit_host, token_ids(1, 20, seed=101))
    assert kl > 1e-2


def test_headwise_assigns_the_true_source_heads(planted, fit_host):
    from kvbridge.fit import fit

    mapping = fit(
        planted["source"],
        planted["target"],
        planted["ids"][:12],
        fitter="ridge-headwise",
        stride=2,
        host=fit_host,
        distributed=None,
    )
    want = [[[s, j // 2] for j in range(4)] for s in planted["truth"]]
    assert mapping.layer_selection() == want
    kl, same = continuation(planted, mapping, fit_host, token_ids(1, 20, seed=101))
    print(
        f"planted ridge-headwise: worst next-token KL {kl:.2e}, greedy identical {same}, "
        f"params {mapping.summary()['parameters']}"
    )
    assert kl <= 1e-4 and same


def test_an_unrelated_pair_fits_poorly_and_the_fitter_says_so(fit_host):
    from kvbridge.fit import fit

    source = build(llama_config(vocab_size=512), seed=1)
    target = build(llama_config(vocab_size=512, num_hidden_layers=3), seed=2)
    mapping = fit(source, target, token_ids(24, vocab=512, seed=5), top_k=1, stride=2, host=fit_host, distributed=None)
    summary = mapping.report.r2_summary
    print(
        f"unrelated pair held-out R²: mean {summary['mean']:.3f} (K {summary['mean_k']:.3f}, V {summary['mean_v']:.3f})"
    )
    assert summary["mean"] < 0.3
    assert any("poor fit" in w for w in mapping.report.warnings)
