"""The session's log, in ORT's words and format, without timestamps (so notebooks reproduce).

Mirrors include/onnxruntime/core/common/logging/logging.h: severities VERBOSE 0, INFO 1,
WARNING 2, ERROR 3, FATAL 4; a session logs what is at or above its log_severity_level
(default WARNING), to stderr, as `[I:onnxruntime:, session_state.cc:1146 Function] message`.
"""
import sys

from ortlab.engine.errors import InvalidArgument

SEVERITIES = "VIWEF"


class Logger:
    """Collects every line (`lines`, all severities) and prints those at or above `severity`."""

    def __init__(self, severity=2, stream=None):
        if severity not in range(5):
            raise InvalidArgument(f"log_severity_level must be 0 (verbose) to 4 (fatal), got {severity!r}")
        self.severity, self.stream, self.lines = severity, stream, []

    def log(self, level, where, message):
        line = f"[{SEVERITIES[level]}:ortlab:, {where}] {message}"
        self.lines.append((level, line))
        if level >= self.severity:
            print(line, file=self.stream or sys.stderr)

    def verbose(self, where, message):
        self.log(0, where, message)

    def info(self, where, message):
        self.log(1, where, message)

    def warning(self, where, message):
        self.log(2, where, message)

    def text(self, severity=0):
        """The lines at or above `severity`, one per line."""
        return "\n".join(line for level, line in self.lines if level >= severity)
