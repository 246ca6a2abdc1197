"""nbval compares a printed decimal number to within one unit of its last printed digit.

A stored output is compared as text (after tests/nbval_sanitize.cfg). A number computed in
float32 can land on either side of a rounding boundary on another CPU (AVX-512, AVX2 or no SIMD
take different code paths in ORT's MLAS and in torch), so "0.9093" may come out "0.9094" there:
the same result at the printed precision. Here, before nbval's own comparison, each decimal number
of a fresh output that is within one unit of the last digit of the stored number, with the same
count of digits, is replaced by the stored one. Integers (counts, shapes, indices) and every
other character are still compared exactly, and a number that moved by more (a chaotic run) fails.
"""
import copy
import re

TEXT_TYPES = ("text/plain", "text/html", "text/markdown")  # not images' base64
NUMBER = re.compile(r"((?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?(?![\d.])|(?<![\w.])-?\d+e[-+]?\d+(?![\d.]))")


def _digits(token):
    """(decimals of the mantissa, exponent) of a printed number."""
    mantissa, _, exponent = token.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return decimals, int(exponent or 0)


def close_in_last_digit(test, ref):
    """True when two printed numbers have the same form and differ by at most one unit in the last place."""
    if _digits(test)[0] != _digits(ref)[0] or ("e" in test) != ("e" in ref):
        return False
    decimals, exponent = _digits(ref)
    try:
        unit = 10.0 ** (exponent - decimals)
        return abs(float(test) - float(ref)) <= 1.5 * unit
    except OverflowError:  # a digit string that is no number, e.g. inside an identifier
        return False


def snap_numbers(test, ref):
    """`test` with each number that is close to its counterpart in `ref` replaced by it.

    Only when the two texts have the same structure (the same text between numbers); otherwise
    `test` is returned unchanged and nbval reports the difference as usual.
    """
    test_parts, ref_parts = NUMBER.split(test), NUMBER.split(ref)
    if len(test_parts) != len(ref_parts) or test_parts[0::2] != ref_parts[0::2]:
        return test
    for i in range(1, len(test_parts), 2):
        if close_in_last_digit(test_parts[i], ref_parts[i]):
            test_parts[i] = ref_parts[i]
    return "".join(test_parts)


def _snap_output(test, ref):
    if test.get("output_type") != ref.get("output_type") or test.get("name") != ref.get("name"):
        return test
    test = copy.deepcopy(test)
    if isinstance(test.get("text"), str) and isinstance(ref.get("text"), str):
        test["text"] = snap_numbers(test["text"], ref["text"])
    for key, value in test.get("data", {}).items():
        stored = ref.get("data", {}).get(key)
        if key in TEXT_TYPES and isinstance(value, str) and isinstance(stored, str):
            test["data"][key] = snap_numbers(value, stored)
    return test


def install():
    """Wrap nbval's IPyNbCell.compare_outputs (nbval 0.11) so that numbers are snapped first."""
    from nbval.plugin import IPyNbCell

    original = IPyNbCell.compare_outputs
    if getattr(original, "snaps_numbers", False):
        return

    def compare_outputs(self, test, ref, skip_compare=None):
        snapped = [_snap_output(t, r) for t, r in zip(test, ref)] + list(test[len(ref):])
        return original(self, snapped, ref, skip_compare)

    compare_outputs.snaps_numbers = True
    IPyNbCell.compare_outputs = compare_outputs
