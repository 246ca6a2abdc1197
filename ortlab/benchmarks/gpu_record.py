"""The records `make gpu-check` writes to gpu_records/, read back for notebooks and the summary.

    latest(folder=RECORDS)   the newest record by its `date` (dry runs, runs without a GPU and unreadable
                             files ignored), or None
    summary(record)          a few lines: "measured on <GPU>, <date>", then each part's status
    table(record, part)      one part's rows as an ortlab.viz Table, labelled with the GPU and the date

With no record, `summary(None)` and `table(None, part)` say so plainly (NO_RECORD): nothing here ever
stands in for a GPU figure.
"""
import html
import json
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[2] / "gpu_records"
NO_RECORD = "no GPU record yet: run `make gpu-check` on a GPU machine"


def load(path):
    """One record (a dict) from `path`; None when it is not a gpu-check record."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("parts"), dict) or "date" not in record:
        return None
    return record


def latest(folder=RECORDS):
    """The newest record in `folder` by its `date` field (ISO UTC, so text order is time order);
    dry runs and runs that found no GPU are skipped; None when there is none."""
    folder = Path(folder)
    records = [r for r in (load(p) for p in sorted(folder.glob("*.json")))
               if r and r.get("gpu") and not r.get("dry_run")] if folder.is_dir() else []
    return max(records, key=lambda r: str(r["date"]), default=None)


def label(record):
    """'measured on <GPU> (<arch>), <date>' for a record; NO_RECORD for None."""
    if record is None:
        return NO_RECORD
    arch = f" ({record['arch']})" if record.get("arch") else ""
    dry = " [dry run: no device calls]" if record.get("dry_run") else ""
    return f"measured on {record.get('gpu') or 'an unknown GPU'}{arch}, {record['date']}{dry}"


def _status_line(name, entry):
    status = entry.get("status", "?")
    title = entry.get("title", name)
    seconds = f" ({entry['seconds']:g} s)" if isinstance(entry.get("seconds"), (int, float)) else ""
    if status == "skipped":
        return f"  {title}: skipped{seconds}: {entry.get('reason', '')}"
    if status == "failed":
        return f"  {title}: FAILED{seconds}: {entry.get('error', '')}"
    result = entry.get("result", {})
    checks = result.get("checks")
    line = f"  {title}: ok{seconds}"
    if checks:
        line += f", {checks['passed']} of {checks['total']} agree"
    for key, word in (("mismatches", "differs"), ("not run", "not run")):
        for item in result.get(key, [])[:5]:
            line += f"\n      {word}: {item}"
        if len(result.get(key, [])) > 5:
            line += f"\n      ... and {len(result[key]) - 5} more"
    return line


def summary(record):
    """A short text: the label, the driver, then one line per part (and its first mismatches)."""
    if record is None:
        return NO_RECORD
    lines = [label(record)]
    if record.get("driver") or record.get("cuda_runtime"):
        lines.append(f"  driver {record.get('driver')}, CUDA runtime {record.get('cuda_runtime')}")
    lines += [_status_line(name, entry) for name, entry in record["parts"].items()]
    return "\n".join(lines)


def rows(record, part, key="rows"):
    """The list of row dicts under `key` of one part's result ([] when the part did not run)."""
    entry = record["parts"].get(part)
    if entry is None:
        raise KeyError(f"no part {part!r} in this record; its parts are {list(record['parts'])}")
    found = entry.get("result", {}).get(key, [])
    if isinstance(found, dict):
        return [{"fact": k, "value": v} for k, v in found.items()]
    return found


class LabelledTable:
    """A Table with a caption line above it (the GPU and the date, or why there is nothing)."""

    def __init__(self, caption, table=None):
        self.caption, self.table = caption, table

    def __repr__(self):
        return self.caption if self.table is None else f"{self.caption}\n{self.table!r}"

    def _repr_html_(self):
        body = "" if self.table is None else self.table._repr_html_()
        return f"<p><i>{html.escape(self.caption)}</i></p>{body}"


def table(record, part, key="rows"):
    """One part's rows (or, for `device`, its facts) as a Table captioned 'measured on <GPU>, <date>';
    with no record, the caption alone says there is none; a part that did not run says why."""
    from ortlab.viz.tables import Table  # lazy: viz imports onnx; gpu_check prints summary() without it

    if record is None:
        return LabelledTable(NO_RECORD)
    entry = record["parts"].get(part)
    if entry is None:
        raise KeyError(f"no part {part!r} in this record; its parts are {list(record['parts'])}")
    caption = f"{entry.get('title', part)}: {label(record)}"
    if entry.get("status") != "ok":
        why = entry.get("reason") or entry.get("error") or ""
        return LabelledTable(f"{caption}; {entry.get('status')}: {why}")
    if part == "device" and key == "rows":
        facts = {k: v for k, v in entry["result"].items() if not isinstance(v, dict)}
        return LabelledTable(caption, Table.from_dicts([{"fact": k, "value": v} for k, v in facts.items()]))
    return LabelledTable(caption, Table.from_dicts(rows(record, part, key)))
