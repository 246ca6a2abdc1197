"""A failed CPU-runner launch's message, made readable: the markers cpu_checks.h writes (it knows
addresses, not names) become source lines and array names.

  @pc:0x1234@            the kernel code at that offset into the library -> "kernel.cu line 12"
  @shared:0x4100:4@      4 bytes of a static __shared__ array at that offset -> "sdata[16]"
  @past-shared:0x40c0:4@ an access just past the static __shared__ arrays -> "buf[128] is out of bounds ..."
  @warp-race@            a race between two lanes of a warp -> what it is, and what to do

The library's line table and symbols are read with binutils' addr2line and nm, only on a failure.
"""
import re
import subprocess

WARP_RACE = ("a race inside a warp on shared memory (the hazard compute-sanitizer's racecheck reports):")
WARP_RACE_ADVICE = (". Since Volta (sm_70) the threads of a warp are scheduled independently, so warp-synchronous "
                    "code (such as the volatile last-warp reduction written for older GPUs) needs __syncwarp() "
                    "between its steps, or __shfl_down_sync instead of shared memory; launch(..., "
                    "warps=\"lockstep\") runs a warp's threads in lock step, as GPUs before Volta did")
_MARKER = re.compile(r"@(pc|shared|past-shared):0x([0-9a-f]+)(?::(\d+))?@")


def _run(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, errors="replace").stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _lines(library, offsets):
    """{offset: "kernel.cu line N"} (the innermost line of the kernel's source, through inlining)."""
    found = {}
    for offset in offsets:
        out = _run(["addr2line", "-i", "-e", library, hex(offset)]).splitlines()
        lines = [m[1] for m in (re.search(r"(?:^|/)kernel\.cu:(\d+)", line) for line in out) if m]
        found[offset] = f"kernel.cu line {lines[0]}" if lines else "a line the runner cannot name"
    return found


def _symbols(library):
    """[(start, size, name)] of the library's sized symbols, and the static shared section's bounds."""
    symbols, section = [], {}
    for line in _run(["nm", "-S", "--defined-only", "-C", library]).splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 3 and parts[2] in ("__start_ortlab_shared", "__stop_ortlab_shared"):
            section[parts[2]] = int(parts[0], 16)
        if len(parts) == 4 and re.fullmatch(r"[0-9a-f]+", parts[1]):
            symbols.append((int(parts[0], 16), int(parts[1], 16), parts[3].rsplit("::", 1)[-1]))
    return symbols, (section.get("__start_ortlab_shared", 0), section.get("__stop_ortlab_shared", 0))


def _shared(symbols, offset, size):
    for start, length, name in symbols:
        if start <= offset < start + length:
            return f"{name}[{(offset - start) // size}]"
    return f"__shared__ memory at byte {offset}"


def _past_shared(symbols, section, offset, size):
    arrays = [(start, length, name) for start, length, name in symbols
              if section[0] <= start < section[1] and not name.startswith("ortlab_shared_guard")]
    if not arrays:
        return "an index past the __shared__ arrays"
    start, length, name = min(arrays, key=lambda s: min(abs(offset - s[0]), abs(offset - s[0] - s[1])))
    return (f"{name}[{(offset - start) // size}] is out of bounds for type __shared__ {name} "
            f"({length // size} elements of {size} bytes)")


def explain(message, library):
    """`message` with its markers resolved against `library` (the kernel's shared library)."""
    markers = list(_MARKER.finditer(message))
    if not markers and "@warp-race@" not in message:
        return message
    lines = _lines(library, sorted({int(m[2], 16) for m in markers if m[1] == "pc"}))
    symbols, section = _symbols(library) if any(m[1] != "pc" for m in markers) else ([], (0, 0))

    def resolve(m):
        offset = int(m[2], 16)
        if m[1] == "pc":
            return lines[offset]
        if m[1] == "shared":
            return _shared(symbols, offset, int(m[3]))
        return _past_shared(symbols, section, offset, int(m[3]))

    text = _MARKER.sub(resolve, message)
    if "@warp-race@" in text:
        text = text.replace("@warp-race@", WARP_RACE) + WARP_RACE_ADVICE
    return text
