"""Observers of the simulated machine (docs/architecture.md, "Observers, not flags"): they
subscribe to the machine's InstrEvents and CheckpointEvents (fa_sim/events.py); the kernel program
knows nothing of them.

  TraceRecorder + TraceFilter   per-lane traces (trace.py), archives and Perfetto export
                                (trace_io.py), one lane's story (story.py, `fa trace`)
  BankCounter                   shared-memory bank conflicts by Nsight Compute's rules
                                (banks.py, bank_tables.py, `fa banks`)
  HazardChecker                 shadow memory: races across cp.async / barriers, bounds and
                                alignment (hazards.py, `format_hazards` for `fa sim --check-hazards`)

BranchRecorder (branches.py) records each warp's control flow (every bra / ret / exit and whether
all, none or some of its lanes branched): the path fa_sim.timing.walk follows through the SASS.
SectorCounter (sectors.py) counts the 32-byte sectors and 128-byte lines of every global-memory
warp request (how well they coalesce): what fa_sim.timing charges them.

lanemaps.py holds the lane maps the observers draw and tell (the PTX fragment formulas; the
kernel's maps through fa_sim/layout.py), figures.py the matplotlib figures.
"""

from .banks import BankCounter, BankReport, Counts, SmemClass
from .hazards import Hazard, HazardChecker, HazardKind, HazardReport, format_hazards
from .sectors import MemoryCounts, SectorCounter
from .story import LaneStory, format_story, lane_story, story_json
from .trace import Trace, TraceFilter, TraceRecord, TraceRecorder
from .trace_io import load_trace, save_perfetto, save_trace, to_perfetto

__all__ = [
    "BankCounter", "BankReport", "Counts", "SmemClass",
    "MemoryCounts", "SectorCounter",
    "Hazard", "HazardChecker", "HazardKind", "HazardReport", "format_hazards",
    "LaneStory", "format_story", "lane_story", "story_json",
    "Trace", "TraceFilter", "TraceRecord", "TraceRecorder",
    "load_trace", "save_perfetto", "save_trace", "to_perfetto",
]
