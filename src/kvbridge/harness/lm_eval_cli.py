"""``kvbridge-lm-eval``: lm-eval's own command line with the ``kvbridge`` model registered, and, offline,
a task YAML whose data lives on the hub refused in one line before lm-eval starts."""

from __future__ import annotations


def refuse_hub_task_files(argv) -> None:
    """Offline, a task YAML given by path whose data is on the hub: one-line :class:`HarnessError`
    (saying how to point it at local files) instead of lm-eval's traceback from ``datasets``."""
    from pathlib import Path

    from kvbridge.harness.lm_eval_tasks import check_local, task_config

    argv = list(argv)
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--tasks"]
    values += [a.split("=", 1)[1] for a in argv if a.startswith("--tasks=")]
    for value in values:
        for name in (t.strip() for t in value.split(",")):
            path = Path(name).expanduser()
            if path.suffix in (".yaml", ".yml") and path.is_file():
                cfg = task_config(path)
                check_local(str(cfg.get("task") or path.stem), cfg, path)


def cli_main() -> None:
    """``kvbridge-lm-eval``: lm-eval's command line with the ``kvbridge`` model registered (offline,
    a task YAML whose data is on the hub is refused in one line, exit 2)."""
    import os
    import sys

    from kvbridge.errors import KVBridgeError
    from kvbridge.harness.lm_eval_model import _flag

    if any(_flag(os.environ.get(k, "")) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        try:
            refuse_hub_task_files(sys.argv[1:])
        except KVBridgeError as exc:
            print(f"error: {exc.one_line()}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
    import kvbridge.harness.lm_eval_model  # noqa: F401 (registers the model "kvbridge")
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":  # pragma: no cover - python -m kvbridge.harness.lm_eval_cli (= kvbridge-lm-eval)
    cli_main()
