"""A resumable prefill run one decoder layer at a time (``bench_pair_speed.py --layerwise DIR``).

The model's own forward builds every input its decoder layers get: it runs once with each layer's
``forward`` replaced by a recorder that keeps the arguments it was called with and passes the hidden
state through unchanged (the embedding, the rotary embedding, the causal masks as transformers builds
them, one per layer type, the cache object, the position ids: all exactly what the forward would hand
each layer). Then the layers run for real, one call each, with those arguments, and the final norm and
the last position's logits (``logits_to_keep=1``) follow as the model's forward applies them. Same
modules, same arguments, same order: the result is bitwise the one forward's (``tests/test_bench_pair_speed.py``).

After each layer ``DIR`` gets, each file written to a temporary name and renamed into place:

- ``kv-NNN.safetensors``: that layer's K and V (``keys``, ``values``; the cache's own layout), then
  dropped from the cache (a finished layer's K/V is not read again in a prefill);
- ``hidden-NNN.safetensors``: the hidden state after layer NNN (the previous one is removed once the
  record names the new one);
- ``record.json``: what the folder was made for (model, length, seed, ids, dtype, threads, versions),
  each finished layer's wall and CPU seconds, load average and resident peak, and each session.

Rerunning the same command resumes after the last finished layer; a folder made for anything else is
refused in one line and left as it is. ``max_seconds`` stops a session between layers. The finished
run writes ``final.safetensors`` (the normed hidden state and the last position's logits).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

FORMAT = 1
RECORD = "record.json"
FINAL = "final.safetensors"
LOCK = ".lock"

_PEAK = [0.0]


def rss_gib() -> float:
    """The process's peak so far, over every step: kept here because :func:`reset_step_peak` also resets
    what ``getrusage`` (and ``/usr/bin/time``) report as the maximum resident set size."""
    _PEAK[0] = max(_PEAK[0], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    return _PEAK[0]


def reset_step_peak() -> bool:
    """Reset this process's resident high-water mark (``VmHWM``; Linux only): False where it cannot."""
    rss_gib()  # fold the peak so far into the running maximum first
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def step_peak_gib() -> float | None:
    """``VmHWM`` in GiB: the resident peak since the last :func:`reset_step_peak` (None off Linux)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


class Refused(Exception):
    """The folder cannot be used for this run (one line: what it was made for, and the fix)."""


def ids_digest(ids) -> str:
    """sha256 of the token ids (int64, row-major): the inputs a folder was made for."""
    import torch

    return hashlib.sha256(ids.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def make_meta(*, model: str, weights: str | None, config: str | None, ids, dtype: str, threads: int, seed: int) -> dict:
    """What a layerwise folder is made for; a rerun must match every field to resume."""
    import torch
    import transformers

    return {
        "model": model,
        "weights": weights,
        "config": config,
        "length": int(ids.shape[-1]),
        "seed": int(seed),
        "ids_sha256": ids_digest(ids),
        "dtype": dtype,
        "threads": int(threads),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _commit(tmp: Path, dst: Path) -> None:
    from kvbridge.durable import commit_file

    commit_file(tmp, lambda: os.replace(tmp, dst))


def _save_tensors(path: Path, tensors: dict, metadata: dict) -> None:
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={k: str(v) for k, v in metadata.items()})
    _commit(tmp, path)


def _load_tensors(path: Path) -> dict:
    """The tensors of ``path``, copied into memory torch allocated (not views of a mapped file)."""
    from safetensors.torch import load_file

    return {k: v.clone() for k, v in load_file(path).items()}


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1))
    _commit(tmp, path)


def _hidden_name(layer: int) -> str:
    return f"hidden-{layer:03d}.safetensors"


def _kv_name(layer: int) -> str:
    return f"kv-{layer:03d}.safetensors"


def read_record(folder: Path) -> dict | None:
    """The folder's record, or None where it has none."""
    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise Refused(f"{folder}: {RECORD} is unreadable ({exc}): pass a new --layerwise folder") from None


def check_folder(folder: Path, meta: dict) -> dict | None:
    """Refuse (one line, nothing written) a folder made for another run; its record, or None when new."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise Refused(f"{folder}: not a folder: pass a folder for --layerwise")
    record = read_record(folder) if folder.is_dir() else None
    if record is None:
        if folder.is_dir() and any(p.name != LOCK for p in folder.iterdir()):
            raise Refused(f"{folder}: not empty and has no {RECORD}: pass a new or empty folder for --layerwise")
        return None
    if record.get("format") != FORMAT:
        raise Refused(f"{folder}: record format {record.get('format')!r}, not {FORMAT}: pass a new --layerwise folder")
    made = record.get("meta", {})
    diff = [k for k in sorted(set(made) | set(meta)) if made.get(k) != meta.get(k)]
    if diff:
        if len(diff) > 1 and "ids_sha256" in diff:
            diff.remove("ids_sha256")  # other ids follow from another length or seed: name those

        def short(v):
            return f"{v[:12]}..." if isinstance(v, str) and len(v) > 16 else v

        was = ", ".join(f"{k} {short(made.get(k))}" for k in diff)
        now = ", ".join(f"{k} {short(meta.get(k))}" for k in diff)
        raise Refused(
            f"{folder}: made for {was}, not {now}: rerun with the options it was made with, "
            "or pass a new --layerwise folder"
        )
    done = len(record.get("layers", []))
    if done and not (folder / _hidden_name(done - 1)).is_file() and not record.get("complete"):
        raise Refused(f"{folder}: {_hidden_name(done - 1)} is missing (record says {done} layers): pass a new folder")
    return record


@contextlib.contextmanager
def _locked(folder: Path):
    import fcntl

    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Refused(f"{folder}: another run holds it: wait for it to stop") from None
        yield
    finally:
        os.close(fd)


def parts(model):
    """(decoder layers, final norm, lm head, input embedding) of a decoder-only causal LM."""
    decoder = model.get_decoder()
    norm = getattr(decoder, "norm", None)
    if norm is None or not hasattr(decoder, "layers"):
        raise Refused(f"{type(model).__name__}: no decoder .layers / .norm: --layerwise supports Llama-like models")
    return decoder.layers, norm, model.get_output_embeddings(), model.get_input_embeddings()


def _clock(module, sink: list):
    """Hooks adding each call's (wall, CPU) seconds of ``module`` to ``sink``."""
    start = []
    pre = module.register_forward_pre_hook(lambda *_: start.append((time.perf_counter(), time.process_time())))

    def post(*_):
        t, c = start.pop()
        sink.append((time.perf_counter() - t, time.process_time() - c))

    return pre, module.register_forward_hook(post)


def record_layer_inputs(model, ids):
    """Run the model's forward with each decoder layer recording its arguments instead of running.

    Returns (the first layer's input hidden state, [(args after the hidden state, kwargs)] per layer,
    timings of this pass). The forward builds the cache, masks and rotary embedding exactly as it
    does for a real prefill (``use_cache=True``, ``logits_to_keep=1``); the layers it skips are run
    afterwards by :func:`run_layerwise` with the arguments recorded here.
    """
    import torch

    layers, norm, head, embed = parts(model)
    calls: list = [None] * len(layers)

    def recorder(i):
        def forward(*args, **kwargs):
            if args:
                hidden, rest = args[0], args[1:]
            else:
                hidden, rest = kwargs.pop("hidden_states"), ()
            calls[i] = (hidden, rest, kwargs)
            return hidden

        return forward

    embed_s, norm_s, head_s = [], [], []
    hooks = [*_clock(embed, embed_s), *_clock(norm, norm_s), *_clock(head, head_s)]
    for i, layer in enumerate(layers):
        layer.forward = recorder(i)
    cpu0, t0 = time.process_time(), time.perf_counter()
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    finally:
        for layer in layers:
            del layer.forward
        for h in hooks:
            h.remove()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    del out
    missing = [i for i, c in enumerate(calls) if c is None]
    if missing:
        raise Refused(f"{type(model).__name__}: its forward did not call layers {missing}: --layerwise cannot run it")
    first = calls[0][0]
    inputs = [(rest, kwargs) for _, rest, kwargs in calls]
    calls.clear()
    embed_wall = sum(w for w, _ in embed_s)
    dry = sum(w for w, _ in norm_s + head_s)
    dry_cpu = sum(c for _, c in norm_s + head_s)
    timings = {
        "pass_wall_s": wall,
        "pass_cpu_s": cpu,
        "setup_wall_s": max(0.0, wall - dry),
        "setup_cpu_s": max(0.0, cpu - dry_cpu),
        "embedding_wall_s": embed_wall,
        "mask_rotary_other_wall_s": max(0.0, wall - embed_wall - dry),
        "recording_norm_head_wall_s": dry,  # not part of the prefill: the norm and logits of the recording pass
        "recording_norm_head_cpu_s": dry_cpu,
    }
    return first, inputs, timings


def _layer_kv(cache, i):
    """Layer ``i``'s (keys, values) in the cache, or None where this cache keeps none for it."""
    layers = getattr(cache, "layers", None)
    if layers is not None and i < len(layers):
        k, v = getattr(layers[i], "keys", None), getattr(layers[i], "values", None)
    elif hasattr(cache, "key_cache") and i < len(cache.key_cache):
        k, v = cache.key_cache[i], cache.value_cache[i]
    else:
        return None
    if k is None or not hasattr(k, "numel") or k.numel() == 0:
        return None
    return k, v


def _drop_layer_kv(cache, i) -> None:
    layers = getattr(cache, "layers", None)
    if layers is not None and i < len(layers) and hasattr(layers[i], "reset"):
        layers[i].reset()


def _cache_of(inputs):
    for rest, kwargs in inputs:
        for key in ("cache", "past_key_values", "past_key_value"):
            if kwargs.get(key) is not None:
                return kwargs[key]
    return None


def _median_layer_s(layers: list) -> float:
    return statistics.median(r["wall_s"] for r in layers) if layers else 0.0


def run_layerwise(
    model,
    ids,
    folder,
    meta: dict,
    *,
    max_seconds: float | None = None,
    started: float | None = None,
    stop_after: int | None = None,
    command: list | None = None,
    log=None,
) -> dict:
    """Run (or resume) the layerwise prefill of ``ids`` into ``folder``; returns the record.

    ``max_seconds``: stop between layers once the next layer (its expected time: the median of the
    finished ones) would end past ``started + max_seconds`` (``started`` defaults to now); every
    session runs at least one layer. ``stop_after``: stop after this many layers in this session
    (a test hook). The record says ``complete`` once the final norm and logits are written.
    """
    import torch

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    folder = Path(folder)
    started = time.perf_counter() if started is None else started
    check_folder(folder, meta)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        record = check_folder(folder, meta)  # again under the lock: another run may have written it
        for stale in folder.glob(".*.tmp-*"):  # a killed session's half-written file
            stale.unlink()
        if record is None:
            record = {
                "format": FORMAT,
                "meta": meta,
                "command": command,
                "layers": [],
                "sessions": [],
                "complete": False,
            }
        if record.get("complete"):
            log(f"{folder}: complete ({len(record['layers'])} layers); nothing to run")
            return record
        layers, norm, head, _ = parts(model)
        n_layers = len(layers)
        record["n_layers"] = n_layers
        record["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        done = len(record["layers"])
        session = {
            "started": _now(),
            "pid": os.getpid(),
            "command": command,
            "first_layer": done,
            "loadavg_start": list(os.getloadavg()),
        }
        record["sessions"].append(session)
        with torch.no_grad():
            reset_step_peak()
            first, inputs, timings = record_layer_inputs(model, ids)
            timings["peak_rss_gib"] = step_peak_gib()
            session["setup"] = timings
            cache = _cache_of(inputs)
            if done:
                hidden = _load_tensors(folder / _hidden_name(done - 1))["hidden"]
                del first
                log(f"resuming after layer {done}/{n_layers} ({folder / _hidden_name(done - 1)})")
            else:
                hidden = first
                del first
            ran = 0
            stop = None
            for i in range(done, n_layers):
                if ran and stop_after is not None and ran >= stop_after:
                    stop = f"stop_after {stop_after}"
                    break
                expected = _median_layer_s(record["layers"])
                if ran and max_seconds is not None and time.perf_counter() - started + expected > max_seconds:
                    stop = f"max-seconds {max_seconds:g}"
                    break
                rest, kwargs = inputs[i]
                reset_step_peak()
                cpu0, t0 = time.process_time(), time.perf_counter()
                out = layers[i](hidden, *rest, **kwargs)
                hidden = out[0] if isinstance(out, tuple) else out
                del out
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                peak = step_peak_gib()
                load = list(os.getloadavg())
                inputs[i] = None  # this layer's arguments are not needed again
                t1 = time.perf_counter()
                kv = _layer_kv(cache, i)
                if kv is not None:
                    _save_tensors(folder / _kv_name(i), {"keys": kv[0], "values": kv[1]}, {"layer": i})
                    del kv
                    _drop_layer_kv(cache, i)
                _save_tensors(folder / _hidden_name(i), {"hidden": hidden}, {"after_layer": i})
                row = {
                    "layer": i,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "loadavg": load,
                    "peak_rss_gib": peak,
                    "rss_high_water_gib": rss_gib(),
                    "session": len(record["sessions"]) - 1,
                }
                record["layers"].append(row)
                row["write_s"] = time.perf_counter() - t1
                _write_json(folder / RECORD, record)
                if i:
                    (folder / _hidden_name(i - 1)).unlink(missing_ok=True)
                ran += 1
                log(
                    f"  layer {i + 1}/{n_layers}: {wall:.2f} s wall, {cpu:.2f} s CPU, peak {peak or 0:.2f} GiB, "
                    f"load {load[0]:.2f} (written in {row['write_s']:.2f} s)"
                )
            if stop is None and len(record["layers"]) == n_layers:
                reset_step_peak()
                cpu0, t0 = time.process_time(), time.perf_counter()
                normed = norm(hidden)
                logits = head(normed[:, -1:, :])  # logits_to_keep=1: the slice the model's forward takes
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                record["final"] = {
                    "norm_logits_wall_s": wall,
                    "norm_logits_cpu_s": cpu,
                    "peak_rss_gib": step_peak_gib(),
                    "loadavg": list(os.getloadavg()),
                }
                _save_tensors(folder / FINAL, {"hidden": normed, "logits": logits}, {"layers": n_layers})
                record["complete"] = True
                stop = "complete"
                del normed, logits
            del hidden, inputs, cache
        session.update(
            stopped=stop or "?",
            layers_run=ran,
            ended=_now(),
            wall_s=time.perf_counter() - started,
            rss_high_water_gib=rss_gib(),
        )
        if record.get("complete"):
            record["summary"] = summarize(record)
        _write_json(folder / RECORD, record)
        if record.get("complete") and n_layers:
            (folder / _hidden_name(n_layers - 1)).unlink(missing_ok=True)
    return record


def summarize(record: dict) -> dict:
    """The measured prefill of a complete record: setup (first session) + every layer + norm and logits."""
    setup = record["sessions"][0]["setup"]
    layers = record["layers"]
    final = record["final"]
    layers_s = sum(r["wall_s"] for r in layers)
    layers_cpu = sum(r["cpu_s"] for r in layers)
    peaks = [r["peak_rss_gib"] for r in layers if r.get("peak_rss_gib") is not None]
    peaks += [s["setup"].get("peak_rss_gib") for s in record["sessions"] if s.get("setup", {}).get("peak_rss_gib")]
    if final.get("peak_rss_gib") is not None:
        peaks.append(final["peak_rss_gib"])
    setup_s = setup["embedding_wall_s"] + setup["mask_rotary_other_wall_s"]
    loads = [r["loadavg"][0] for r in layers]
    return {
        "embedding_s": setup["embedding_wall_s"],
        "mask_rotary_other_s": setup["mask_rotary_other_wall_s"],
        "layers_s": layers_s,
        "norm_logits_s": final["norm_logits_wall_s"],
        "total_s": setup_s + layers_s + final["norm_logits_wall_s"],
        "layers_cpu_s": layers_cpu,
        "total_cpu_s": setup["setup_cpu_s"] + layers_cpu + final["norm_logits_cpu_s"],
        "slowest_layer_s": max(r["wall_s"] for r in layers),
        "fastest_layer_s": min(r["wall_s"] for r in layers),
        "peak_rss_gib": max(peaks) if peaks else None,
        "loadavg_1min_range": [min(loads), max(loads)],
        "sessions": len(record["sessions"]),
    }


def report(record: dict) -> str:
    """Lines for a person: the measured total and each part, or how far a stopped run got."""
    meta = record["meta"]
    head = f"{meta['model']} prefill, {meta['length']:,} tokens, {meta['dtype']}, {meta['threads']} threads"
    n = record.get("n_layers") or "?"
    if not record.get("complete"):
        s = record["sessions"][-1] if record["sessions"] else {}
        return (
            f"{head}: {len(record['layers'])}/{n} layers done (stopped: {s.get('stopped', '?')}); "
            "rerun the same command to resume"
        )
    s = record.get("summary") or summarize(record)
    return (
        f"{head}: measured {s['total_s']:.2f} s = embedding {s['embedding_s']:.3f} s + mask/rotary/other "
        f"{s['mask_rotary_other_s']:.3f} s + {n} layers {s['layers_s']:.2f} s "
        f"({s['fastest_layer_s']:.2f}-{s['slowest_layer_s']:.2f} s each) + norm and last logits "
        f"{s['norm_logits_s']:.3f} s; CPU {s['total_cpu_s']:.2f} s; peak RSS "
        f"{'n/a' if s['peak_rss_gib'] is None else format(s['peak_rss_gib'], '.2f')} GiB (own steps); "
        f"load average (1 min) {s['loadavg_1min_range'][0]:.2f}-{s['loadavg_1min_range'][1]:.2f}; "
        f"{s['sessions']} session(s)"
    )


def verify(model, ids, folder) -> dict:
    """One full forward on the same ids, timed; whether its logits and every layer's K/V equal the folder's bitwise."""
    import torch

    folder = Path(folder)
    final = _load_tensors(folder / FINAL)
    reset_step_peak()
    cpu0, t0 = time.process_time(), time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    peak = step_peak_gib()
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    logits_equal = torch.equal(out.logits, final["logits"])
    kv_equal, kv_layers = True, 0
    for i in range(len(parts(model)[0])):
        path = folder / _kv_name(i)
        kv = _layer_kv(cache, i)
        if kv is None or not path.is_file():
            continue
        saved = _load_tensors(path)
        kv_layers += 1
        kv_equal &= torch.equal(kv[0], saved["keys"]) and torch.equal(kv[1], saved["values"])
    return {
        "forward_wall_s": wall,
        "forward_cpu_s": cpu,
        "forward_peak_rss_gib": peak,
        "loadavg": list(os.getloadavg()),
        "logits_equal": bool(logits_equal),
        "kv_layers_compared": kv_layers,
        "kv_equal": bool(kv_equal),
    }
