"""ortlab.profiling: read ORT's and torch's profiles the same way, and check dumped graphs.

    load_ort_profile(path)       ORT's Chrome trace -> Profile (ort_profile.py)
    load_torch_profile(path)     torch.profiler's trace -> Profile (torch_profile.py)
    profile_torch(step, steps)   run a step function under torch.profiler
    Profile.top(), .op_type_table(), .compare(other), .timeline()
    diagnose(model), diagnose_dumps(graphs)   seed 004's checklist (graph_doctor.py)
"""
from ortlab.profiling.graph_doctor import (CHECKS, Diagnosis, DoctorError, Finding, diagnose, diagnose_dumps,
                                           register_check)
from ortlab.profiling.ort_profile import load_ort_profile, plan_table, profile_model
from ortlab.profiling.torch_profile import load_torch_profile, profile_torch
from ortlab.profiling.trace import Event, Profile, ProfileError

__all__ = ["CHECKS", "Diagnosis", "DoctorError", "Event", "Finding", "Profile", "ProfileError", "diagnose",
           "diagnose_dumps", "load_ort_profile", "load_torch_profile", "plan_table", "profile_model", "profile_torch",
           "register_check"]
