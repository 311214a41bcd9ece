"""``KVBridgeConnector``: vLLM continues from kvbridge's stored prefixes (a vLLM ``KVConnectorBase_V1``).

Configure it with ``KVTransferConfig(kv_connector="KVBridgeConnector",
kv_connector_module_path="kvbridge_vllm.connector", kv_role="kv_both",
kv_connector_extra_config={"kvbridge_store": DIR})``. Optional extra keys:
``kvbridge_save`` (a folder: every prompt vLLM prefills in one step is saved there as a store
entry, provenance ``vllm-prefill``; under tensor parallelism each rank writes its KV heads as a
hidden part and the rank that writes the last part joins them into the entry), ``kvbridge_events`` (a JSONL
file of what was matched, loaded, refused and saved: the connector's counters).

Scheduler side: for a new request, the longest store entry whose token ids are a prefix of the
prompt is matched; **all** its tokens are loaded (a partial last block included; never the
prompt's last token, which vLLM computes), less what vLLM's own prefix cache already holds. An
entry is only used when its model identity (config fingerprint, weight files' sha256), geometry,
RoPE table and dtype are the served model's: otherwise one log line names the entry and the
reason, and vLLM prefills. Worker side: the entry's rows (only this rank's KV heads) go into the
paged cache through the attention backend's own ``do_kv_cache_update``, so vLLM owns the layout.
A worker-side read failure reports the blocks as load errors: vLLM recomputes them.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from kvbridge_vllm import store

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = init_logger("vllm.kvbridge")

_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass
class LoadSpec:
    req_id: str
    path: str
    start: int  # first token to write (what vLLM's own prefix cache holds is skipped)
    stop: int
    slots: list  # one slot per token start..stop-1
    block_ids: list


@dataclass
class SaveSpec:
    req_id: str
    token_ids: list
    slots: list
    identity: dict


@dataclass
class KVBridgeMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


def _slots(block_ids: list, start: int, stop: int, block_size: int) -> list:
    return [block_ids[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def layer_index(name: str) -> int:
    m = _LAYER_INDEX.search(name)
    if m is None:
        raise ValueError(f"no layer index in {name!r}")
    return int(m.group(1))


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


class KVBridgeConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._store = extra.get("kvbridge_store")
        self._save_dir = extra.get("kvbridge_save")
        self._events = extra.get("kvbridge_events")
        self._block_size = vllm_config.cache_config.block_size
        mc = vllm_config.model_config
        self._model_path = mc.model
        self._dtype = _dtype_name(mc.dtype)
        self._cache_dtype = vllm_config.cache_config.cache_dtype
        self._tp = vllm_config.parallel_config.tensor_parallel_size
        self._total_kv_heads = mc.get_total_num_kv_heads()
        # scheduler side
        self._identity: store.ModelIdentity | None = None
        self._identity_error: str | None = None
        self._entries: dict = {}
        self._pending: dict = {}  # req_id -> (entry, start, stop) from get_num_new_matched_tokens
        self._to_load: dict = {}  # req_id -> LoadSpec after allocation
        self._logged: set = set()
        # worker side
        self._layers: dict = {}
        self._layout: dict = {}
        self._load_errors: set = set()
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler()

    # -- events (the counters) ---------------------------------------------------------------------
    def _event(self, kind: str, **data) -> None:
        if not self._events:
            return
        line = json.dumps({"event": kind, "role": self.role.name.lower(), "time": time.time(), **data})
        with open(self._events, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    # -- scheduler side ----------------------------------------------------------------------------
    def _init_scheduler(self) -> None:
        if not self._store:
            self._identity_error = "no kvbridge_store folder in kv_connector_extra_config"
        elif self._cache_dtype not in ("auto", None, self._dtype):
            self._identity_error = f"vLLM's cache dtype is {self._cache_dtype}; stored prefixes are {self._dtype}"
        else:
            try:
                self._identity = store.model_identity(self._model_path)
            except Exception as exc:  # noqa: BLE001 - kvbridge's one-line errors and anything else
                self._identity_error = f"cannot identify the served model {self._model_path}: {exc}"
        if self._identity_error:
            logger.warning("kvbridge: connector inactive, vLLM prefills every request: %s", self._identity_error)
            self._event("inactive", reason=self._identity_error)
        else:
            logger.info("kvbridge: prefix store %s for %s (%s)", self._store, self._identity.name, self._dtype)

    def _rescan(self) -> list:
        self._entries = store.scan(self._store, self._entries)
        return [v for _, v in self._entries.values()]

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        self._pending.pop(request.request_id, None)
        if self._identity is None:
            return 0, False
        prompt = list(request.prompt_token_ids or [])
        found = self._rescan()
        usable, refused = [], []
        for e in found:
            if isinstance(e, store.EntryError):
                refused.append((None, str(e)))
                continue
            why = store.mismatch(e, self._identity, self._dtype)
            if why is None:
                usable.append(e)
            else:
                refused.append((e, f"{e.path}: {why}"))
        entry, n, closest, k = store.best_match(prompt, usable)
        if entry is None:
            self._log_refusal(request, prompt, refused, closest, k)
            return 0, False
        if n <= num_computed_tokens:
            self._event(
                "match", request=request.request_id, entry=entry.name, tokens=n, load=0, local=num_computed_tokens
            )
            return 0, False
        self._pending[request.request_id] = (entry, num_computed_tokens, n)
        return n - num_computed_tokens, False

    def _log_refusal(self, request, prompt, refused, closest, k) -> None:
        """One line per request that loads nothing while the store holds entries: the entry of its
        tokens that was refused and why, or that none matches (naming unreadable files)."""
        rid = request.request_id
        for e, why in refused:
            if e is not None and store.common_prefix(prompt, e.token_ids) == e.num_tokens:
                logger.warning("kvbridge: request %s: stored prefix not loaded, vLLM prefills: %s", rid, why)
                self._event("refused", request=rid, reason=why)
                return
        unreadable = [why for e, why in refused if e is None]
        if closest is None and not unreadable:
            return
        why = "no stored prefix matches its first tokens"
        if closest is not None and k > 0:
            why += f" (closest {closest.name}: {k} of {closest.num_tokens})"
        if unreadable:
            more = f" (+{len(unreadable) - 1} more)" if len(unreadable) > 1 else ""
            why += f"; unreadable entry {unreadable[0]}{more}"
        # a prompt outside the store is ordinary traffic (info); an unreadable store file is not
        (logger.warning if unreadable else logger.info)("kvbridge: request %s: %s; vLLM prefills", rid, why)
        self._event("refused", request=rid, reason=why)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        pending = self._pending.pop(request.request_id, None)
        if pending is None or num_external_tokens <= 0:
            return
        entry, start, n = pending
        stop = start + num_external_tokens
        if stop != n:
            logger.warning(
                "kvbridge: request %s: vLLM took %d of %d stored tokens", request.request_id, stop - start, n - start
            )
        block_ids = list(blocks.get_block_ids()[0])
        self._to_load[request.request_id] = LoadSpec(
            req_id=request.request_id,
            path=entry.path,
            start=start,
            stop=stop,
            slots=_slots(block_ids, start, stop, self._block_size),
            block_ids=block_ids[start // self._block_size : (stop - 1) // self._block_size + 1],
        )
        self._event(
            "match",
            request=request.request_id,
            entry=entry.name,
            tokens=n,
            load=stop - start,
            local=start,
            approximate=entry.approximate,
        )

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KVBridgeMetadata(loads=list(self._to_load.values()))
        self._to_load.clear()
        if self._save_dir and self._identity is not None:
            for req in scheduler_output.scheduled_new_reqs:
                prompt = list(req.prompt_token_ids or [])
                done = req.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(req.req_id, 0)
                if not prompt or done < len(prompt):
                    continue  # chunked prefill: not saved
                meta.saves.append(
                    SaveSpec(
                        req_id=req.req_id,
                        token_ids=prompt,
                        slots=_slots(list(req.block_ids[0]), 0, len(prompt), self._block_size),
                        identity=self._identity.to_dict(),
                    )
                )
        return meta

    # -- worker side -------------------------------------------------------------------------------
    def _rank(self) -> int:
        if self._tp == 1:
            return 0
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()

    def _attention_layers(self, forward_context: "ForwardContext") -> dict:
        out = {}
        for name, layer in forward_context.no_compile_layers.items():
            kv = getattr(layer, "kv_cache", None)
            if (
                isinstance(kv, torch.Tensor)
                and kv.numel()
                and hasattr(getattr(layer, "impl", None), "do_kv_cache_update")
            ):
                out[name] = layer
        return out

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        layers = self._attention_layers(forward_context)
        if layers:
            self._layers = layers
        meta = self._get_connector_metadata()
        if not isinstance(meta, KVBridgeMetadata) or not meta.loads:
            return
        heads = store.rank_heads(self._total_kv_heads, self._tp, self._rank())
        for spec in meta.loads:
            t0 = time.perf_counter()
            try:
                self._load_one(spec, heads)
            except Exception as exc:  # noqa: BLE001 - never a silently wrong cache: vLLM recomputes
                logger.warning(
                    "kvbridge: request %s: loading %s failed (%s: %s); vLLM recomputes those blocks",
                    spec.req_id,
                    spec.path,
                    type(exc).__name__,
                    exc,
                )
                self._load_errors.update(spec.block_ids)
                self._event("load_failed", request=spec.req_id, reason=f"{type(exc).__name__}: {exc}")
                continue
            secs = time.perf_counter() - t0
            self._event(
                "loaded",
                request=spec.req_id,
                entry=os.path.basename(spec.path),
                tokens=spec.stop - spec.start,
                start=spec.start,
                layers=len(self._layers),
                heads=heads,
                seconds=secs,
            )

    def _load_one(self, spec: LoadSpec, heads: list) -> None:
        entry = store.read_entry_header(spec.path)
        kv = store.read_kv(entry, start=spec.start, stop=spec.stop, heads=heads)  # [L, 2, h, T, D]
        slots = torch.tensor(spec.slots, dtype=torch.long)
        for name, layer in self._layers.items():
            i = layer_index(name)
            cache = layer.kv_cache
            k = kv[i, 0].transpose(0, 1).to(cache.dtype if cache.dtype.is_floating_point else kv.dtype).contiguous()
            v = kv[i, 1].transpose(0, 1).to(k.dtype).contiguous()
            if k.shape[1] != getattr(layer, "num_kv_heads", k.shape[1]):
                raise ValueError(f"{k.shape[1]} KV heads for layer {name}, which caches {layer.num_kv_heads}")
            layer.impl.do_kv_cache_update(layer, k.to(slots.device), v, cache, slots.to(cache.device))

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # saving reads every layer's pages once the step is done (wait_for_save)

    def _layout_of(self, layer) -> torch.Tensor:
        from kvbridge_vllm.pages import learn_layout

        cache = layer.kv_cache
        key = (tuple(cache.shape[1:]), cache.dtype, layer.num_kv_heads, layer.head_size)
        if key not in self._layout:

            def write(k, v, scratch, slots):
                layer.impl.do_kv_cache_update(layer, k, v, scratch, slots)

            self._layout[key] = learn_layout(
                write, tuple(cache.shape[1:]), cache.dtype, self._block_size, layer.num_kv_heads, layer.head_size
            )
        return self._layout[key]

    def wait_for_save(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if not isinstance(meta, KVBridgeMetadata) or not meta.saves or not self._save_dir:
            return
        from kvbridge_vllm.pages import read_slots

        ordered = sorted(self._layers.items(), key=lambda kv: layer_index(kv[0]))
        identity = None
        for spec in meta.saves:
            try:
                slots = torch.tensor(spec.slots, dtype=torch.long)
                rows = []
                for _, layer in ordered:
                    k, v = read_slots(layer.kv_cache, self._layout_of(layer), slots, self._block_size)
                    rows.append(torch.stack((k.transpose(0, 1), v.transpose(0, 1))))  # [2, H, T, D]
                kv = torch.stack(rows)
                identity = identity or store.ModelIdentity(**spec.identity)
                if self._tp == 1:
                    data = store.entry_bytes(kv, spec.token_ids, identity, approximate=False, provenance="vllm-prefill")
                    path = store.write_entry(data, self._save_dir, spec.token_ids, identity)
                else:  # each rank holds its KV heads: a part each, joined by the rank that writes the last one
                    rank = self._rank()
                    heads = store.rank_heads(self._total_kv_heads, self._tp, rank)
                    store.write_part(kv, heads, spec.token_ids, identity, self._save_dir, rank=rank, tp=self._tp)
                    self._event("saved-part", request=spec.req_id, rank=rank, heads=heads, tokens=len(spec.token_ids))
                    path = store.join_parts(
                        self._save_dir,
                        spec.token_ids,
                        identity,
                        tp=self._tp,
                        approximate=False,
                        provenance="vllm-prefill",
                    )
                    if path is None:
                        continue
                self._event("saved", request=spec.req_id, entry=path.name, tokens=len(spec.token_ids))
            except Exception as exc:  # noqa: BLE001 - saving never fails the request
                logger.warning(
                    "kvbridge: request %s: saving its prefill failed (%s: %s)", spec.req_id, type(exc).__name__, exc
                )

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out


__all__ = ["KVBridgeConnector", "KVBridgeMetadata", "LoadSpec", "SaveSpec", "layer_index"]
