"""Captured `dcgmi diag -j` output, the fixture the DCGM parser's tests read and the
simulator plays to gpuops's `diag` check pods.

Where each sample came from:
- `DCGM3_R1_PASS`: DCGM 3.1.0's own "real output" sample, as NVIDIA/DCGM's JSON result
  tests keep it (the nvvs JsonResult test "JsonResult: Deserialize real output"): an
  8-GPU node, level 1, every test passing; the warning line dcgmi printed before the
  document and the `null`s between tests are DCGM's, kept (only the whitespace is
  compacted).
- `DCGM4_DIAGNOSTIC_PASS`: one test of a DCGM 4 level 3 run on an 8-GPU node, as posted
  in NVIDIA/DCGM issue #215 ("DCGM v4 diag info message count regression",
  https://github.com/NVIDIA/DCGM/issues/215), the `info` lines trimmed.
- `dcgm4_document`: that test inside the DCGM 4 document the schema in NVIDIA/DCGM
  (testing/python3/dcgm_diag_schema.json, commit 686e1024ada28a42d10df597f15247145eef6ce2)
  describes: `"DCGM Diagnostic"` > `test_categories` > tests with per-entity `results` and
  a `test_summary`, plus `entity_groups` and `metadata.version`. The other tests and the
  failing memory result are written to that schema (DCGM's test names; the warning's
  wording follows DCGM's memory plugin), not captured.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

DCGM4_VERSION = "4.3.1"

DCGM3_R1_PASS = """WARNING: THIS SHOULD NOT HAPPEN
{
"DCGM GPU Diagnostic" :
{
  "test_categories" :
  [
    {
      "category" : "Deployment",
      "tests" :
      [
        {"name" : "Denylist", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "NVML Library", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "CUDA Main Library", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "Permissions and OS-related Blocks",
         "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "Persistence Mode", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "Environmental Variables", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "Page Retirement/Row Remap", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "Graphics Processes", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]},
        null,
        {"name" : "Inforom", "results" : [{"gpu_ids" : "0,1,2,3,4,5,6,7", "status" : "PASS"}]}
      ]
    },
    {
      "category" : "Custom",
      "tests" :
      [
        {
          "name" : "software",
          "results" :
          [
            {"gpu_ids" : 0, "status" : "PASS"}, {"gpu_ids" : 1, "status" : "PASS"},
            {"gpu_ids" : 2, "status" : "PASS"}, {"gpu_ids" : 3, "status" : "PASS"},
            {"gpu_ids" : 4, "status" : "PASS"}, {"gpu_ids" : 5, "status" : "PASS"},
            {"gpu_ids" : 6, "status" : "PASS"}, {"gpu_ids" : 7, "status" : "PASS"}
          ]
        }
      ]
    }
  ],
  "version" : "3.1.0"
}
}
"""

DCGM4_DIAGNOSTIC_PASS: dict[str, Any] = {
    "name": "diagnostic",
    "results": [
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
         "info": ["Allocated space for 138 output matricies from 76077622886 bytes available.",
                  "Running with precisions: FP64 1, FP32 1, FP16 1",
                  "GPU 0 calculated at approximately 859.08 gigaflops during this test"],
         "status": "Pass"},
        *({"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": "Pass"} for gpu in range(1, 8)),
    ],
    "test_summary": {"status": "Pass"},
}

# What DCGM's memory test says of a GPU whose memory miscompares (the simulator's fault).
MEMORY_FAILURE = ("Error using CUDA API cudaMemcpy Check DCGM and system logs for errors. Reset GPU. "
                  "Restart DCGM. Rerun diagnostics. GPU 3 had 1 memory miscompares")

# The tests each level runs (DCGM 4's names), by category.
_LEVEL_TESTS: Mapping[int, tuple[tuple[str, str], ...]] = {
    1: (("Deployment", "software"),),
    2: (("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory")),
    3: (("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory"),
        ("Hardware", "diagnostic"), ("Stress", "targeted_stress"), ("Stress", "targeted_power")),
}


def dcgm4_document(*, gpus: int = 8, level: int = 3, failing: Mapping[int, str] | None = None) -> dict[str, Any]:
    """A DCGM 4 document for a node with `gpus` GPUs at `level`; `failing` maps a GPU to
    the test that fails on it (its warning: `MEMORY_FAILURE` for "memory")."""
    failing = dict(failing or {})
    categories: dict[str, list[dict[str, Any]]] = {}
    for category, test in _LEVEL_TESTS[level]:
        if test == "diagnostic" and gpus == 8 and not failing:
            categories.setdefault(category, []).append(dict(DCGM4_DIAGNOSTIC_PASS))
            continue
        results = []
        for gpu in range(gpus):
            entry: dict[str, Any] = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": "Pass"}
            if failing.get(gpu) == test:
                entry["status"] = "Fail"
                entry["warnings"] = [{"error_category": 5, "error_id": 13, "error_severity": 2,
                                      "warning": MEMORY_FAILURE if test == "memory" else f"{test} failed on GPU {gpu}"}]
            results.append(entry)
        summary = "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"
        categories.setdefault(category, []).append({"name": test, "results": results,
                                                    "test_summary": {"status": summary}})
    return {
        "DCGM Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                           "entities": [{"device_id": "2330", "entity_id": gpu} for gpu in range(gpus)]}],
        "metadata": {"version": DCGM4_VERSION, "Driver Version Detected": "580.95.05"},
    }


def dcgm4_text(**kwargs: Any) -> str:
    """`dcgm4_document` as dcgmi prints it (indented)."""
    return json.dumps(dcgm4_document(**kwargs), indent=4)


def dcgm4_compact(**kwargs: Any) -> str:
    """`dcgm4_document` in as few bytes as JSON allows (what fits a termination message)."""
    return json.dumps(dcgm4_document(**kwargs), separators=(",", ":"))
