"""kvbridge.evaluate.settings: the CLI's defaults, and bad values refused as one line before any load."""

from __future__ import annotations

import dataclasses

import pytest

from kvbridge.errors import KVBridgeError
from kvbridge.evaluate.settings import HELDOUT_FRACTION, EvalSettings, RecomputeSettings

#: the CLI group's context settings: a command parsed on its own must not cache another help option
#: (click keeps the first one it builds on the command; CLI.md then shows "--help" without "-h")
HELP = {"help_option_names": ["-h", "--help"]}

BASE = dict(mapping="identity", corpus="corpus.txt")
#: click parameter -> (settings object, field); heldout_fraction, no_attention and the rest are mapped below
SAME = [
    "samples",
    "prefix_len",
    "continuation_len",
    "greedy_tokens",
    "conditions",
    "bootstrap",
    "seed",
    "batch_size",
    "top_k",
    "top_p",
    "allow_overlap",
    "frontier",
    "sink",
]
RECOMPUTE = {
    "recompute_layers": "layers",
    "recompute_tokens": "tokens",
    "recompute_token_rules": "token_rules",
    "recompute_sweep": "sweep",
    "recompute_mode": "mode",
    "recompute_select": "select",
    "recompute_group": "group",
    "recompute_calibration_samples": "calibration_samples",
}


def _parsed_defaults() -> dict:
    from kvbridge.cli.eval_cmd import eval_cmd

    ctx = eval_cmd.make_context("eval", ["S", "T", "--mapping", "identity", "--corpus", __file__], **HELP)
    return ctx.params


def test_every_click_default_is_the_dataclass_default():
    params, default = _parsed_defaults(), EvalSettings(**BASE)
    for name in SAME:
        assert params[name] == getattr(default, name), name
    for cli_name, field_name in RECOMPUTE.items():
        assert params[cli_name] == getattr(default.recompute, field_name), cli_name
    assert params["heldout_fraction"] == HELDOUT_FRACTION and default.heldout_fraction is None
    assert params["attention"] is (not default.attention)  # --no-attention: the flag inverts the field
    assert tuple(params["gates"]) == default.gates and params["report_dir"] == default.report_dir
    assert params["partial_path"] == default.partial_path
    assert params["accept_fingerprint_mismatch"] is default.accept_fingerprint_mismatch
    covered = set(SAME) | {
        "heldout_fraction",
        "attention",
        "gates",
        "report_dir",
        "partial_path",
        "accept_fingerprint_mismatch",
        "recompute",
        "mapping",
        "corpus",
    }
    assert covered == {f.name for f in dataclasses.fields(EvalSettings)}


def test_defaults_and_sample_len():
    s = EvalSettings(**BASE)
    assert s.sample_len == 64 + 8 + 1 and not s.recompute.active
    assert len(s.condition_names()) > 3 and s.condition_names()[0] == "native"
    assert EvalSettings(**BASE, conditions="native, transferred").condition_names() == ("native", "transferred")
    assert RecomputeSettings(layers="3").active and RecomputeSettings(sweep="tokens").active


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(samples=1), "--samples must be a whole number >= 2"),
        (dict(prefix_len=0), "--prefix-len must be a whole number >= 1"),
        (dict(batch_size=True), "--batch-size must be a whole number >= 1"),
        (dict(bootstrap=-1), "--bootstrap must be a whole number >= 0"),
        (dict(top_p=float("nan")), "--top-p must be a finite number > 0 and <= 1, got nan"),
        (dict(top_p=1.5), "--top-p must be a finite number > 0 and <= 1, got 1.5"),
        (dict(heldout_fraction=0.0), "--heldout-fraction must be a finite number > 0 and <= 1, got 0.0"),
        (dict(conditions="native,bogus"), "unknown condition 'bogus'"),
        (dict(gates=("nonsense",)), "gate"),
        (dict(mapping=""), "--mapping is empty"),
    ],
)
def test_bad_values_are_refused_naming_the_option(kwargs, needle):
    with pytest.raises(KVBridgeError) as err:
        EvalSettings(**{**BASE, **kwargs})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_report_folder_that_is_not_a_report_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(KVBridgeError):
        EvalSettings(**BASE, report_dir=str(tmp_path))
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(mode="sideways"), "--recompute-mode must be one of target, source, got 'sideways'"),
        (dict(sweep="all"), "--recompute-sweep must be one of layers, tokens, both, got 'all'"),
        (dict(group=0), "--recompute-group must be a whole number >= 1"),
        (dict(calibration_samples=0), "--calibration-samples must be a whole number >= 1"),
        (dict(token_rules="deviation,tail"), "--recompute-token-rules 'deviation,tail': unknown rule 'tail'"),
        (dict(token_rules=" , "), "--recompute-token-rules"),
    ],
)
def test_bad_recompute_values_are_refused(kwargs, needle):
    with pytest.raises(KVBridgeError, match=needle.replace("'", ".")):
        RecomputeSettings(**kwargs)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(frontier="abc"), "--frontier 'abc': 'abc' is not a number"),
        (dict(frontier="0.1,1.5"), "--frontier '0.1,1.5': '1.5' is outside 0..1"),
        (dict(frontier="-0.1"), "'-0.1' is outside 0..1"),
        (dict(frontier="nan"), "'nan' is outside 0..1"),
        (dict(frontier="0.1,10%"), "'10%' is repeated"),
        (dict(frontier=" , "), "names no share"),
        (dict(frontier=""), "names no share"),
        (dict(frontier="0.5", sink=-1), "--sink must be a whole number >= 0"),
        (dict(frontier="0.5", conditions="native"), "--conditions cannot be combined with it"),
        (dict(frontier="0.5", gates=("default",)), "--gate cannot be combined with it"),
        (dict(frontier="0.5", recompute=RecomputeSettings(tokens="0.5")), "--recompute-* cannot be combined"),
    ],
)
def test_bad_frontier_values_are_refused(kwargs, needle):
    with pytest.raises(KVBridgeError) as err:
        EvalSettings(**{**BASE, **kwargs})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_frontier_shares_are_parsed_sorted():
    assert EvalSettings(**BASE, frontier="0.5, 10%,0.25,1,0").frontier_ratios == (0.0, 0.1, 0.25, 0.5, 1.0)
    assert EvalSettings(**BASE).frontier_ratios == () and EvalSettings(**BASE).sink == 4
