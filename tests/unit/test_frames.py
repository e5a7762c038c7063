import io
import json
import os
import shutil
import time

import pytest
from PIL import Image

from pool_queue.errors import ShardError
from pool_queue.inputs.frames import (
    FrameEncoder,
    FrameError,
    find_frames,
    frame_videos,
    list_frames,
    natural_key,
    prepare_jpeg,
    video_folder,
)
from pool_queue.inputs.shards import extract, verify


def save(path, size, fmt="JPEG", mode="RGB"):
    Image.new(mode, size, 128).save(path, format=fmt)
    return path


def test_natural_order_and_filtering(tmp_path):
    d = tmp_path / "v"
    d.mkdir()
    for name in ["frame_10.jpg", "frame_2.jpg", "frame_1.PNG", "notes.txt", "frame_3.webp"]:
        (d / name).write_bytes(b"x")
    (d / "sub.jpg").mkdir()
    assert [p.name for p in list_frames(d)] == ["frame_1.PNG", "frame_2.jpg", "frame_3.webp", "frame_10.jpg"]
    assert natural_key("a2") < natural_key("a10")


def test_one_folder_rule_never_escapes_and_always_says_why(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "v1").mkdir()
    (tmp_path / "outside").mkdir()
    (cache / "link-in").symlink_to(cache / "v1")
    (cache / "link-out").symlink_to(tmp_path / "outside")
    (cache / ".hidden").mkdir()
    (cache / "file").write_bytes(b"x")
    assert video_folder(cache, "v1") == (cache / "v1", "")
    assert video_folder(cache, "link-in")[0] == cache / "link-in"
    cases = {
        "k:yt1": "not downloaded", "missing": "no frame folder", "link-out": "outside the frame cache",
        ".hidden": "hidden", "file": "no frame folder", "x" * 300: "unreadable",
        "..": "unsafe", "../x": "unsafe", "/etc": "unsafe", "a/b": "unsafe", "a\\b": "unsafe", "a\x00": "unsafe",
        "x..y": "unsafe", "": "unsafe",
    }  # fmt: skip
    for vid, why in cases.items():
        folder, reason = video_folder(cache, vid)
        assert folder is None and why in reason, (vid, reason)
    # the planner's scan applies exactly the same rule
    assert sorted(frame_videos(cache).to_pylist()) == ["link-in", "v1"]


def test_frames_listing_skips_hidden_links_out_and_sorts_any_name(tmp_path):
    cache = tmp_path / "cache"
    d = cache / "v"
    d.mkdir(parents=True)
    for name in ["frame_2.jpg", "frame_10.jpg", "._frame_1.jpg", ".frame_0.jpg", "\u00b21.jpg", "frame_\u0661.jpg"]:
        (d / name).write_bytes(b"x")
    (tmp_path / "secret.jpg").write_bytes(b"x")
    (d / "frame_3.jpg").symlink_to(tmp_path / "secret.jpg")  # a link leading out of the cache
    names = [p.name for p in list_frames(d, cache)]
    assert names == ["frame_2.jpg", "frame_10.jpg", "frame_\u0661.jpg", "\u00b21.jpg"]
    assert natural_key("\u00b21") != natural_key("1") and natural_key("a2") < natural_key("a10")
    (cache / "empty").mkdir()
    with pytest.raises(FrameError, match="no usable frames"):
        find_frames(cache, "empty")


@pytest.mark.parametrize(
    ("size", "fmt", "mode", "want"),
    [
        ((854, 480), "JPEG", "RGB", (448, 252)),
        ((480, 854), "PNG", "RGB", (252, 448)),
        ((640, 480), "PNG", "RGBA", (448, 336)),
        ((300, 200), "JPEG", "L", (448, 299)),
        ((448, 252), "PNG", "RGB", (448, 252)),
        ((1000, 1000), "WEBP", "RGB", (448, 448)),
    ],
)
def test_resize_to_448_long_side_rgb_jpeg(tmp_path, size, fmt, mode, want):
    src = save(tmp_path / f"f.{fmt.lower()}", size, fmt, mode)
    out = prepare_jpeg(src)
    with Image.open(io.BytesIO(out)) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.size == want


def test_conforming_jpeg_passes_byte_identical(tmp_path):
    src = save(tmp_path / "f.jpg", (448, 252))
    assert prepare_jpeg(src) == src.read_bytes()
    gray = save(tmp_path / "g.jpg", (448, 252), mode="L")
    assert prepare_jpeg(gray) != gray.read_bytes()  # grey JPEG is re-encoded as RGB


def test_corrupt_frames_are_clear_errors(tmp_path):
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(FrameError, match=r"bad\.jpg"):
        prepare_jpeg(tmp_path / "bad.jpg")
    good = save(tmp_path / "t.jpg", (448, 252)).read_bytes()
    (tmp_path / "trunc.jpg").write_bytes(good[: len(good) // 2])
    with pytest.raises(FrameError, match=r"trunc\.jpg"):
        prepare_jpeg(tmp_path / "trunc.jpg")
    big = save(tmp_path / "big.jpg", (900, 500)).read_bytes()
    (tmp_path / "tbig.jpg").write_bytes(big[:300])
    with pytest.raises(FrameError, match=r"tbig\.jpg"):
        prepare_jpeg(tmp_path / "tbig.jpg")


def test_encoder_caches_data_urls(tmp_path):
    src = save(tmp_path / "f.jpg", (448, 252))
    enc = FrameEncoder(cache_size=1)
    url = enc.data_url(src)
    assert url.startswith("data:image/jpeg;base64,") and enc.data_url(src) is url


def test_manifest_verify_and_extract(small_root, tmp_path):
    tar_dir = tmp_path / "tars"
    shutil.copytree(small_root / "frames_tar", tar_dir)
    m = verify(tar_dir, show=False)
    n = extract(tar_dir, tmp_path / "cache", show=False)
    assert n == m.n_videos == sum(1 for p in (small_root / "frames" / "pool_frames").iterdir())
    first = sorted((tmp_path / "cache").iterdir())[0]
    assert [p.name for p in list_frames(first)] == [
        p.name for p in list_frames(small_root / "frames" / "pool_frames" / first.name)
    ]
    stamp = list_frames(first)[0].stat().st_ctime_ns  # (mtime comes from the archive: ctime shows a rewrite)
    assert extract(tar_dir, tmp_path / "cache", show=False) == n  # again: every shard is recorded as done
    assert list_frames(first)[0].stat().st_ctime_ns == stamp
    shutil.rmtree(first)  # a folder lost since: the count is wrong, so everything is unpacked again
    assert extract(tar_dir, tmp_path / "cache", show=False) == n and list_frames(first)


def test_manifest_catches_one_changed_byte(small_root, tmp_path):
    tar_dir = tmp_path / "tars"
    shutil.copytree(small_root / "frames_tar", tar_dir)
    shard = tar_dir / json.loads((tar_dir / "frames_manifest.json").read_text())["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="SHA256 MISMATCH: " + shard.name):
        extract(tar_dir, tmp_path / "cache", show=False)
    assert not (tmp_path / "cache").exists()
    shard.unlink()
    with pytest.raises(ShardError, match="missing shard"):
        verify(tar_dir, show=False)


def test_bombs_and_degenerate_sizes_are_errors_naming_the_file(tmp_path):
    big = save(tmp_path / "big.png", (3000, 3000), "PNG")
    with pytest.raises(FrameError, match=r"big.png: 3000x3000 pixels, over the limit of 1,000,000"):
        prepare_jpeg(big, max_pixels=1_000_000)
    thin = save(tmp_path / "thin.png", (3000, 2), "PNG")
    with pytest.raises(FrameError, match=r"thin.png: 3000x2: aspect ratio over 200"):
        prepare_jpeg(thin)
    assert prepare_jpeg(save(tmp_path / "ok.png", (2000, 10), "PNG"))  # 200:1 is still accepted


@pytest.mark.parametrize(("mode", "value", "want"), [("I;16", 32896, 128), ("I;16", 65535, 255), ("I", 51400, 200),
                                                     ("I", 77, 77), ("F", 0.5, 128), ("LA", 90, 90)])  # fmt: skip
def test_deep_and_odd_modes_become_the_right_8_bit_grey(tmp_path, mode, value, want):
    src = tmp_path / ("deep.tiff" if mode in ("I", "F") else "deep.png")
    Image.new(mode, (64, 36), value).save(src)
    with Image.open(io.BytesIO(prepare_jpeg(src))) as im:
        px = im.getpixel((10, 10))
    assert im.mode == "RGB" and all(abs(c - want) <= 1 for c in px), (mode, px)


# ---- one rule for names (issue 26): nothing in the cache makes a listing raise


def _odd_cache(tmp_path):
    """A cache holding one good video beside names no listing may trip on."""
    cache = tmp_path / "frames"
    (cache / "good").mkdir(parents=True)
    save(cache / "good" / "frame_0.jpg", (448, 252))
    save(cache / "good" / b"frame_1\xff.jpg".decode("utf-8", "surrogateescape"), (448, 252))  # a frame not UTF-8
    (cache / b"caf\xe9".decode("utf-8", "surrogateescape")).mkdir()  # a Latin-1 folder name no item can name
    (cache / "loop").symlink_to(cache / "loop")  # a link to itself
    (cache / "a").symlink_to(cache / "b")
    (cache / "b").symlink_to(cache / "a")  # two links in a ring
    (cache / "nowhere").symlink_to(cache / "gone")  # a link that leads nowhere
    (cache / "good" / "frame_2.jpg").symlink_to(cache / "good" / "frame_2.jpg")  # a frame that loops
    return cache


def test_no_name_or_link_in_the_cache_makes_a_listing_raise(tmp_path):
    cache = _odd_cache(tmp_path)
    assert frame_videos(cache).to_pylist() == ["good"]
    for vid in ("loop", "a", "nowhere"):
        folder, why = video_folder(cache, vid)
        assert folder is None and why, vid
    assert "loop of links" in video_folder(cache, "loop")[1] or "no frame folder" in video_folder(cache, "loop")[1]
    assert [p.name.encode("utf-8", "surrogateescape") for p in find_frames(cache, "good")] == [
        b"frame_0.jpg", b"frame_1\xff.jpg"]  # fmt: skip
    with pytest.raises(FrameError, match=r"no frame folder|loop"):
        find_frames(cache, "nowhere")
    folder, why = video_folder(cache, b"caf\xe9".decode("utf-8", "surrogateescape"))
    assert folder is None and "not valid UTF-8" in why
    why.encode("utf-8")  # the reason itself is always writable


def test_a_damaged_frame_whose_name_is_not_utf8_is_named_in_a_writable_message(tmp_path):
    bad = tmp_path / b"frame_\xff.jpg".decode("utf-8", "surrogateescape")
    bad.write_bytes(b"not an image")
    with pytest.raises(FrameError) as e:
        prepare_jpeg(bad)
    assert "frame_\\xff.jpg" in str(e.value) and str(e.value).encode("utf-8")


def test_a_complete_jpeg_with_bytes_after_its_end_marker_decodes(tmp_path):
    raw = io.BytesIO()
    Image.new("RGB", (448, 252), (10, 200, 30)).save(raw, "JPEG")
    p = tmp_path / "camera.jpg"
    p.write_bytes(raw.getvalue() + b"\x00\x11trailing maker data" * 20)
    assert prepare_jpeg(p) == p.read_bytes()  # as any viewer shows it
    p.write_bytes(raw.getvalue()[: len(raw.getvalue()) // 2])
    with pytest.raises(FrameError, match="truncated"):
        prepare_jpeg(p)


@pytest.mark.parametrize(("orientation", "size"), [(1, (448, 252)), (3, (448, 252)), (6, (252, 448)), (8, (252, 448))])
def test_exif_orientation_is_applied_before_resizing(tmp_path, orientation, size):
    im = Image.new("RGB", (896, 504), (0, 0, 0))
    im.paste((255, 255, 255), (0, 0, 100, 100))  # a white corner: top-left as stored
    exif = Image.Exif()
    exif[0x0112] = orientation
    p = tmp_path / "f.jpg"
    im.save(p, "JPEG", exif=exif.tobytes())
    out = Image.open(io.BytesIO(prepare_jpeg(p)))
    assert out.size == size
    corners = {"tl": (5, 5), "tr": (size[0] - 5, 5), "br": (size[0] - 5, size[1] - 5), "bl": (5, size[1] - 5)}
    white = {k for k, xy in corners.items() if sum(out.getpixel(xy)) > 600}
    assert white == {{1: "tl", 3: "br", 6: "tr", 8: "bl"}[orientation]}, white


def test_the_folder_listing_is_kept_until_the_cache_changes(tmp_path):
    """A status refresh or a plan asks several times: the cache is listed once while its mtime stands."""
    cache = tmp_path / "pool_frames"
    (cache / "v1").mkdir(parents=True)
    os.utime(cache, (time.time() - 3600, time.time() - 3600))  # settled an hour ago
    first = frame_videos(cache)
    assert first.to_pylist() == ["v1"] and frame_videos(cache) is first  # kept
    (cache / "v2").mkdir()  # the cache's mtime moves: listed again, at once
    assert sorted(frame_videos(cache).to_pylist()) == ["v1", "v2"]
    (cache / "v2").rmdir()
    (cache / "v2").symlink_to(tmp_path)  # replaced by a link leading outside: checked, refused
    assert frame_videos(cache).to_pylist() == ["v1"]
