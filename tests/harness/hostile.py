"""A hostile pool: ~90 kinds of messy items and frames added to a synthetic root, each with what must
happen to it. tests/e2e/test_hostile.py screens it to the end.

Expectations (`Kind.expect`): "rejected" (named in the `pool-items` report, with `reason`), "ok" (an
ok row at step 1), "ok:<step>" (an ok row at that step), "no-frames" (an ok step-1 row, never
eligible for step 2), or "error:<step>" (an error row at that step whose message holds `reason`).
A rejected kind with a `line` is reported at that 1-based file line; a kind with a `warning` has
`pool-items` print a line holding it.
Items meant to reach step 2 get questions the simulated model cannot answer blind, so they survive
step 1.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from pool_queue.demo.synth import ANSWERS, question_in_band
from pool_queue.protocol import LETTERS
from pool_queue.sim.model import believed_option

BENCH = "SynthHostile"
HARD = (0.0, 0.05)  # blind knowledge: the simulated 8B keeps these items at step 1


@dataclass(frozen=True)
class Kind:
    name: str
    item_id: str
    expect: str
    reason: str = ""
    line: int = 0
    warning: str = ""


class _Writer:
    def __init__(self, root: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cache = root / "frames" / "pool_frames"
        self.outside = root / "not-frames"  # inside the package, outside the frame cache
        self.kinds: list[Kind] = []
        self.jsonl: list[str] = []
        self.csv: list[str] = ["item_id,benchmark,video_id,question,options,answer"]

    def item(self, item_id: str, video_id: str | None = None, **over: object) -> dict[str, object]:
        q = question_in_band(self.rng, HARD)
        opts = self.rng.sample(ANSWERS, 4)
        vid = f"hv-{item_id}" if video_id is None else video_id
        base = {"item_id": item_id, "benchmark": BENCH, "video_id": vid, "question": q, "options": opts,
                "answer": LETTERS[believed_option(q, opts)]}  # fmt: skip
        return {**base, **over}

    def line(self, kind: str, expect: str, reason: str = "", raw: str | None = None, **over: object) -> None:
        item_id = str(over.pop("item_id", f"hx-{kind}"))
        self.jsonl.append(raw if raw is not None else json.dumps(self.item(item_id, **over)))  # type: ignore[arg-type]
        found = item_id.strip() if raw is None or item_id in raw else ""
        self.kinds.append(Kind(kind, found, expect, reason, line=len(self.jsonl)))

    def frames(self, kind: str, expect: str, reason: str, files: dict[str | bytes, bytes]) -> None:
        """A video folder of these files (a bytes name: a file name that is not UTF-8) and its item."""
        d = self.cache / f"hv-hx-{kind}"
        d.mkdir(parents=True)
        for name, data in files.items():
            (d / (os.fsdecode(name) if isinstance(name, bytes) else name)).write_bytes(data)
        self.line(kind, expect, reason)


def _link(link: Path, target: Path) -> None:
    """A symlink by a relative path: the root stays valid when it is moved (`synth.build_root` renames it)."""
    link.symlink_to(os.path.relpath(target, link.parent))


def _image(size: tuple[int, int], fmt: str = "JPEG", mode: str = "RGB", value: object = 120) -> bytes:
    out = io.BytesIO()
    im = Image.new(mode, size, value)  # type: ignore[arg-type]
    if mode == "P":
        im.info["transparency"] = 0
    im.save(out, format=fmt)
    return out.getvalue()


def _three(data: bytes, suffix: str) -> dict[str | bytes, bytes]:
    return {f"frame_{i}{suffix}": data for i in range(3)}


def _rotated(orientation: int) -> bytes:
    """A 448-px JPEG stored sideways, with the EXIF tag that tells viewers to turn it."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.new("RGB", (448, 252), 90).save(out, format="JPEG", exif=exif.tobytes())
    return out.getvalue()


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels: readers learn the size without decoding a byte of it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def add_hostile(root: Path, seed: int = 0) -> list[Kind]:
    """Write the hostile items and frames into a generated root; returns every kind with its expectation."""
    w = _Writer(root, seed)
    good: dict[str | bytes, bytes] = {f"frame_{i}.jpg": _image((448, 252)) for i in range(6)}
    w.outside.mkdir(parents=True)
    (w.outside / "secret.jpg").write_bytes(_image((448, 252)))
    (w.outside / "clip").mkdir()
    for n, data in good.items():
        (w.outside / "clip" / os.fsdecode(n)).write_bytes(data)

    # ---- rejected by the loader, one rejected item each, the rest of the file loads
    bad = "rejected"
    w.line("dup-a", bad, "duplicate item_id", item_id="hx-dup")
    w.line("dup-b", bad, "duplicate item_id", item_id="hx-dup")
    w.line("ws-dup-a", bad, "duplicate item_id", item_id="hx-ws-dup")
    w.line("ws-dup-b", bad, "duplicate item_id", item_id=" hx-ws-dup ")
    w.line("one-option", bad, "options", options=["only"])
    w.line("27-options", bad, "options", options=[f"o{i}" for i in range(27)])
    w.line("empty-question", bad, "empty question", question="")
    w.line("blank-question", bad, "empty question", question=" \t ")
    w.line("empty-option", bad, "empty option text", options=["a", "", "c"])
    w.line("blank-option", bad, "empty option text", options=["a", "  ", "c"])
    w.line("gold-letter-out", bad, "out of range", answer="F")
    w.line("gold-index-out", bad, "out of range", answer=9)
    w.line("gold-negative", bad, "out of range", answer=-1)
    w.line("gold-fraction", bad, "out of range", answer=1.5)
    w.line("gold-word", bad, "out of range", answer="maybe")
    w.line("gold-lowercase", bad, "out of range", answer="b")
    w.line("gold-missing", bad, "out of range", answer=None)
    w.line("gold-disagree", bad, "gold columns answer and gold disagree", answer="A", gold=2)
    unsafe = {"dotdot": "..", "up": "../etc", "abs": "/etc/passwd", "sep": "a/b", "back": "a\\b", "nul": "v\x00x",
              "lead-space": " hv", "empty": ""}  # fmt: skip
    for name, vid in unsafe.items():
        w.line(f"vid-{name}", bad, "unsafe or empty video_id", video_id=vid)
    w.line("empty-benchmark", bad, "empty benchmark", benchmark="")
    w.line("empty-id", bad, "empty item_id", item_id="")
    w.line("options-numbers", bad, "options is not a list of strings", options=[1, 2, 3])
    w.line("options-nested", bad, "options is not a list of strings", options=[["a"], ["b"]])
    w.line("options-null", bad, "options is not a list of strings", options=None)
    w.line("options-bad-json", bad, "options is not a list of strings", options="[not json")
    w.line("line-cut", bad, "line cut in the middle", raw='{"item_id": "hx-line-cut", "benchmark": ')
    w.line("line-array", bad, "not a JSON object", raw="[1, 2, 3]")
    two, pair = "2 JSON values on one line", [json.dumps(w.item(f"hx-two-on-a-line-{k}")) for k in (1, 2)]
    w.line("two-on-a-line-1", bad, two, raw=" ".join(pair), item_id="hx-two-on-a-line-1")
    w.kinds.append(Kind("two-on-a-line-2", "hx-two-on-a-line-2", bad, two, line=len(w.jsonl)))  # named too

    # ---- valid, odd: screened like any other
    w.line("unicode", "ok", question="¿Qué hace 👩‍🍳 después? مرحبا " + question_in_band(w.rng, HARD))
    w.line("braces", "ok", question="{question} %s {0} " + question_in_band(w.rng, HARD))
    w.line("letter-line-option", "ok", options=["red\nB. blue", "green", "cyan", "gray"], answer="B")
    w.line("same-option-twice", "ok", options=["cat", "dog", "cat", "bird"], answer="B")
    w.line("26-options", "ok", options=[f"choice {i}" for i in range(26)], answer="Z")
    w.line("numeric-id", "ok", item_id=917)
    w.line("float-gold", "ok", answer=1.0)
    w.line("options-json-text", "ok", options=json.dumps(["p", "q", "r"]), answer=0)
    w.line("huge-question", "error:1", "maximum context length", question="word " * 12000)
    w.csv.append('hx-csv-float-gold,SynthHostile,hv-hx-csv,Q?,"[""a"", ""b""]",2.0')
    w.kinds.append(Kind("csv-gold-2.0", "hx-csv-float-gold", "rejected", "out of range", line=2))  # 2 of 2 options
    w.csv.append('hx-csv-ok,SynthHostile,hv-hx-csv,Q?,"[""a"", ""b""]",1.0')
    w.kinds.append(Kind("csv-gold-1.0", "hx-csv-ok", "ok"))
    ints = pa.table({"item_id": pa.array([9_000_001], pa.int64()), "benchmark": [BENCH], "video_id": ["hv-int"],
                     "question": ["Which one?"], "options": pa.array([["a", "b"]], pa.large_list(pa.large_string())),
                     "gold": pa.array([1], pa.int64())})  # fmt: skip
    w.kinds.append(Kind("int-ids-large-strings-parquet", "9000001", "ok"))
    numbers = pa.table({"item_id": ["hx-parquet-numbers"], "benchmark": [BENCH], "video_id": ["hv"], "question": ["Q"],
                        "options": pa.array([[1, 2]], pa.list_(pa.int64())), "gold": [0]})  # fmt: skip
    w.kinds.append(Kind("parquet-number-options", "hx-parquet-numbers", "rejected", "options is not a list of strings"))

    # ---- frames: what the one frame rule and the image preparation do with them
    w.frames("frames-hidden-only", "error:2", "no usable frames", {".frame_0.jpg": good["frame_0.jpg"],
                                                                    "._frame_1.jpg": b"\x00\x05\x16\x07"})  # fmt: skip
    w.frames("frames-not-images", "error:2", "no usable frames", {"info.txt": b"x", "clip.gif": b"GIF89a"})
    w.frames("frames-empty-folder", "error:2", "no usable frames", {})
    w.frames("frames-bomb", "error:2", "over the limit", _three(_png_header_only(20000, 20000), ".png"))
    w.frames("frames-degenerate", "error:2", "aspect ratio over 200", _three(_image((3000, 2), "PNG"), ".png"))
    w.frames("frames-truncated", "error:2", "unreadable", _three(_image((640, 360), "PNG")[:300], ".png"))
    w.frames("frames-garbage", "error:2", "unreadable image", _three(b"garbage, not an image", ".jpg"))
    w.frames("frames-zero-bytes", "error:2", "unreadable image", _three(b"", ".png"))
    w.frames("frames-16-bit", "ok", "", _three(_image((640, 360), "PNG", "I;16", 40000), ".png"))
    w.frames("frames-cmyk", "ok", "", _three(_image((640, 360), "JPEG", "CMYK", (0, 50, 90, 10)), ".jpg"))
    w.frames("frames-palette-alpha", "ok", "", _three(_image((640, 360), "PNG", "P", 3), ".png"))
    w.frames("frames-large", "ok", "", {f"frame_{i}.jpg": _image((4000, 3000)) for i in range(2)})
    w.frames("frames-odd-names", "ok", "", {"\u00b21.jpg": good["frame_0.jpg"], "frame_\u0661.jpg": good["frame_1.jpg"],
                                            "frame 2.JPG": good["frame_2.jpg"]})  # fmt: skip
    w.frames("frames-appledouble-beside", "ok", "", {**good, "._frame_0.jpg": b"\x00\x05\x16\x07"})
    w.frames("frames-link-out-beside", "ok", "", good)
    _link(w.cache / "hv-hx-frames-link-out-beside" / "frame_7.jpg", w.outside / "secret.jpg")
    _link(w.cache / "hv-hx-folder-link-out", w.outside / "clip")
    w.line("folder-link-out", "no-frames")
    (w.cache / "hv-hx-folder-is-file").write_bytes(b"not a folder")
    w.line("folder-is-file", "no-frames")
    (w.cache / ".hv-hidden").mkdir()
    (w.cache / ".hv-hidden" / "frame_0.jpg").write_bytes(good["frame_0.jpg"])
    w.line("video-hidden", "no-frames", video_id=".hv-hidden")
    w.line("video-name-too-long", "no-frames", video_id="x" * 300)
    w.line("video-missing", "no-frames", video_id="hv-never-extracted")
    w.line("video-not-downloaded", "no-frames", video_id="k:yt-hostile")

    _names_and_exports(w, root, good)
    items = root / "items"
    (items / "hostile.jsonl").write_text("\n".join(w.jsonl) + "\n", encoding="utf-8")
    (items / "hostile.csv").write_text("\n".join(w.csv) + "\n", encoding="utf-8")
    pq.write_table(ints, items / "hostile_ints.parquet")
    pq.write_table(numbers, items / "hostile_numbers.parquet")
    return w.kinds


def _names_and_exports(w: _Writer, root: Path, good: dict[str | bytes, bytes]) -> None:
    """Names in the cache no listing may trip on, frames as cameras write them, item files as real table
    exports write them, and text as editors and other systems write it."""
    items, cache = root / "items", w.cache
    # ---- names and links in the frame cache
    _link(cache / "hv-hx-folder-loop", cache / "hv-hx-folder-loop")
    w.line("folder-link-loop", "no-frames")
    _link(cache / "hv-hx-folder-ring-a", cache / "hv-hx-folder-ring-b")
    _link(cache / "hv-hx-folder-ring-b", cache / "hv-hx-folder-ring-a")
    w.line("folder-link-ring", "no-frames", video_id="hv-hx-folder-ring-a")
    _link(cache / "hv-hx-folder-dangling", cache / "hv-never-there")
    w.line("folder-link-dangling", "no-frames")
    latin1 = cache / os.fsdecode(b"hv-caf\xe9-latin1")  # no item can name it; every listing passes it by
    latin1.mkdir()
    (latin1 / "frame_0.jpg").write_bytes(good["frame_0.jpg"])
    w.frames("frames-name-not-utf8-damaged", "error:2", "unreadable image", {b"frame_\xff0.jpg": b"damaged"})
    w.frames("frames-name-not-utf8-fine", "ok:2", "", {b"frame_\xe90.jpg": good["frame_0.jpg"], **good})
    w.frames("frames-looping-frame-beside", "ok:2", "", good)
    (cache / "hv-hx-frames-looping-frame-beside" / "frame_9.jpg").symlink_to("frame_9.jpg")
    # ---- frames as cameras write them
    w.frames("frames-trailing-bytes", "ok:2", "", _three(good["frame_0.jpg"] + b"\x00maker notes" * 40, ".jpg"))
    w.frames("frames-exif-rotated", "ok:2", "", _three(_rotated(6), ".jpg"))
    # ---- item files as real exports write them
    w.line("id-beyond-int64", "ok", raw=json.dumps(w.item("x")).replace('"x"', str(2**64 + 7), 1))
    w.kinds[-1] = Kind("id-beyond-int64", str(2**64 + 7), "ok")
    w.line("id-nfc", "ok", item_id="hx-caf\u00e9")
    w.line("id-nfd", "ok", item_id="hx-cafe\u0301")
    w.line("id-zero-width", "ok", item_id="hx-zw\u200b")
    w.line("benchmark-pipe-newline", "ok", benchmark="Odd|Bench\nName")
    (items / "hostile_only_bad_line.jsonl").write_text('{"item_id": "hx-only-bad", "benchmark": \n')
    w.kinds.append(Kind("jsonl-every-line-bad", "hx-only-bad", "rejected", "line cut in the middle"))
    (items / "HOSTILE_UPPER.JSONL").write_text(json.dumps(w.item("hx-upper-suffix")) + "\n")
    w.kinds.append(Kind("upper-case-suffix", "hx-upper-suffix", "ok"))
    rows = [w.item(f"hx-csv-newlines-{k}") for k in range(700)]
    with (items / "hostile_big.csv").open("w", encoding="utf-8") as f:  # past pyarrow's 1 MB block
        f.write("item_id,benchmark,video_id,question,options,answer\n")
        for r in rows:
            q = f"{r['question']}\n" + "context line, with a comma\n" * 60
            opts = json.dumps(r["options"]).replace('"', '""')
            f.write(f'{r["item_id"]},{r["benchmark"]},{r["video_id"]},"{q}","{opts}",{r["answer"]}\n')
        f.write(f'hx-csv-after-newlines,{BENCH},hv,Q?,"{opts}",Z\n')  # 62 lines per row above
    w.kinds.append(Kind("csv-quoted-newlines-over-1mb", "hx-csv-newlines-699", "ok"))
    w.kinds.append(Kind("csv-line-after-quoted-newlines", "hx-csv-after-newlines", "rejected", "out of range",
                        line=2 + 62 * len(rows)))  # fmt: skip
    fixed = pa.table({"item_id": ["hx-fixed-list"], "benchmark": [BENCH], "video_id": ["hv-fixed"], "question": ["Q?"],
                      "options": pa.array([["a", "b"]], pa.list_(pa.string(), 2)), "gold": [1]})  # fmt: skip
    pq.write_table(fixed, items / "hostile_fixed_list.parquet")
    w.kinds.append(Kind("parquet-fixed-size-list", "hx-fixed-list", "ok"))
    floats = pa.table({"item_id": pa.array([2.0**60, 12345.0, float("nan")]), "benchmark": [BENCH] * 3,
                       "video_id": ["hv-f"] * 3, "question": ["Q?"] * 3, "options": pa.array([["a", "b"]] * 3),
                       "gold": [0, 1, 0]})  # fmt: skip
    pq.write_table(floats, items / "hostile_float_ids.parquet")
    w.kinds.append(Kind("parquet-float-id-beyond-2^53", "1.152921504606847e+18", "rejected", "float beyond 2^53"))
    w.kinds.append(Kind("parquet-float-id-exact", "12345", "ok"))
    w.kinds.append(Kind("parquet-float-id-nan", "nan", "rejected", "or NaN, not an exact id", line=3))
    w.line("id-whole-float", "ok", raw=json.dumps(w.item("x")).replace('"x"', "4242.0", 1))  # pandas beside a NaN
    w.kinds[-1] = Kind("id-whole-float", "4242", "ok")  # the id a Parquet file of the same column gives
    part = items / "hostile_parts.parquet"
    part.mkdir()
    for k in range(2):
        t = pa.table({"item_id": [f"hx-part-{k}"], "benchmark": [BENCH], "video_id": ["hv-part"], "question": ["Q?"],
                      "options": pa.array([["a", "b"]]), "gold": [0]})  # fmt: skip
        pq.write_table(t, part / f"part-{k}.parquet")
        w.kinds.append(Kind(f"parquet-partitioned-folder-{k}", f"hx-part-{k}", "ok"))
    _text_as_written(w, items, good)


def _text_as_written(w: _Writer, items: Path, good: dict[str | bytes, bytes]) -> None:
    """Text no screen can use or find as it stands: a lone surrogate escape, questions and options with
    nothing visible, a frame folder named in NFD for an NFC video_id (a tar made on macOS: found, and
    screened) or in a mix of both forms (named by pool-items), and item files in UTF-16 and UTF-32, with
    and without a BOM."""
    raw = json.dumps(w.item("hx-lone-surrogate", question="SURROGATE")).replace('"SURROGATE"', '"a \\ud800 b"')
    w.line("question-lone-surrogate", "rejected", "lone surrogate", raw=raw, item_id="hx-lone-surrogate")
    w.line("question-zero-width", "rejected", "empty question", question="\u200b\u200c\u200d")
    w.line("question-invisible-and-space", "rejected", "empty question", question=" \u2060\t\ufeff\u00ad ")
    w.line("option-zero-width", "rejected", "empty option text", options=["a", "\u200b", "c"])
    for folder in ("hv-hx-cafe\u0301", "hv-hx-cafe\u0301-\u00e9"):  # NFD; NFC and NFD mixed
        (w.cache / folder).mkdir()
        for name, data in good.items():
            (w.cache / folder / os.fsdecode(name)).write_bytes(data)
    w.line("video-nfc-folder-nfd", "ok:2", video_id="hv-hx-caf\u00e9")  # the frames are there: screened
    w.line("video-nfc-folder-mixed-forms", "no-frames", video_id="hv-hx-caf\u00e9-\u00e9")
    twins = "'hv-hx-caf\\xe9-\\xe9' has no frame folder, but folder 'hv-hx-cafe\\u0301-\\xe9' differs"
    w.kinds[-1] = Kind("video-nfc-folder-mixed-forms", "hx-video-nfc-folder-mixed-forms", "no-frames", warning=twins)
    for enc in ("utf-16", "utf-32-be"):  # a BOM, and none
        name = enc.replace("-", "")
        lines = [json.dumps(w.item(f"hx-{name}-ok")), json.dumps(w.item(f"hx-{name}-bad", answer="Z"))]
        (items / f"hostile_{name}.jsonl").write_text("\n".join(lines) + "\n", encoding=enc)
        w.kinds.append(Kind(f"jsonl-{enc}", f"hx-{name}-ok", "ok"))
        w.kinds.append(Kind(f"jsonl-{enc}-bad-line", f"hx-{name}-bad", "rejected", "out of range", line=2))
    csv16 = (
        f'item_id,benchmark,video_id,question,options,answer\nhx-csv-utf16le,{BENCH},hv,"Q\nQ?","[""a"", ""b""]",B\n'
    )
    (items / "hostile_utf16le.csv").write_text(csv16, encoding="utf-16-le")
    w.kinds.append(Kind("csv-utf-16-le-no-bom", "hx-csv-utf16le", "ok"))
