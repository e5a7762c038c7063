"""pool-fetch: get the item table, the frames (sha256-checked, extracted) and the pinned models.

Re-running resumes. Offline: HF_HUB_OFFLINE=1 (or --offline) uses what the hub cache already
holds; --from DIR reads a folder that holds the dataset repos' files (items/, frames_manifest.json
and frames_*.tar) and downloads nothing. The token comes from HF_TOKEN and is never printed.
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

from ..cli import fail, load_protocol, parser, reports_errors
from ..cli import settings as cli_settings
from ..hub.fetch import Hub, fetch_frames, fetch_items, fetch_models


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p = parser("pool-fetch", __doc__ or "")
    p.add_argument("--items", action="store_true", help="the item table (into <root>/items)")
    p.add_argument("--frames", action="store_true", help="the frame shards (into <root>/frames_tar), then extract")
    p.add_argument("--models", action="store_true", help="both models at their pinned revisions (hub cache)")
    p.add_argument("--from", dest="source", type=Path, help="a local folder with the datasets' files")
    p.add_argument("--offline", action="store_true", help="only what the hub cache holds (HF_HUB_OFFLINE=1)")
    args = p.parse_args(argv)
    settings = cli_settings(args)
    everything = not (args.items or args.frames or args.models)
    offline = args.offline or os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    hub = Hub(token=settings.hf_token.get_secret_value() if settings.hf_token else None, offline=offline)
    try:
        if args.items or everything:
            n = fetch_items(settings.root, hub, args.source)
            print(f"items: {n:,} valid items in {settings.items_dir}")
        if args.frames or everything:
            n = fetch_frames(settings.frames_tar_dir, settings.frames_dir, hub, args.source)
            print(f"frames: {n:,} video folders in {settings.frames_dir} (n_videos matches the manifest)")
        if args.models or everything:  # models always come through the hub cache (pre-fill it to run offline)
            for name, path in fetch_models(load_protocol(settings), hub).items():
                print(f"model {name}: {path}")
    except LocalEntryNotFoundError as e:
        fail(f"not in the local cache and the hub is not reachable or offline mode is on: {e}")
    except HfHubHTTPError as e:
        fail(f"hub refused: {e}")


if __name__ == "__main__":
    main()
