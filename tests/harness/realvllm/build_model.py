"""Build a tiny Qwen3-VL model folder that a real vLLM serves on CPU, with nothing downloaded.

Runs inside the vLLM test environment (torch, transformers, tokenizers, dashscope), not the
project's. The tokenizer is Qwen's real BPE (dashscope ships its ranks as qwen.tiktoken), so token
counts are realistic; the weights are seeded random, with the output rows of the option letters
scaled up so the model really answers letters (the removal path is exercised on a real server).
The folder is laid out as a hub snapshot (`models--Org--Name/snapshots/<revision>`), so vLLM's
/v1/models root shows the pinned revision the worker checks.

Usage: python build_model.py OUT_DIR MODEL_ID@REVISION [MODEL_ID@REVISION ...]
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]  # ids from 151643, as in Qwen2/3
FIRST_SPECIAL = 151643
VOCAB = 151936
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHAT_TEMPLATE = """{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{%- if message['content'] is string -%}{{- message['content'] -}}
{%- else -%}{%- for part in message['content'] -%}
{%- if part['type'] == 'text' -%}{{- part['text'] -}}
{%- elif part['type'] in ['image', 'image_url'] -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif part['type'] in ['video', 'video_url'] -%}{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
{%- endif -%}{%- endfor -%}{%- endif -%}
{%- if not (loop.last and message['role'] == 'assistant' and not add_generation_prompt) -%}
{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte maps to a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def tokenizer_json(out: Path) -> None:
    import dashscope
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    path = Path(dashscope.__file__).parent / "resources" / "qwen.tiktoken"
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    enc = _bytes_to_unicode()

    def s(b: bytes) -> str:
        return "".join(enc[x] for x in b)

    # tiktoken merges by the rank of the merged token: every split of a token into two tokens is a
    # merge at that token's rank (ties: the parts' ranks), and a word that is one token is taken whole
    merges = sorted(
        (rank, ranks[tok[:i]], ranks[tok[i:]], s(tok[:i]), s(tok[i:]))
        for tok, rank in ranks.items()
        for i in range(1, len(tok))
        if tok[:i] in ranks and tok[i:] in ranks
    )
    bpe = models.BPE(
        vocab={s(t): r for t, r in ranks.items()},
        merges=[(m[3], m[4]) for m in merges],
        fuse_unk=False,
        ignore_merges=True,
    )
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    assert tk.get_vocab_size() == FIRST_SPECIAL, tk.get_vocab_size()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tk.save(str(out / "tokenizer.json"))
    added = {
        str(FIRST_SPECIAL + i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL)
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2TokenizerFast",
                "add_bos_token": False,
                "add_prefix_space": False,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": None,
                "errors": "replace",
                "clean_up_tokenization_spaces": False,
                "split_special_tokens": False,
                "model_max_length": 16384,
                "added_tokens_decoder": added,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )


def configs(out: Path) -> dict:
    text = {
        "model_type": "qwen3_vl_text",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": 16384,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        # transformers 4's keys: 5 reads them into its rope_parameters, so both vLLM environments load one folder
        "rope_theta": 5000000.0,
        "rope_scaling": {"rope_type": "default", "mrope_section": [12, 10, 10], "mrope_interleaved": True},
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "tie_word_embeddings": False,
    }
    vision = {
        "model_type": "qwen3_vl_vision",
        "depth": 2,
        "hidden_size": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 128,
        "num_heads": 1,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 128,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [0],
    }
    cfg = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": vision,
        "image_token_id": 151655,
        "video_token_id": 151656,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    pix = {
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "resample": 3,
        "processor_class": "Qwen3VLProcessor",
    }
    image = {
        **pix,
        "size": {"shortest_edge": 65536, "longest_edge": 200704},
        "min_pixels": 65536,
        "max_pixels": 200704,
        "image_processor_type": "Qwen2VLImageProcessor",
    }
    video = {**pix, "video_processor_type": "Qwen3VLVideoProcessor"}
    files = {
        "config.json": cfg,
        "preprocessor_config.json": image,
        "video_preprocessor_config.json": video,
        "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
        "generation_config.json": {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643},
    }
    for name, body in files.items():
        (out / name).write_text(json.dumps(body, indent=1))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return cfg


def weights(out: Path, seed: int = 7, letter_scale: float = 30.0) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_pretrained(out)).to(torch.float32)
    tk = Tokenizer.from_file(str(out / "tokenizer.json"))
    letters = [tk.token_to_id(x) for c in "ABCDEFGHIJ" for x in (c, "Ġ" + c)]  # the letters items use most
    with torch.no_grad():
        model.lm_head.weight[letters] *= letter_scale
    model.save_pretrained(out, safe_serialization=True)


def main() -> None:
    out = Path(sys.argv[1])
    base = out / "_base"
    if not (base / "model.safetensors").exists():
        base.mkdir(parents=True, exist_ok=True)
        tokenizer_json(base)
        configs(base)
        weights(base)
        configs(base)  # save_pretrained rewrote config.json; keep ours
    for spec in sys.argv[2:]:
        model_id, rev = spec.split("@")
        snap = out / ("models--" + model_id.replace("/", "--")) / "snapshots" / rev
        snap.mkdir(parents=True, exist_ok=True)
        for f in base.iterdir():
            if not (snap / f.name).exists():
                (snap / f.name).symlink_to(f.resolve())
        print(snap)


if __name__ == "__main__":
    main()
