"""Kept fit statistics: ``kvbridge fit --keep-stats DIR`` and ``kvbridge fit --from-stats DIR``.

A ridge fit's statistics (:class:`~kvbridge.fit.ridge.RidgeStatistics`: the selection scores
and the joint float64 statistics of each block of target layers) are everything a later solve
needs: another ``--top-k`` (up to the one they were accumulated for), another ``--alpha``,
another ``--low-r2`` threshold. The folder (written atomically, like every artifact):

- ``manifest.json``: ``kind`` ``kvbridge-fit-stats``, both models' identities (spec, config and
  weights fingerprints, as a mapping records them), the tokenizer fingerprint, the calibration
  record, ``max_k``, the passes, and per block its source / target layers, ``xx_block``, file
  and sha256;
- ``scores.safetensors``: the ``[T, S]`` selection scores (``mean``, ``k``, ``v``), float64;
- ``block<i>.safetensors``: one :class:`~kvbridge.fit.stats.LayerStats` each (float64), written
  as soon as its block is complete, so keeping them costs no memory beyond the fit's own.

Never pickle. Reading verifies every file's sha256 before loading it and every tensor's shape
against the block it claims to be; ``--from-stats`` with SOURCE TARGET whose specs differ from
the kept ones is refused naming the field. Blocks are loaded one at a time (a refit's memory
is one block's statistics).
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

from kvbridge.artifacts import check_kind, read_manifest as read_artifact_manifest, save_safetensors, sha256_file
from kvbridge.errors import ArtifactError
from kvbridge.fit.artifact import compared, manifest_specs
from kvbridge.version import __version__

KIND = "kvbridge-fit-stats"
SCHEMA_VERSION = 1
SCORES_FILE = "scores.safetensors"


class StatsWriter:
    """Writes the blocks into ``folder`` (a temporary folder of :func:`kvbridge.artifacts.atomic_dir`)
    as they complete; :meth:`finish` writes the scores and the manifest."""

    def __init__(self, folder: Path | str, base: dict):
        self.folder = Path(folder)
        self.base = dict(base)
        self.blocks: list[dict] = []

    def add(self, job) -> None:
        name = f"block{len(self.blocks)}.safetensors"
        digest = save_safetensors(job.state_dict(), self.folder / name)
        self.blocks.append(
            {
                "file": name,
                "sha256": digest,
                "src_layers": list(job.src_layers),
                "tgt_layers": list(job.tgt_layers),
                "xx_block": job.xx_block,
                "n_train": job.n("train"),
                "n_held": job.n("held"),
            }
        )

    def finish(self, stats) -> None:
        scores = {k: stats.scores[k].contiguous() for k in ("mean", "k", "v")}
        digest = save_safetensors(scores, self.folder / SCORES_FILE)
        manifest = {
            "kvbridge_version": __version__,
            **self.base,
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "fitter": "ridge",
            "max_k": int(stats.max_k),
            "memory_budget": int(stats.budget),
            "n_train": float(stats.n_train),
            "measured_on": stats.scores["measured_on"],
            "passes": stats.passes,
            "blocks": self.blocks,
            "tensor_file": SCORES_FILE,
            "tensor_sha256": digest,
        }
        (self.folder / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")


def _bad(folder: Path, what: str) -> ArtifactError:
    return ArtifactError(f"{folder}: {what}", "keep the statistics again with `kvbridge fit ... --keep-stats DIR`")


def _load_file(folder: Path, name: str, sha: str | None) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        raise _bad(folder, f"manifest names an invalid file {name!r}")
    path = folder / name
    if not path.is_file():
        raise _bad(folder, f"{name} is missing")
    if sha256_file(path) != sha:
        raise _bad(folder, f"{name} checksum mismatch: the file is corrupt, truncated or was replaced")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise _bad(folder, f"{name} is not a readable safetensors file ({' '.join(str(exc).split())[:100]})") from None


def read_manifest(folder: Path | str) -> dict:
    folder = Path(folder)
    manifest = read_artifact_manifest(folder, kind="fit statistics")
    fix = "pass a folder written by `kvbridge fit ... --keep-stats DIR`"
    check_kind(manifest, KIND, SCHEMA_VERSION, folder, "kvbridge fit-statistics folder", fix)
    for key in ("source", "target", "blocks", "max_k"):
        if key not in manifest:
            raise _bad(folder, f"manifest.json is missing field {key!r}")
    return manifest


def check_models(manifest: dict, folder: Path | str, *, source: dict | None = None, target: dict | None = None) -> None:
    """Refuse kept statistics for models other than ``source`` / ``target`` (identity dicts of
    :func:`kvbridge.fit.artifact.model_identity`, from configs or models), naming the field."""
    for role, name, need, have in compared(manifest, source, target, loaded_configs_only=True):
        if have != need:
            raise ArtifactError(
                f"{folder} holds statistics of a different {role} model: field {role}.{name} is "
                f"{str(need)[:12]}... there, {str(have)[:12]}... for the given {role}",
                f"pass the {role} the statistics were kept for, or fit from the models again",
            )


def load_statistics(folder: Path | str):
    """``(RidgeStatistics, manifest)`` of a kept folder; the blocks are read lazily, one at a time."""
    import torch

    from kvbridge.fit.ridge import RidgeStatistics
    from kvbridge.fit.solve import dims
    from kvbridge.fit.stats import LayerStats

    folder = Path(folder)
    manifest = read_manifest(folder)
    source_spec, target_spec = manifest_specs(
        manifest, lambda exc: _bad(folder, f"manifest.json has an invalid spec ({exc})")
    )
    ls, lt = source_spec.num_layers, target_spec.num_layers
    scores = _load_file(folder, manifest.get("tensor_file", SCORES_FILE), manifest.get("tensor_sha256"))
    for key in ("mean", "k", "v"):
        t = scores.get(key)
        if t is None or tuple(t.shape) != (lt, ls):
            raise _bad(
                folder, f"scores tensor {key!r} should be [{lt}, {ls}], got {None if t is None else tuple(t.shape)}"
            )
    scores = {k: scores[k].to(torch.float64) for k in ("mean", "k", "v")}
    scores["measured_on"] = manifest.get("measured_on", "held")
    blocks = manifest["blocks"]
    covered = sorted(t for b in blocks for t in b.get("tgt_layers", []))
    if covered != list(range(lt)):
        raise _bad(folder, f"the blocks cover target layers {covered}, not 0..{lt - 1} once each")
    d = dims(source_spec, target_spec)

    def jobs():
        for b in blocks:
            src, tgt = b.get("src_layers") or [], b.get("tgt_layers") or []
            if not all(isinstance(i, int) and 0 <= i < ls for i in src):
                raise _bad(folder, f"{b.get('file')}: source layers {src} outside 0..{ls - 1}")
            job = LayerStats(src, tgt, **d, xx_block=b.get("xx_block", "full"))
            data = _load_file(folder, b.get("file"), b.get("sha256"))
            try:
                job.load_state_dict(data)
            except (KeyError, ValueError) as exc:
                raise _bad(
                    folder, f"{b.get('file')} does not hold the statistics its manifest entry names ({exc})"
                ) from None
            yield job

    stats = RidgeStatistics(
        source_spec,
        target_spec,
        scores,
        [],
        int(manifest["max_k"]),
        list(manifest.get("passes") or []),
        int(manifest.get("memory_budget") or 0),
        float(manifest.get("n_train") or 0.0),
        job_loader=jobs,
    )
    return stats, manifest


def merge_statistics(folders: list):
    """``(RidgeStatistics, manifest)`` of several kept folders merged into one fit's statistics.

    Each folder must hold the **joint** statistics (one block over every source and target layer:
    the fit's one-pass case) of the same models and tokenizer with the same sampling (stride, skip,
    held-out share, seed, sequence length) and **different** calibration tokens (runs over disjoint
    chunks: ``--tokens-offset``); the moments are merged exactly (Chan's pairwise update, train and
    held-out apart) and the selection scores recomputed from the merged statistics. The manifest is
    the first folder's with the calibration summed (``tokens``, ``sequences``, observations) and
    ``merged_from`` listing each folder.
    """
    from kvbridge.fit.ridge import RidgeStatistics
    from kvbridge.fit.select import single_layer_r2

    folders = [Path(f) for f in folders]
    loaded = [load_statistics(f) for f in folders]
    stats0, man0 = loaded[0]
    cals = [man.get("calibration") or {} for _, man in loaded]
    cal0 = cals[0]
    seen_tokens = {}
    merged = None
    for folder, (stats, man), cal in zip(folders, loaded, cals):
        blocks = man["blocks"]
        if len(blocks) != 1 or blocks[0].get("xx_block") != "full":
            raise _bad(
                folder,
                f"holds {len(blocks)} blocked pass(es), not one joint block: only joint statistics merge across runs",
            )
        for role in ("source", "target"):
            a, b = (man0.get(role) or {}).get("spec_fingerprint"), (man.get(role) or {}).get("spec_fingerprint")
            if a != b:
                raise ArtifactError(
                    f"{folder} holds statistics of a different {role} model than {folders[0]}",
                    "merge statistics kept for the same pair only",
                )
        for key in ("stride", "skip", "heldout", "seed", "seq_len"):
            if cal.get(key) != cal0.get(key):
                raise ArtifactError(
                    f"{folder} was calibrated with {key}={cal.get(key)!r}, {folders[0]} with {cal0.get(key)!r}",
                    f"keep every chunk with the same --{key.replace('_', '-')}",
                )
        sha = cal.get("token_ids_sha256")
        if sha is not None and sha in seen_tokens:
            raise ArtifactError(
                f"{folder} and {seen_tokens[sha]} hold statistics of the same calibration tokens",
                "keep each chunk once (runs with different --tokens-offset)",
            )
        seen_tokens[sha] = folder
        job = next(stats.iter_jobs())
        if merged is None:
            merged = job
        else:
            for key, st in merged.stats.items():
                st.merge(job.stats[key])
    calib = dict(cal0)
    for key in ("tokens", "sequences", "heldout_sequences", "observations_train", "observations_heldout"):
        vals = [c.get(key) for c in cals]
        if all(isinstance(v, (int, float)) for v in vals):
            calib[key] = sum(vals)
    calib["merged_from"] = [
        {
            "folder": str(f),
            "tokens": c.get("tokens"),
            "offset": c.get("offset", 0),
            "token_ids_sha256": c.get("token_ids_sha256"),
        }
        for f, c in zip(folders, cals)
    ]
    stats = RidgeStatistics(
        stats0.source_spec,
        stats0.target_spec,
        single_layer_r2(merged),
        [merged],
        min(s.max_k for s, _ in loaded),
        [p for s, _ in loaded for p in s.passes],
        stats0.budget,
        float(merged.n("train")),
    )
    return stats, {**man0, "calibration": calib}
