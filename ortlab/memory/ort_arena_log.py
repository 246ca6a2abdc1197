"""ORT 1.19.2's own arena, read from its log: what ORT itself did, for ortlab.memory's mirrors to be checked
against (BFCArena.lines() words its messages as these readers find them).

    ort_first_run_log(model, feeds)   ORT's log lines of the first run of a fresh CPU session (verbose)
    arena_requests(lines) / arena_growth(lines)   what ORT's arena was asked for when it grew, and by how much
    arena_lines(lines)                ORT's arena messages (Extending / Extended allocation / Total / Reserving)
    unresolved_indices(lines)         the ML indices of "[Static memory planning] Could not resolve shape"
    log_message(line)                 a log line without its timestamp and severity prefix
    ort_block(model, feeds, order)    the memory-pattern block ORT asks its CPU arena for on the first run

ORT: onnxruntime/core/framework/bfc_arena.cc (the Extending / Extended lines), session_state.cc (static
memory planning).
"""
import re

from ortlab.capture import captured_lines

EXTENDING = re.compile(r"Extending BFCArena for Cpu\. bin_num:\d+ \(requested\) num_bytes: (\d+)")
ARENA_LINE = re.compile(r"(Extending BFCArena for Cpu.*|Extended allocation by.*|Total allocated bytes.*|"
                        r"Reserving memory.*)$")
GROWTH = re.compile(r"Extended allocation by (\d+) bytes")
UNRESOLVED = re.compile(r"\[Static memory planning\] Could not resolve shape for tensor with ML index (\d+)")


def ort_first_run_log(model, feeds, order="default", enable_mem_reuse=True, enable_mem_pattern=True):
    """The lines ORT 1.19.2 logs (verbose) during the first run of a fresh CPU session, graph
    optimizations off, one intra-op thread (a thread pool's threads would log their start, at any
    moment, into whatever runs next). The arena's lines come from ORT's default logger, written by C++
    to file descriptor 2, so they are captured there (ortlab.capture)."""
    from ortlab import session  # heavy: onnxruntime (ortlab.session imports it)
    from ortlab.env import quiet_import  # heavy: torch (ortlab.env imports it)

    ort = quiet_import("onnxruntime")
    ort.set_default_logger_severity(0)
    try:
        so = session.session_options("disable", order, enable_mem_pattern=enable_mem_pattern,
                                     enable_mem_reuse=enable_mem_reuse, intra_op_num_threads=1)
        so.log_severity_level = 0
        with captured_lines(fds=(2,), python=False):
            sess = session.create(model, so, ["CPUExecutionProvider"])
        with captured_lines(fds=(2,), python=False) as run:
            sess.run(None, feeds)
    finally:
        ort.set_default_logger_severity(2)
    return run


def arena_requests(lines):
    """The `num_bytes` of every "Extending BFCArena for Cpu ... (requested) num_bytes: N" line."""
    return [int(m.group(1)) for line in lines if (m := EXTENDING.search(line))]


def arena_growth(lines):
    """The byte counts of every "Extended allocation by N bytes." line (each growth of ORT's arena)."""
    return [int(m.group(1)) for line in lines if (m := GROWTH.search(line))]


def arena_lines(lines):
    """ORT's arena messages (Extending / Extended allocation / Total allocated / Reserving), worded as
    BFCArena.lines() words them."""
    return [m.group(1) for line in lines if (m := ARENA_LINE.search(line))]


def unresolved_indices(lines):
    """The ML indices of ORT's "[Static memory planning] Could not resolve shape" lines."""
    return [int(m.group(1)) for line in lines if (m := UNRESOLVED.search(line))]


def log_message(line):
    """An ORT log line without its timestamp and severity prefix (from the source file on)."""
    found = re.search(r"\S+\.cc:\d+ .*$", line)
    return found.group(0) if found else line


def ort_block(model, feeds, order="default"):
    """The memory-pattern block ORT 1.19.2 asks its CPU arena for on the model's first run (the first
    "Extending BFCArena ... (requested) num_bytes" line, as tests/memory/test_memory.py reads it), or None when
    the block fits in the arena's first region and nothing is logged."""
    requests = arena_requests(ort_first_run_log(model, feeds, order))
    return requests[0] if requests else None
