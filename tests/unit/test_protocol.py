import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool_queue.errors import ProtocolError
from pool_queue.protocol import LN2, Forward, Protocol, StepSpec

P = Protocol()


def top(**letters: float) -> list[tuple[str, float]]:
    return [(" " + k, v) for k, v in letters.items()] + [(" The", -8.0)]


def test_request_body_is_protocol_v1():
    b = P.request_body(2, "Q?", ["x", "y"], ["data:image/jpeg;base64,AAA"])
    assert b["continue_final_message"] is True and b["add_generation_prompt"] is False
    assert b["max_tokens"] == 1 and b["temperature"] == 0 and b["logprobs"] is True and b["top_logprobs"] == 20
    user, asst = b["messages"]
    assert asst == {"role": "assistant", "content": "Answer:"}
    assert user["content"][0] == {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAA"}}
    text = user["content"][-1]["text"]
    assert text.startswith("Q?\nA. x\nB. y\n") and "letter" in text
    assert b["model"] == "Qwen/Qwen3-VL-8B-Instruct"
    assert P.request_body(3, "Q", ["a", "b"])["model"] == "Qwen/Qwen3-VL-2B-Instruct"


def test_cyclic_orders_hand_computed():
    assert P.orders(1, "i", 5) == [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [2, 3, 4, 0, 1], [3, 4, 0, 1, 2]]
    assert P.orders(1, "i", 2) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert P.orders(1, "i", 3) == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert P.orders(2, "i", 4) == [[0, 1, 2, 3]]


@given(n=st.integers(2, 26), gold=st.integers(0, 25))
def test_orders_put_gold_at_min_n_4_letters(n, gold):
    gold %= n
    positions = [order.index(gold) for order in P.orders(1, "x", n)]
    assert len(set(positions)) == min(n, 4)
    assert max(positions.count(p) for p in set(positions)) - min(positions.count(p) for p in set(positions)) <= 1


@given(n=st.integers(2, 26), gold=st.integers(0, 25), noise=st.floats(-3, 0))
def test_always_A_never_removed_in_step1(n, gold, noise):
    gold %= n
    fws = []
    for order in P.orders(1, "x", n):
        t = [(" A", -0.01)] + [(" " + chr(66 + i), -5.0 + noise) for i in range(min(n - 1, 18))]
        fws.append(P.judge_forward(t, n, order.index(gold)))
    assert not P.removed(1, fws)


def test_spelling_merge_is_logsumexp_and_case_sensitive():
    f = P.judge_forward(
        [(" A", math.log(0.3)), ("A", math.log(0.2)), ("a", math.log(0.4)), (" B", math.log(0.1))], 2, 0
    )
    assert f.logprobs[0] == pytest.approx(math.log(0.5))
    assert f.logprobs[1] == pytest.approx(math.log(0.1))
    assert f.pred == 0 and f.margin == pytest.approx(math.log(5)) and f.hit


def test_floor_and_floored_gold_never_removes():
    f = P.judge_forward(top(A=-0.1, B=-3.0), 3, 2)  # C absent -> floor = -8 (smallest in list)
    assert f.floored == [False, False, True] and f.logprobs[2] == -8.0 and not f.hit
    # every letter absent: all tie at the floor, pred is the earliest letter, gold floored
    g = P.judge_forward([(" The", -0.5), (" I", -2.0)], 2, 0)
    assert g.pred == 0 and g.floored == [True, True] and not g.hit
    assert not P.removed(2, [g])


def test_ties_pick_earliest_letter():
    assert P.judge_forward(top(A=-1.0, B=-1.0), 2, 1).pred == 0


def test_step1_rule_boundaries():
    def fw(hit: bool, margin: float) -> Forward:
        return Forward(logprobs=[0, 0], floored=[False, False], pred=0 if hit else 1, gold=0, margin=margin, hit=hit)

    assert not P.removed(1, [fw(True, 1.0)] * 3 + [fw(False, -0.5)])  # 3/4 but mean 0.625 <= ln2
    assert P.removed(1, [fw(True, 1.2)] * 3 + [fw(False, -0.5)])  # 3/4, mean 0.775
    assert not P.removed(1, [fw(True, 5.0)] * 2 + [fw(False, -0.1)] * 2)  # only 2/4
    assert not P.removed(1, [fw(True, LN2)] * 4)  # mean must exceed ln 2 strictly
    assert P.removed(2, [fw(True, LN2 + 1e-9)])
    assert not P.removed(2, [fw(False, 3.0)])
    with pytest.raises(ValueError):
        P.removed(1, [fw(True, 1.0)])


def test_frame_indices():
    assert P.frame_indices(1, 10) == []
    assert P.frame_indices(2, 10) == [4] and P.frame_indices(2, 1) == [0] and P.frame_indices(2, 9) == [4]
    assert P.frame_indices(3, 20) == list(range(20))
    idx = P.frame_indices(3, 64)
    assert len(idx) == 32 and idx[0] == 0 and idx[-1] == 63 and idx[1] == round(63 / 31)
    assert P.frame_indices(3, 32) == list(range(32))
    assert P.frame_indices(3, 0) == []


@given(n=st.integers(32, 2000))
def test_uniform_indices_distinct_sorted_in_range(n):
    idx = P.frame_indices(3, n)
    assert len(idx) == 32 == len(set(idx)) and idx == sorted(idx) and idx[0] == 0 and idx[-1] == n - 1


def test_fingerprint_changes_with_rules_not_served_name():
    base = Protocol().fingerprint
    assert Protocol(instruction="Reply with a letter.").fingerprint != base
    assert Protocol(permutation="seeded", seeds=(1, 2, 3, 4)).fingerprint != base
    steps = dict(Protocol().steps)
    steps[1] = steps[1].model_copy(update={"served_name": "qwen8b"})
    assert Protocol(steps=steps).fingerprint == base
    steps[1] = steps[1].model_copy(update={"revision": "x"})
    assert Protocol(steps=steps).fingerprint != base


def test_protocol_file_roundtrip(tmp_path):
    p = Protocol(permutation="seeded", seeds=(7, 8, 9, 10), instruction="Letter only.")
    f = tmp_path / "proto.json"
    f.write_text(p.model_dump_json())
    q = Protocol.load(f)
    assert q.fingerprint == p.fingerprint
    orders = q.orders(1, "item-1", 6)
    assert all(sorted(o) == list(range(6)) for o in orders) and orders == q.orders(1, "item-1", 6)
    with pytest.raises(ValueError):
        Protocol(permutation="seeded", seeds=(1,))


def test_every_rule_field_changes_the_fingerprint():
    """Every field but served_name (the server's name for the model, not a rule) is in the fingerprint."""
    base = Protocol()
    changed = {
        "name": "v2",
        "question_template": "{question}\n\n{options}\n{instruction}",
        "option_template": "({letter}) {text}",
        "instruction": "Letter only.",
        "assistant_prefill": "The answer is",
        "permutation": "seeded",
        "cyclic_shifts": (0, 2, 1, 3),
        "seeds": (1, 2, 3, 4),
        "image_long_side": 336,
        "jpeg_quality": 90,
        "top_logprobs": 10,
        "margin_threshold": 0.5,
    }
    assert set(changed) | {"steps"} == set(Protocol.model_fields)
    for key, value in changed.items():
        extra = {"permutation": "seeded"} if key == "seeds" else {}
        extra |= {"seeds": (1, 2, 3, 4)} if key == "permutation" else {}
        assert Protocol(**{key: value, **extra}).fingerprint != base.fingerprint, key
    spec_changes = {"model": "other/model", "revision": "r2", "frames": "uniform", "n_frames": 8, "n_orders": 2,
                    "min_hits": 2}  # fmt: skip
    assert set(spec_changes) | {"served_name"} == set(StepSpec.model_fields)
    for key, value in spec_changes.items():
        steps = dict(base.steps)
        steps[2] = steps[2].model_copy(update={key: value})
        assert Protocol(steps=steps).fingerprint != base.fingerprint, key


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"instrucion": "x"}', "instrucion: unknown key"),
        ('{"steps": {"1": {"model": "m", "revision": "r", "served_name": "m", "frames": "none", "n_order": 4}}}',
         "steps.1.n_order: unknown key"),
        ('{"permutation": "random"}', "permutation: Input should be"),
        ("{not json", "(file)"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_a_broken_protocol_file_is_one_line_naming_the_key(tmp_path, text, says):
    f = tmp_path / "proto.json"
    f.write_text(text)
    with pytest.raises(ProtocolError) as e:
        Protocol.load(f)
    assert says in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ProtocolError, match="No such file"):
        Protocol.load(tmp_path / "missing.json")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "pool-status"), "--root", str(tmp_path), "--protocol-file", str(f)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out.stderr
