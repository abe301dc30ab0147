from collections import Counter

from services.predictor.intake import RecentIds, screen
from services.predictor.types import Completion


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
    by_model, errors = _screen(first, recent, stats)
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
