"""summary.md of tools/probe_reference_vs_ort.py: counts per class, the differing cases grouped by op with
the reason (EXPLANATIONS) and the ORT file that decides ORT's behaviour, the retries at a lower opset, and the
failures with why each backend fails (FAILURE_NOTES).
"""
from __future__ import annotations

from collections import Counter, defaultdict

from probe_cases import ATOL, ORT_MAX_OPSET, RTOL

# Why each differing op group differs, and which ORT file decides ORT's behaviour (paths in
# microsoft/onnxruntime). From the numbers in results.json and ORT's CPU kernels; a group absent
# here says "not explained". Multi-node cases are keyed by their op types joined with +.
EXPLANATIONS: dict[str, tuple[str, str]] = {
    "Cast": (
        "float->bfloat16: ORT rounds to nearest even, onnx.reference (and the stored output) "
        "truncates; float/float16->float8 *FNUZ: ORT keeps the sign of a negative value that "
        "underflows to 0, giving 0x80, which is NaN in FNUZ (reference: 0); float->string: ORT prints"
        " '%.8g' ('0.60484552'), the reference numpy's shortest repr ('0.6048455')",
        "onnxruntime/core/providers/cpu/tensor/cast_op.cc (Eigen bfloat16 cast, CastToString); "
        "include/onnxruntime/core/framework/float8.h (Float8E4M3FNUZ/Float8E5M2FNUZ(float))"),
    "CastLike": (
        "same kernel and reasons as Cast (bfloat16 rounding, '%.8g' strings)",
        "onnxruntime/core/providers/cpu/tensor/cast_op.cc"),
    "DFT": (
        "float32 rounding only: ORT computes the (non power-of-2, naive) DFT in float32, the "
        "reference in float64; errors ~6e-7 of max abs(y), flagged where the exact value is 0 (atol 1e-6)",
        "onnxruntime/core/providers/cpu/signal/dft.cc"),
    "STFT": (
        "float32 rounding only, as DFT (errors ~4e-8 of max abs(y), at exact zeros)",
        "onnxruntime/core/providers/cpu/signal/dft.cc"),
    "SoftmaxCrossEntropyLoss": (
        "float32 accumulation of 6480 weighted losses in ORT (a sequential float32 sum gives "
        "1.643338, ORT 1.643342) vs the reference's numpy sum (1.643311, = float64)",
        "onnxruntime/core/providers/cpu/loss/softmax_cross_entropy_loss.cc"),
    "QuantizeLinear": (
        "int4/uint4 outputs: same values, but onnx.reference returns a plain int8/uint8 array "
        "(np.vectorize of float32_to_4bit_unpacked), not onnx's int4/uint4 dtype; ORT is right",
        "onnxruntime/core/providers/cpu/quantization/quantize_linear.cc"),
    "Resize": (
        "align_corners with scales that do not give an integral size: ORT uses the integer output "
        "length in x*(in-1)/(out-1); the reference (and the stored output) use the unrounded in*scale",
        "onnxruntime/core/providers/cpu/tensor/upsamplebase.h (ALIGN_CORNERS lambda)"),
    "Sub+Cast+Div+Ceil+Relu+Loop": (
        "Range expanded into a Loop: the reference stacks per-iteration scan outputs with np.vstack, "
        "so scalars give [N,1] instead of [N]; ORT is right",
        "onnxruntime/core/providers/cpu/controlflow/loop.cc"),
    "Bernoulli": (
        "random sampling: ORT's generator vs numpy's RandomState; not comparable (neither matches the"
        " stored sample)",
        "onnxruntime/core/providers/cpu/generator/random.cc"),
    "RandomUniformLike+Greater+Cast": (
        "Bernoulli expanded: random sampling, not comparable",
        "onnxruntime/core/providers/cpu/generator/random.cc"),
    "Dropout": (
        "training mode: random mask; the reference and the stored outputs use numpy's "
        "RandomState(seed), ORT its own generator; not comparable",
        "onnxruntime/core/providers/cpu/nn/dropout_op.h"),
    "MaxPool": (
        "ceil_mode: ORT 1.19 takes ceil((in+pads-k)/stride)+1 and keeps a last window that starts "
        "past the input (opset-22 rule: drop it); input 2x2, kernel 1, stride 2 gives 2x2, not 1x1",
        "onnxruntime/core/providers/cpu/nn/pool_attributes.h (ComputeOutputSize)"),
    "QLinearMatMul": (
        "int8 output out of range: the reference casts rint(y) to int8 without clipping, so -236 "
        "wraps to 20 (and the stored output has 20); ORT saturates to -128 as the spec says. Seen at "
        "opset 20 (ORT has no opset-21 kernel)",
        "onnxruntime/core/providers/cpu/quantization/quantize_linear_matmul.cc (MLAS requantize)"),
    "MaxUnpool": (
        "with output_shape: ORT writes each value at its flat index in the output_shape tensor; the "
        "reference reads the index in the default (inferred) shape and keeps its coordinates",
        "onnxruntime/core/providers/cpu/nn/Unpool.cc"),
}

# Why a backend fails on a case group (shown in the failure tables).
FAILURE_NOTES: dict[str, str] = {
    "RegexFullMatch":
        "the reference needs the google-re2 package, which is not installed",
    "Scan":
        "reference Scan cannot run the opset-8 Scan (batch axis, sequence_lens) of scan_sum",
    "Scatter":
        "no reference implementation of the deprecated Scatter (opset 9-10); ORT has a kernel "
        "(scatter.cc)",
    "StringNormalizer":
        "ORT needs the en_US.UTF-8 locale, missing on this machine (environment, not ORT)",
    "Add":
        "ORT has no uint8 kernel for Add",
    "Sub":
        "ORT has no uint8 kernel for Sub",
    "Mul":
        "ORT has no uint8 kernel for Mul",
    "Div":
        "ORT has no uint8 kernel for Div",
    "Max":
        "ORT has no int8/int16/uint8/uint16 kernel for Max",
    "Min":
        "ORT has no int8/int16/uint8/uint16 Min",
    "BitShift":
        "ORT has no uint16 kernel for BitShift",
    "Less+Where":
        "ORT has no int8 kernel for Less",
    "Pow":
        "ORT has no uint32/uint64 exponent kernel for Pow",
    "Cast":
        "ORT 1.19 has no Cast to or from int4/uint4",
    "QLinearMatMul":
        "ORT 1.19 registers QLinearMatMul for opset 10 only: no kernel for the opset-21 schema; at "
        "opset 20 the float32-scale cases run, float16 scales are invalid there",
    "ImageDecoder":
        "ORT has no ImageDecoder kernel",
    "ReduceMax":
        "ORT fails, with an empty message, on a reduction over an empty axis (the spec gives -inf)",
    "ai.onnx.ml.TreeEnsemble":
        "ORT 1.19 has no ai.onnx.ml opset-5 TreeEnsemble",
    "DeformConv":
        "ORT 1.19 has no DeformConv kernel",
    "GRU":
        "ORT's CPU RNNs refuse layout=1 (deep_cpu_gru.h)",
    "LSTM":
        "ORT's CPU RNNs refuse layout=1 (lstm_base.h)",
    "RNN":
        "ORT's CPU RNNs refuse layout=1 (rnn/rnn.h)",
}



# ----------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------

def fmt_diff(rows: list[dict]) -> str:
    """Return the largest max-abs-diff of the output rows, or the kind of mismatch when not numeric."""
    notes, diffs = set(), []
    for r in rows:
        if r["close"]:
            continue
        if not r["same_type"]:
            notes.add(f"type {r['ort_type']} vs {r['ref_type']}")
        if not r["same_shape"]:
            notes.add(f"shape {r['ort_shape']} vs {r['ref_shape']}")
        if r["max_abs_diff"] is not None:
            diffs.append(r["max_abs_diff"])
    text = f"{max(diffs):.3g}" if diffs else ""
    return "; ".join([text] * bool(text) + sorted(notes))


def differ_table(rows: list[dict], title: str, key=lambda r: r) -> list[str]:
    """Return markdown lines of the differing cases grouped by op, with the reason per op."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["op"]].append(row)
    lines = [f"## {title}", "",
             "| op | cases | max abs diff / mismatch | expected output matches | reason | ORT file |",
             "|---|---|---|---|---|---|"]
    for op in sorted(groups):
        cases = groups[op]
        outs = [o for c in cases for o in key(c)["outputs"]]
        matches = Counter(key(c).get("expected_matches", "?") for c in cases)
        reason, src = (t.replace("|", "/") for t in EXPLANATIONS.get(op, ("not explained", "")))
        names = ", ".join(c["case"].replace("test_", "", 1) for c in cases)
        lines.append(f"| {op} | {len(cases)}: {names} | {fmt_diff(outs)} | "
                     f"{', '.join(f'{k} {v}' for k, v in matches.most_common())} | {reason} | {src} |")
    return lines + [""]


def error_table(rows: list[dict], title: str, field: str, key=lambda r: r) -> list[str]:
    """Return markdown lines listing failing cases grouped by op with their first error."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["op"]].append(row)
    lines = [f"## {title}", "", "| op | cases | why | error (first case) |", "|---|---|---|---|"]
    for op in sorted(groups):
        cases = groups[op]
        err = (key(cases[0]).get(field) or key(cases[0]).get("note") or "").replace("|", "/")
        names = ", ".join(c["case"].replace("test_", "", 1) for c in cases)
        lines.append(f"| {op} | {len(cases)}: {names} | {FAILURE_NOTES.get(op, '')} | {err[:200]} |")
    return lines + [""]


def write_summary(rows: list[dict], path: str, seconds: float) -> None:
    """Write summary.md: counts per class, the differ table, the retries and the failures."""
    counts = Counter(r["class"] for r in rows)
    lines = ["# onnx.reference (onnx 1.17) vs ONNX Runtime 1.19.2 CPU EP on onnx's node tests", "",
             f"{len(rows)} cases in {seconds:.0f} s; rtol {RTOL}, atol {ATOL}, equal_nan, same type and "
             "shape (integers, bools and strings exactly).", "", "| class | cases |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in counts.most_common()] + [""]
    lines += differ_table([r for r in rows if r["class"] == "differ"],
                          "differ (ORT and onnx.reference disagree)")
    retried = [r for r in rows if r.get("retry")]
    rc = Counter(r["retry"]["class"] for r in retried)
    lines += [f"## ORT failures retried at opset 21 or 20 ({len(retried)})", "",
              "Cases ORT refused for their opset (22 is newer than ORT 1.19.2's 21) or for want of a kernel "
              "for the node's version, run again in ORT with the model stamped opset 21 (else 20) when no "
              "op's attributes or inputs differ there; compared with onnx.reference on the original model. "
              "Their class above stays `ort_fails`.", "",
              ", ".join(f"{k} {v}" for k, v in rc.most_common()), ""]
    lines += differ_table([r for r in retried if r["retry"]["class"] == "differ"],
                          "differ after the retry at a lower opset", key=lambda r: r["retry"])
    lines += error_table([r for r in retried if r["retry"]["class"] not in ("agree", "differ")],
                         "still failing after the retry", "ort_error", key=lambda r: r["retry"])
    lines += error_table([r for r in rows if r["class"] == "ref_fails"],
                         "ref_fails (ORT runs, onnx.reference fails)", "ref_error")
    old_enough = [r for r in rows if r["class"] == "ort_fails" and r.get("opset", 0) <= ORT_MAX_OPSET]
    lines += error_table(old_enough, "ort_fails at opset <= 21", "ort_error")
    lines += error_table([r for r in rows if r["class"] == "both_fail"], "both_fail", "ref_error")
    for cls in ("skipped_domain", "skipped_nontensor", "slow", "timeout", "harness_error"):
        sel = [r for r in rows if r["class"] == cls]
        if sel:
            lines += [f"## {cls} ({len(sel)})", "", ", ".join(r["case"] for r in sel), ""]
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
