"""``kvbridge-lm-eval``: lm-eval's command line with the model registered."""

from __future__ import annotations

import pytest


def test_kvbridge_lm_eval_refuses_a_hub_task_file_offline_in_one_line(lm_eval_dir, monkeypatch, capsys):
    import kvbridge.harness.lm_eval_cli as mod

    called = []
    monkeypatch.setattr("lm_eval.__main__.cli_evaluate", lambda: called.append(1))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(
        "sys.argv",
        [
            "kvbridge-lm-eval",
            "run",
            "--model",
            "kvbridge",
            "--tasks",
            f"{lm_eval_dir / 'kvb_mc.yaml'},{lm_eval_dir / 'hub_task.yaml'}",
        ],
    )
    with pytest.raises(SystemExit) as exc:
        mod.cli_main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and not called and len(err.strip().splitlines()) == 1
    assert err.startswith("error: lm-eval task 'kvb_hub' reads its data from the Hugging Face hub")
    assert "dataset_path: json" in err and "Traceback" not in err
    monkeypatch.setattr("sys.argv", ["kvbridge-lm-eval", "run", f"--tasks={lm_eval_dir / 'kvb_mc.yaml'}"])
    mod.cli_main()  # a local task goes on to lm-eval
    assert called == [1]
