from collections import Counter

from services.predictor.intake import RecentIds, screen
from services.predictor.types import Completion, PredictionError


def _screen(records, recent=None, stats=None):
    return screen(records, "m", 1000, lambda model: None, recent or RecentIds(100),
                  stats if stats is not None else Counter())


def test_absurd_lengths_are_refused_counted_and_the_rest_kept():
    stats = Counter()
    recs = [Completion("m", "ok", n, f"r{i}") for i, n in enumerate([0, -3, 1001, 7, 1000])]
    recs.append(Completion("m", "ok", 3.5, "float"))
    recs.append(Completion("m", "ok", True, "bool"))
    by_model, errors = _screen(recs, stats=stats)
    assert [r.num_output_tokens for r in by_model["m"]] == [7, 1000]
    assert stats["rejected_length"] == 5 and len(errors) == 5
    assert all(e.field == "num_output_tokens" and e.code == "INVALID_ARGUMENT" for e in errors)
    assert "r0" in errors[0].message and "1..1000" in errors[0].message


def test_redelivered_completions_are_dropped_once_learnt():
    recent, stats = RecentIds(100), Counter()
    first = [Completion("m", "hi", 5, "a"), Completion("m", "hi", 5, "a"),
             Completion("m", "hi", 5, "")]
    by_model, _ = _screen(first, recent, stats)
    assert len(by_model["m"]) == 2 and stats["duplicate"] == 1  # within the batch
    assert "a" not in recent  # not yet learnt: a refused batch may be sent again
    recent.add(r.request_id for r in by_model["m"])
    by_model, _ = _screen([Completion("m", "hi", 5, "a"), Completion("m", "hi", 6, "b")],
                          recent, stats)
    assert [r.request_id for r in by_model["m"]] == ["b"] and stats["duplicate"] == 2


def test_recent_ids_are_bounded():
    recent = RecentIds(3)
    recent.add(["a", "b", "c", "d", ""])
    assert "a" not in recent and "d" in recent and "" not in recent


def test_bad_prompts_and_unknown_models_are_refused_with_their_own_reason():
    stats = Counter()
    served = lambda model: None if model == "m" else PredictionError(
        "UNKNOWN_MODEL", f"unknown model {model!r}", "model")
    recs = [Completion("m", "", 5, "empty"), Completion("m", "  \n", 5, "blank"),
            Completion("m", None, 5, "none"), Completion("other", "ok", 5, "model"),
            Completion("", "ok", 5, "default"), Completion("other", "", 0, "both")]
    by_model, errors = screen(recs, "m", 1000, served, RecentIds(10), stats)
    assert [r.request_id for r in by_model["m"]] == ["default"]  # no model: the default one
    assert stats == Counter(rejected_prompt=3, rejected_model=2)  # the model is checked first
    assert [e.code for e in errors] == ["INVALID_ARGUMENT"] * 3 + ["UNKNOWN_MODEL"] * 2


def test_a_refused_record_may_be_resent_corrected_in_the_same_batch():
    stats = Counter()
    by_model, _ = _screen([Completion("m", "ok", 0, "a"), Completion("m", "ok", 9, "a")],
                          stats=stats)
    assert [r.num_output_tokens for r in by_model["m"]] == [9]
    assert stats == Counter(rejected_length=1)


def test_completions_are_grouped_by_model_in_arrival_order():
    recs = [Completion("a", "p1", 1, "1"), Completion("b", "p2", 2, "2"),
            Completion("a", "p3", 3, "3")]
    by_model, errors = screen(recs, "m", 1000, lambda model: None, RecentIds(10), Counter())
    assert not errors
    assert {k: [r.request_id for r in v] for k, v in by_model.items()} == {
        "a": ["1", "3"], "b": ["2"]}


def test_recent_ids_forget_the_least_recently_learnt_first():
    recent = RecentIds(3)
    recent.add(["a", "b", "c"])
    recent.add(["a"])  # redelivered and learnt again: now the most recent
    recent.add(["d"])
    assert "a" in recent and "b" not in recent and "c" in recent and "d" in recent
    off = RecentIds(0)
    off.add(["a"])
    assert "a" not in off
