"""Demo section 1: identity transfer on every built-in family (tiny models built from configs).

Each family's tiny model: extract the prefix cache, strip RoPE, map (identity), re-apply RoPE,
inject, continue with generate; compared with transformers' own cached continuation, and the
prefix re-positioned by +37 compared with the model run at those positions.
"""

from __future__ import annotations

import time

import click


def identity_section(families: str, new_tokens: int) -> bool:
    """The identity-transfer table over every built-in family; True when all are exact."""
    from kvbridge.errors import names_value
    from kvbridge.plugins import get_host
    from kvbridge.testing.contract import (
        IdentityResult,
        NotApplicable,
        adapter_configs,
        check_identity_transfer,
        check_shifted_identity,
    )
    from kvbridge.threads import quiet_torch

    quiet_torch(None)  # transformers' logging quiet
    host = get_host()
    wanted = set(names_value(families, "--families"))
    rows = []
    for adapter in host.adapters():
        if wanted and adapter.name not in wanted:
            continue
        for variant, cfg in adapter_configs(adapter).items():
            t0 = time.perf_counter()
            spec = adapter.describe(cfg)
            try:
                res = check_identity_transfer(adapter, cfg, host=host, new_tokens=new_tokens, tol=0.0)
                try:
                    shift = check_shifted_identity(adapter, cfg, host=host)
                except NotApplicable:
                    shift = None
            except AssertionError as exc:  # report, keep going, fail at the end
                click.echo(f"  {adapter.name}/{variant}: FAILED: {exc}", err=True)
                res, shift = IdentityResult(float("inf"), float("inf"), False, new_tokens), None
            rows.append((adapter.name, variant, spec, res, shift, time.perf_counter() - t0))
            click.echo(
                f"  {adapter.name}/{variant}: tokens {'==' if res.tokens_equal else '!='}, "
                f"max|dlogit| {res.max_logit_diff:.1e}",
                err=True,
            )
    click.echo("\n== 1. Identity transfer vs transformers' own cached continuation (float32, greedy; bitwise)\n")
    head = (
        f"{'family':<12} {'variant':<14} {'layers':>6} {'kv':>3} {'dim':>4} {'pos':<9} {'attn':<8} "
        f"{'tokens':<7} {'max|dlogit|':>11} {'shifted':>9} {'s':>5}"
    )
    click.echo(head)
    click.echo("-" * len(head))
    for name, variant, spec, res, shift, secs in rows:
        shifted = f"{shift:.1e}" if shift is not None else "n/a"
        click.echo(
            f"{name:<12} {variant:<14} {spec.num_layers:>6} {spec.num_kv_heads:>3} {spec.head_dim:>4} "
            f"{spec.positional:<9} {spec.attention_kind:<8} {'same' if res.tokens_equal else 'DIFF':<7} "
            f"{res.max_logit_diff:>11.1e} {shifted:>9} {secs:>5.1f}"
        )
    ok = all(r[3].tokens_equal and r[3].max_logit_diff == 0.0 for r in rows)
    click.echo(
        f"\n{len(rows)} model variants; identity transfer exact (state bitwise, tokens equal, max|dlogit| 0): "
        f"{'yes' if ok else 'NO'}"
    )
    return ok
