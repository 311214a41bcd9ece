from kvbridge.testing.cli import one_line_error, run_cli


def test_run_cli_and_the_one_line_error_contract():
    res = run_cli("describe", "no-such-model-xyz")
    line = one_line_error(res, "unknown model")
    assert line.startswith("error: unknown model 'no-such-model-xyz'")
    assert run_cli("--version").exit_code == 0
