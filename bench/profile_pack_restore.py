"""Profile a 16-token prefix-pack restore against its prefill on SmolLM2 (one thread).

    PYTHONPATH=src flock /tmp/kvbridge-heavy.lock python bench/profile_pack_restore.py

Prints the medians (3 warm-ups, 15 alternating runs) and a cProfile of 50 restores, sorted by
cumulative time (the per-stage breakdown in BENCHMARKS.md comes from it).
"""

import cProfile, pstats, time, tempfile, torch, transformers, statistics
from transformers import DynamicCache

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
from kvbridge.models import load
from kvbridge.prefix.packs import load_pack, save_pack

lm = load("smollm2")
model, tok = lm.model, lm.tokenizer
ids = torch.randint(100, 40000, (1, 16), generator=torch.Generator().manual_seed(0))
d = tempfile.mkdtemp()
save_pack(model, d + "/p", guide_ids=ids[0].tolist(), tokenizer=tok)


def restore():
    return load_pack(d + "/p", model, tokenizer=tok).cache(model)


def prefill():
    with torch.no_grad():
        c = DynamicCache(config=model.config)
        model(input_ids=ids, cache=c, use_cache=True, logits_to_keep=1)


for _ in range(3):
    restore()
    prefill()
tr = []
tp = []
for _ in range(15):
    t = time.perf_counter()
    restore()
    tr.append(time.perf_counter() - t)
    t = time.perf_counter()
    prefill()
    tp.append(time.perf_counter() - t)
import os

print(
    "restore ms",
    statistics.median(tr) * 1e3,
    "prefill ms",
    statistics.median(tp) * 1e3,
    "load average %.2f" % os.getloadavg()[0],
)
pr = cProfile.Profile()
pr.enable()
for _ in range(50):
    restore()
pr.disable()
pstats.Stats(pr).sort_stats("cumulative").print_stats(45)
