"""lab09's checks: right answers pass; the typical wrong ones fail with a message that names the case, the value
or the overlapping pair. The right answers here are written independently of the solution notebook's; the
notebook itself runs under nbval and is graded by tests/labs/test_labs.py."""
import pytest

from ortlab.labs import lab09
from ortlab.labs.judges import lab09 as judge09


def verdict(capsys, run):
    run()
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "Traceback" not in out, out
    return out


def good_lifetimes(nodes, shapes):
    """Walk the order backwards: the first reader met is the last one."""
    last = {}
    for pc in range(len(nodes) - 1, -1, -1):
        for name in nodes[pc].input:
            last.setdefault(name, pc)
    found = {}
    for pc, node in enumerate(nodes):
        for name in filter(None, node.output):
            size = None
            if name in shapes:
                dims, itemsize = shapes[name]
                elements = 1
                for d in dims:
                    elements *= d
                size = -(-elements * itemsize // 256) * 256
            found[name] = lab09.Lifetime(pc, last.get(name), size)
    return found


def good_better_planner(tensors):
    """Greedy by size, first fit (the TFLite Micro form)."""
    offsets = {}
    for t in sorted(tensors, key=lambda t: (-t.size, t.start)):
        taken = sorted((offsets[o.name], o.size) for o in tensors
                       if o.name in offsets and o.start <= t.end and t.start <= o.end)
        at = 0
        for offset, size in taken:
            if offset - at >= t.size:
                break
            at = max(at, offset + size)
        offsets[t.name] = at
    return offsets


def ort_best_fit(events):
    return judge09.reference_best_fit(events)


def first_fit(events):
    """Lowest gap that fits: not ORT's rule."""
    live, offsets = [], {}
    for e in events:
        if isinstance(e, lab09.Free):
            live = [b for b in live if b[2] != e.name]
            continue
        at = 0
        for offset, size, _ in sorted(live):
            if offset - at >= e.size:
                break
            at = max(at, offset + size)
        offsets[e.name] = at
        live.append((at, e.size, e.name))
    return offsets


def stub(*args):
    raise NotImplementedError("exercise is not done yet")


def test_right_answers_pass(capsys):
    assert "[PASS]" in verdict(capsys, lambda: lab09.check_lifetimes(good_lifetimes))
    assert "[PASS]" in verdict(capsys, lambda: lab09.check_best_fit(ort_best_fit))
    assert "[PASS]" in verdict(capsys, lambda: lab09.check_prediction(good_lifetimes, ort_best_fit))
    assert "[PASS]" in verdict(capsys, lambda: lab09.check_better_planner(good_better_planner))


def test_the_predicted_block_is_orts_logged_request_on_every_case():
    """Independent of ortlab's planner: lifetimes written here and ORT's best fit give, for every graded
    case, the block ORT 1.19.2's own log shows."""
    for name in lab09.SEEN + judge09.HIDDEN:
        assert judge09.predicted_block(name, good_lifetimes, ort_best_fit) == lab09.ort_block(name), name


def shifted(field, change):
    def lifetimes(nodes, shapes):
        return {n: life._replace(**{field: change(getattr(life, field))})
                for n, life in good_lifetimes(nodes, shapes).items()}
    return lifetimes


@pytest.mark.parametrize("fn, words", [
    (lambda nodes, shapes: {n: life for n, life in good_lifetimes(nodes, shapes).items()} | {"x": (0, 0, 0)},
     "not produced by any node"),
    (lambda nodes, shapes: list(good_lifetimes(nodes, shapes).items()), "return a dict"),
    (shifted("last_use", lambda v: None if v is None else v - 1), "last_use is"),
    (shifted("size", lambda v: None if v is None else v - 128), "rounded up to a multiple of 256"),
    (shifted("defined_at", lambda v: v + 1), "defined_at is"),
    (lambda nodes, shapes: dict(list(good_lifetimes(nodes, shapes).items())[1:]), "no lifetime for"),
    (lambda nodes, shapes: {n: (life.defined_at,) for n, life in good_lifetimes(nodes, shapes).items()},
     "give (defined_at, last_use, size)"),
    (lambda nodes, shapes: 1 / 0, "raised ZeroDivisionError"),
])
def test_wrong_lifetimes_name_the_value_and_the_rule(fn, words, capsys):
    out = verdict(capsys, lambda: lab09.check_lifetimes(fn))
    assert "[FAIL]" in out and words in out, out


@pytest.mark.parametrize("fn, words", [
    (first_fit, "ORT's best fit puts it at"),
    (lambda events: {e.name: 0.0 for e in events if isinstance(e, lab09.Alloc)}, "an offset is an int >= 0"),
    (lambda events: {}, "gave no offset for"),
    (lambda events: [0], "must return a dict"),
])
def test_wrong_best_fit_names_the_tensor_and_the_live_blocks(fn, words, capsys):
    out = verdict(capsys, lambda: lab09.check_best_fit(fn))
    assert "[FAIL]" in out and words in out, out


def test_a_wrong_prediction_names_a_case_the_notebook_does_not_show(capsys):
    ignores_frees = lambda events: ort_best_fit([e for e in events if isinstance(e, lab09.Alloc)])  # noqa: E731
    out = verdict(capsys, lambda: lab09.check_prediction(good_lifetimes, ignores_frees))
    assert "[FAIL]" in out and "not shown in the notebook" in out and "ORT asked its arena for" in out, out


def orts_own_offsets(tensors):
    """ORT's placement of the case these tensors come from (valid, and never better than ORT)."""
    for name in lab09.SEEN + judge09.HIDDEN:
        c = judge09.case(name)
        if lab09.pattern_tensors(c) == list(tensors):
            return {t.name: c.plan.value(t.name).offset for t in tensors}
    raise AssertionError("tensors of no known case")


@pytest.mark.parametrize("fn, words", [
    (lambda tensors: {t.name: 0 for t in tensors}, "live at the same time and overlap"),
    (lambda tensors: dict(zip([t.name for t in tensors],
                              [sum(t.size for t in tensors[:k]) for k in range(len(tensors))])),
     "above ORT's best fit"),
    (lambda tensors: orts_own_offsets(tensors), "never smaller than ORT's block"),
])
def test_wrong_planners_fail_with_the_validator_or_the_peak(fn, words, capsys):
    out = verdict(capsys, lambda: lab09.check_better_planner(fn))
    assert "[FAIL]" in out and words in out, out


def test_not_done_is_reported_as_such(capsys):
    for run in (lambda: lab09.check_lifetimes(stub), lambda: lab09.check_best_fit(stub),
                lambda: lab09.check_prediction(stub, stub), lambda: lab09.check_better_planner(stub)):
        assert "[NOT DONE]" in verdict(capsys, run)
