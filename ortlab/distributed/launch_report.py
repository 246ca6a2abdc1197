"""What a launch reports: LaunchResult when every rank returns, LaunchError when one fails, and the texts
that sum up many ranks (ranks grouped by error, by phase and by identical stack).

Mirrors the reporting of torch's elastic launcher (torch/distributed/elastic/multiprocessing/errors:
ChildFailedError names the first failed rank, the others follow) and torch/multiprocessing/spawn.py's
ProcessRaisedException / ProcessExitedException.
"""
from ortlab.errors import OrtlabError

# Each rank imports torch and joins the group: about this much CPU to start (measured on a 2-core machine).
RANK_START_CPU_S = 1.3
STACKS_SHOWN = 3


class LaunchError(OrtlabError):
    """A launch failed: bad input, or a rank raised, died or ran past the time limit.

    `rank` is the rank the error is about (None for bad input), `kind` one of 'input', 'raised',
    'died', 'timeout'; `outputs` / `stderr` hold what each rank printed, `pids` the ranks' process ids,
    `stacks` (after a timeout) {rank: its Python stack} for every rank that answered, shown or not.
    """

    def __init__(self, message, rank=None, kind="input", outputs=(), stderr=(), pids=(), stacks=None):
        super().__init__(message)
        self.rank = rank
        self.kind = kind
        self.outputs = list(outputs)
        self.stderr = list(stderr)
        self.pids = list(pids)
        self.stacks = dict(stacks or {})


class LaunchWarning(UserWarning):
    """A launch that runs but deserves a note (more ranks x threads than cores)."""


class LaunchResult(list):
    """Each rank's return value in rank order (a plain list), plus what each rank printed.

    `outputs[r]` / `stderr[r]` are rank r's stdout / stderr, `pids` the ranks' process ids,
    `backend` the process group's backend, `seconds` the launch's wall time.
    """

    def __init__(self, values, outputs, stderr, pids, backend, seconds):
        super().__init__(values)
        self.outputs = outputs
        self.stderr = stderr
        self.pids = pids
        self.backend = backend
        self.seconds = seconds

    def show(self, stderr=False):
        """Print what each rank printed, rank by rank, each line prefixed with `[rank r]`."""
        for rank, text in enumerate(self.stderr if stderr else self.outputs):
            for line in text.splitlines():
                print(f"[rank {rank}] {line}")


def rank_ranges(ranks):
    """Ranks as short text: runs of three or more as ranges, '0-97, 99'; others listed, '0, 1'."""
    ranks, parts, i = sorted(ranks), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return ", ".join(parts)


def ranks_text(ranks):
    """'rank 3' or 'ranks 0-5, 7': how messages name ranks."""
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)


def group_by(ranks, key):
    """[(value, ranks)] of the ranks grouped by key(rank), in the order each value first appears."""
    groups = {}
    for rank in ranks:
        groups.setdefault(key(rank), []).append(rank)
    return list(groups.items())


def timeout_summary(world, timeout, phases, stacks, workers):
    """The lines of a timeout error: ranks grouped by phase and by identical stack, at most STACKS_SHOWN
    stacks printed, ranks that never started summed up in one line.

    `phases` {rank: 'not started' | 'starting' | 'fn' | 'returned'} for the ranks still running, `stacks`
    {rank: trimmed stack text} (missing or '' when the rank did not answer), `workers` the cores."""
    pending = sorted(phases)
    hung = [r for r in pending if phases[r] != "returned"] or pending
    waiting = [r for r in pending if r not in hung]
    lines = [f"{ranks_text(hung)} of {world} did not finish within the time limit (timeout={timeout:g} s)"]
    unborn = [r for r in hung if phases[r] == "not started"]
    if unborn:
        whose = "its process was" if len(unborn) == 1 else "their processes were"
        lines.append(f"{ranks_text(unborn)} had not started: {whose} still being created (each imports torch, about "
                     f"{RANK_START_CPU_S:g} s of CPU: {world} ranks on {workers} cores need about "
                     f"{world * RANK_START_CPU_S / workers:.0f} s to start). Raise timeout or use fewer ranks.")
    where = {"fn": "inside fn", "starting": "starting (importing fn, joining the process group)"}
    groups = group_by([r for r in hung if r not in unborn], lambda r: (phases[r], stacks.get(r) or ""))
    for (phase, stack), ranks in groups[:STACKS_SHOWN]:
        one = len(ranks) == 1
        lines.append(f"{ranks_text(ranks)} {'was' if one else 'were'} {where.get(phase, phase)}; "
                     f"{'its' if one else 'their'} Python stack ({'' if one else 'the same on each, '}"
                     f"most recent call first):")
        lines.append(stack or "    (no stack: the rank did not answer SIGUSR1)")
    rest = sorted(r for _, ranks in groups[STACKS_SHOWN:] for r in ranks)
    if rest:
        lines.append(f"{ranks_text(rest)} had other stacks, not shown: read them in the error's .stacks")
    if waiting:
        lines.append(f"{ranks_text(waiting)} had returned from fn and {'was' if len(waiting) == 1 else 'were'} "
                     f"waiting at the final barrier.")
    lines.append("All ranks were stopped.")
    return lines, hung
