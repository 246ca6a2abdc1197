"""ortlab.profiling: read ORT's and torch's profiles the same way, and check dumped graphs.

    load_ort_profile(path)       ORT's Chrome trace -> Profile (ort_profile.py)
    load_torch_profile(path)     torch.profiler's trace -> Profile (torch_profile.py)
    profile_torch(step, steps)   run a step function under torch.profiler
    Profile.top(), .op_type_table(), .compare(other), .timeline()
    diagnose(model), diagnose_dumps(graphs), cast_targets(model)   the Performance Investigation checks
    @register_check def my_check(graph, uses) -> [Finding]          one more check in CHECKS (a Registry)
    tool_table(), run_tools(), runs_table(), print_runs()   nvprof, Nsight, perf: which ran here and why (tools.py)
"""
from ortlab.profiling.graph_doctor import (CHECKS, Diagnosis, DoctorError, Finding, cast_targets, diagnose,
                                           diagnose_dumps, register_check)
from ortlab.profiling.ort_profile import load_ort_profile, plan_table, profile_model
from ortlab.profiling.tools import TOOLS, ToolRun, print_runs, run_tools, runs_table, tool_table
from ortlab.profiling.torch_profile import load_torch_profile, profile_torch
from ortlab.profiling.trace import Event, Profile, ProfileError

__all__ = ["CHECKS", "cast_targets", "Diagnosis", "DoctorError", "Event", "Finding", "Profile", "ProfileError",
           "diagnose",
           "diagnose_dumps", "load_ort_profile", "load_torch_profile", "plan_table", "profile_model", "profile_torch",
           "print_runs", "register_check", "run_tools", "runs_table", "TOOLS", "tool_table", "ToolRun"]
