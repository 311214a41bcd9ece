"""A running llama.cpp context (through ``llama-cpp-python``) that takes kvbridge's caches.

:class:`LlamaCppSession` opens a GGUF in llama.cpp on the CPU and exposes what the engine
path needs: prefill token ids, load a sequence state (a file or bytes: kvbridge's
:func:`kvbridge.engines.llamacpp.export_state` or llama.cpp's own), save it, and continue
greedily with the next-token logits. The binding is imported only here, when a session
opens; a missing binding is a one-line error naming the pinned version.

The context runs one sequence (id 0) in one KV stream, with flash attention off unless
asked (``v_trans`` then follows: llama.cpp refuses a state whose V layout differs), and the
default F16 cache.

llama.cpp's CPU backend (as the pinned binding builds it) runs its threads on OpenMP, and
every operation of a decode step ends at an OpenMP barrier: with the runtime's default wait
policy the waiting thread spins, and when anything else runs on the machine the partner it waits
for may not hold a core. A 1.5B Q4_K_M decode at 2 threads on a 2-core machine beside one other
job took 0.8-1.0 tokens/s spinning against 5.4-5.7 with ``OMP_WAIT_POLICY=PASSIVE``; the policy
changes only how threads wait, not the work or its split (the same tokens and logits;
BENCHMARKS.md "HumanEval through llama.cpp"). The policy is read once, when the process loads
its OpenMP runtime, and llama.cpp shares torch's (``libgomp.so.1``): :func:`binding` sets it
when neither is loaded yet (:func:`kvbridge.threads.passive_omp_wait`); a program that imports
torch first calls that before it (``kvbridge harness`` and ``bench/bench_humaneval_pair.py`` do).
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from kvbridge.errors import ConfigError, StateError

#: the binding version the state format was verified on (Makefile / constraints-test.txt pin it)
PINNED = "0.3.36"


def binding():
    """The ``llama_cpp`` module, or a one-line error saying how to install the pinned one.

    On first import, OpenMP's waiting threads are made to sleep (``OMP_WAIT_POLICY=PASSIVE``)
    unless the user set a policy or torch already loaded the OpenMP runtime (see the module's notes)."""
    if "llama_cpp" not in sys.modules:
        from kvbridge.threads import passive_omp_wait

        passive_omp_wait()  # unless torch (its OpenMP runtime, shared) is loaded or a policy is set
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(
            f"llama.cpp's Python binding is not installed ({exc})",
            f"pip install llama-cpp-python=={PINNED} (make install builds it, CPU only)",
        ) from None
    return llama_cpp


def binding_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - not installed
        return None


class LlamaCppSession:
    """One llama.cpp context on a GGUF: prefill, load/save sequence states, greedy steps."""

    def __init__(
        self,
        gguf_file: str | os.PathLike,
        *,
        n_ctx: int = 1024,
        n_batch: int = 512,
        flash_attn: bool = False,
        n_threads: int | None = None,
    ):
        self.lib = llama_cpp = binding()
        self.path = str(gguf_file)
        if not Path(self.path).is_file():
            raise ConfigError(f"{self.path}: no such GGUF file", "pass the .gguf file llama.cpp should run")
        self.flash_attn = bool(flash_attn)
        # half the cores (at most 4): on a small shared machine all cores at once run several times
        # slower than one (each operation ends at a barrier that waits for every thread; see above)
        threads = n_threads or max(1, min((os.cpu_count() or 2) // 2, 4))
        self.llm = llama_cpp.Llama(
            model_path=self.path,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_ubatch=n_batch,
            flash_attn=self.flash_attn,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=False,
            verbose=False,
            seed=0,
        )
        self.ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()
        self.n_ctx = n_ctx

    # -- what the context expects of a state -------------------------------------------------------
    @property
    def v_trans(self) -> bool:
        """llama.cpp stores V transposed when flash attention is off."""
        return not self.flash_attn

    @property
    def n_tokens(self) -> int:
        return int(self.llm.n_tokens)

    def tokens(self) -> list[int]:
        return [int(t) for t in self.llm.input_ids[: self.llm.n_tokens]]

    # -- running -------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the KV cache."""
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        self.llm.n_tokens = 0

    def _last_logits(self):
        import numpy as np

        ptr = self.lib.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).astype(np.float32).copy()

    def eval(self, ids: Sequence[int]):
        """Decode ``ids`` after what the cache holds; the next-token logits (numpy float32)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ConfigError("nothing to decode", "pass at least one token id")
        if self.n_tokens + len(ids) > self.n_ctx:
            raise ConfigError(
                f"{self.n_tokens + len(ids)} tokens exceed the llama.cpp context of {self.n_ctx}",
                "open the session with a larger n_ctx",
            )
        self.llm.eval(ids)
        return self._last_logits()

    def prefill(self, ids: Sequence[int]):
        """A fresh cache of ``ids``; the logits after the last one."""
        self.reset()
        return self.eval(ids)

    def greedy(self, first_logits, n: int) -> tuple[list[int], list]:
        """``n`` greedy tokens continuing from ``first_logits``; (tokens, logits of each step)."""
        import numpy as np

        out, logits = [], [first_logits]
        for step in range(n):
            out.append(int(np.argmax(logits[-1])))
            if step + 1 < n:
                logits.append(self.eval([out[-1]]))
        return out, logits

    # -- sequence states -----------------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        """The sequence-state *file* bytes of the cache (llama.cpp's own save, with its tokens)."""
        with tempfile.TemporaryDirectory(prefix="kvbridge-llamacpp-") as tmp:
            path = Path(tmp) / "seq.state"
            self.save_state(path)
            return path.read_bytes()

    def save_state(self, path: str | os.PathLike) -> int:
        toks = self.tokens()
        arr = (self.lib.llama_token * max(1, len(toks)))(*toks)
        n = self.lib.llama_state_seq_save_file(self.ctx, str(path).encode(), 0, arr, len(toks))
        if not n:
            raise StateError(f"llama.cpp could not save the sequence state to {path}", "check the path")
        return int(n)

    def load_state(self, src: Any) -> int:
        """Load a sequence-state file (a path, or its bytes) as sequence 0; returns the token count.

        llama.cpp itself checks magic, version, layer count, K/V types, row sizes and ``v_trans``;
        a refusal is one line (llama.cpp's own reason is in its log)."""
        if isinstance(src, (bytes, bytearray, memoryview)):
            with tempfile.TemporaryDirectory(prefix="kvbridge-llamacpp-") as tmp:
                path = Path(tmp) / "seq.state"
                path.write_bytes(bytes(src))
                return self.load_state(path)
        self.reset()
        cap = self.n_ctx
        toks = (self.lib.llama_token * cap)()
        n_out = ctypes.c_size_t(0)
        read = self.lib.llama_state_seq_load_file(self.ctx, str(src).encode(), 0, toks, cap, ctypes.byref(n_out))
        if not read:
            self.reset()
            raise StateError(
                f"{src}: llama.cpp refused the sequence state for {Path(self.path).name} (a different "
                "model, version, cache type or V layout)",
                "export the state for this GGUF and context (kvbridge pack export --engine llamacpp)",
            )
        n = int(n_out.value)
        self.llm.input_ids[:n] = [int(t) for t in toks[:n]]
        self.llm.n_tokens = n
        return n

    def close(self) -> None:
        self.llm.close()

    def __enter__(self) -> "LlamaCppSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
