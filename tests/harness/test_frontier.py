"""``kvbridge harness --frontier``: the frontier's truncated@R / tail@R on the zoo, with its own cache
builders; at R = 1 both are the target's own prefill (its answers exactly), the condition names are
exact in the JSON, tail@R is paired against truncated@R, and a bad R is refused in one line."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def tasks(mc_file):
    from kvbridge.harness.run import load_tasks

    return load_tasks(
        ["recall", "mc"],
        {
            "recall": {"lengths": "48", "positions": "0.2,0.8", "n": "1", "max_new_tokens": "4"},
            "mc": {"path": str(mc_file)},
        },
    )


def test_frontier_at_one_answers_as_the_target_and_names_are_exact(base, tasks, noisy):
    from kvbridge.harness.report import markdown, terminal_table
    from kvbridge.harness.run import run_harness

    model, tok = base
    res = run_harness(model, model, noisy(3.0), tok, tasks, frontier="1,0.25", sink=2, bootstrap=30)
    names = ["truncated@0.25", "tail@0.25", "truncated@1", "tail@1"]
    assert res["conditions"] == ["target", "source", "transferred", "plain", "no_context"] + names
    assert res["frontier"] == {"ratios": [0.25, 1.0], "sink": 2, "conditions": names}
    changed = 0
    for records in res["items"].values():
        for rec in records:
            assert rec["answers"]["truncated@1"] == rec["answers"]["target"]
            assert rec["answers"]["tail@1"] == rec["answers"]["target"]
            changed += rec["answers"]["transferred"] != rec["answers"]["target"]
    assert changed  # the noisy transfer does change answers: tail@1 restored them
    paired = res["tasks"]["mc"]["paired"]
    assert {"tail@0.25-truncated@0.25", "tail@1-truncated@1", "tail@0.25-source", "truncated@0.25-source"} <= set(
        paired
    )
    assert "tail@1" in res["tasks"]["mc"]["by_condition"] and res["timing"]["frontier_s"] > 0
    table = terminal_table(res)
    assert "tail@0.25-truncated@0.25" in table and "mc: tail@1 retention" in table and "2 sink tokens" in table
    assert "tail@0.25-truncated@0.25" in markdown(res)


def test_truncated_keeps_the_original_positions(base):
    """truncated@R scores a continuation as a forward of the kept tokens at their original positions
    (the live ids at P, P+1, ...), not as a shorter context renumbered from 0."""
    from kvbridge.harness.conditions import Answerer
    from kvbridge.recompute.frontier import kept_rows
    from kvbridge.transfer import IdentityMapping

    model, tok = base
    ans = Answerer(model, model, IdentityMapping(), tok, frontier=(0.25,), sink=2)
    ctx = tok("To be, or not to be: that is the question. Whether 'tis nobler in the mind", add_special_tokens=True)[
        "input_ids"
    ]
    live = tok(" to suffer", add_special_tokens=False)["input_ids"]
    cont = tok(" the slings", add_special_tokens=False)["input_ids"]
    p = len(ctx)
    rows = kept_rows(p, 0.25, 2, tail=False).tolist()
    feed = [ctx[i] for i in rows] + live + cont
    pos = rows + list(range(p, p + len(live) + len(cont)))
    n = len(cont)

    def want(position_ids):
        with torch.no_grad():
            logits = model(torch.tensor([feed]), position_ids=torch.tensor([position_ids])).logits[0]
        logp = torch.log_softmax(logits.double(), -1)
        return float(logp[-n - 1 : -1].gather(-1, torch.tensor(cont)[:, None]).sum())

    got, _ = ans.loglikelihood("truncated@0.25", ctx, live, cont)
    assert got == pytest.approx(want(pos), abs=1e-3)
    assert abs(got - want(list(range(len(feed))))) > 1e-3  # the positions matter: renumbering is another answer
    text = ans.generate("truncated@0.25", ctx, live, max_new_tokens=3)
    with torch.no_grad():
        ids, ps = [ctx[i] for i in rows] + live, rows + list(range(p, p + len(live)))
        out = []
        for _ in range(3):
            nxt = int(model(torch.tensor([ids]), position_ids=torch.tensor([ps])).logits[0, -1].argmax())
            out.append(nxt)
            ids, ps = ids + [nxt], ps + [ps[-1] + 1]
    assert text == tok.decode(out, skip_special_tokens=True)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(frontier="0.1,1.5"), "--frontier '0.1,1.5': '1.5' is outside 0..1"),
        (dict(frontier="x"), "is not a number"),
        (dict(sink=-1), "--sink must be a whole number >= 0"),
    ],
)
def test_bad_frontier_is_refused_in_one_line(kwargs, needle):
    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.settings import HarnessSettings

    with pytest.raises(KVBridgeError) as err:
        HarnessSettings(mapping="identity", tasks=("recall",), **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cli_refuses_a_bad_share_in_one_line_before_loading():
    from click.testing import CliRunner

    from kvbridge.cli.main import cli

    res = CliRunner().invoke(
        cli, ["harness", "zoo:base", "zoo:base", "--mapping", "identity", "--tasks", "recall", "--frontier", "0.1,2"]
    )
    assert res.exit_code != 0 and "Traceback" not in res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "--frontier '0.1,2': '2' is outside 0..1" in lines[0], res.output


def test_settings_reach_the_run_through_harness_pair(tmp_path):
    """--frontier / --sink as settings: the conditions, the sink and the report's header line."""
    from kvbridge.harness.pair_run import harness_pair
    from kvbridge.harness.settings import HarnessSettings
    from kvbridge.models.pair import load_pair

    pair = load_pair("zoo:base", "zoo:base")
    settings = HarnessSettings(
        mapping="identity",
        tasks=("recall",),
        bootstrap=0,
        task_options=("recall.lengths=48", "recall.positions=0.5", "recall.n=1"),
        conditions=("target", "truncated@0.5", "tail@0.5"),
        frontier="50%",
        sink=1,
        report_dir=str(tmp_path / "rep"),
    )
    result, written = harness_pair(pair, settings)
    assert result["conditions"] == ["target", "truncated@0.5", "tail@0.5"]
    assert result["frontier"] == {"ratios": [0.5], "sink": 1, "conditions": ["truncated@0.5", "tail@0.5"]}
    assert "1 sink tokens" in written["summary.md"].read_text()
    rec = result["items"]["recall"][0]
    assert rec["answers"]["tail@0.5"] == rec["answers"]["target"]  # identity: the mapped rows are the target's
