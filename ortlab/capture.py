"""Capturing what a block of code writes: C++ output to file descriptors 1 and 2, Python's
sys.stdout and sys.stderr, and Python logging.

Mirrors nothing in ORT: this is plumbing around it. ORT's C++ logger writes to std::cerr
(onnxruntime/core/common/logging/sinks/cerr_sink.h), i.e. straight to file descriptor 2, and
ORTModule's C++ core prints to fds 1 and 2, outside Python's sys streams, which is why a
redirect_stderr alone does not catch them. A notebook cell would otherwise show whatever ORT
said while it ran.

    with captured_lines() as lines: ...              # everything, the lines kept
    with captured_lines(fds=(2,), python=False): ...   # ORT's C++ log dropped
"""
import contextlib
import logging
import os
import sys
import tempfile
from pathlib import Path


@contextlib.contextmanager
def captured_fd(sink, fd):
    """Send file descriptor `fd` to `sink` (an open file) for a while: C++ code writes there, around
    Python's sys streams."""
    saved = os.dup(fd)
    try:
        os.dup2(sink.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


@contextlib.contextmanager
def logging_to(sink, loggers=(), fmt="%(name)s [%(levelname)s] - %(message)s"):
    """Python logging into `sink` for a while: the root logger's stream handlers, and a handler of
    our own on each logger named in `loggers` (not propagated, so whatever the root logger is set up
    to do in this process, each record is written once)."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)]
    old_streams = [h.setStream(sink) for h in handlers]
    own = logging.StreamHandler(sink)
    own.setFormatter(logging.Formatter(fmt))
    named = [logging.getLogger(name) for name in loggers]
    propagate = [logger.propagate for logger in named]
    for logger in named:
        logger.propagate = False
        logger.addHandler(own)
    try:
        yield
    finally:
        for handler, stream in zip(handlers, old_streams):
            handler.setStream(stream)
        for logger, flag in zip(named, propagate):
            logger.removeHandler(own)
            logger.propagate = flag


@contextlib.contextmanager
def captured_lines(fds=(1, 2), python=True, loggers=(), clean=str.rstrip):
    """Collect what the block writes to file descriptors `fds` and, with python=True, to sys.stdout,
    sys.stderr and Python logging (see logging_to for `loggers`).

    Yields a list that holds, once the block ends, `clean(line)` for every non-blank line.
    """
    lines = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        # O_APPEND: Python's writes and C++ writes to the fds all go to the end
        sink = stack.enter_context(open(os.open(Path(tmp) / "log", os.O_RDWR | os.O_CREAT | os.O_APPEND),
                                        "a+", buffering=1))
        stack.callback(lambda: lines.extend(clean(line) for line in _read_all(sink) if line.strip()))
        if python:
            stack.enter_context(logging_to(sink, loggers))
            stack.enter_context(contextlib.redirect_stdout(sink))
            stack.enter_context(contextlib.redirect_stderr(sink))
        for fd in fds:
            stack.enter_context(captured_fd(sink, fd))
        yield lines


def _read_all(sink):
    sink.flush()
    sink.seek(0)
    return sink.readlines()


def _has_fileno(stream):
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return False


@contextlib.contextmanager
def os_level_streams():
    """Give sys.stdout and sys.stderr real file descriptors for a while.

    ORTModule silences its C++ logs by redirecting file descriptors 1 and 2
    (_suppress_os_stream_output in onnxruntime/training/ortmodule/_logger.py), which needs
    sys.stdout.fileno(); Jupyter's streams lack one under some front ends (nbval's kernels,
    pytest's capture). Inside this block Python's own prints go to the process's stdout.
    """
    if _has_fileno(sys.stdout) and _has_fileno(sys.stderr):
        yield
        return
    saved = sys.stdout, sys.stderr
    out, err = open(os.dup(1), "w"), open(os.dup(2), "w")
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        out.close()
        err.close()
